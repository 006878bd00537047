/* The k3 table a recipe sees: k3.recipe{...}, k3.plugin(path or name, {...}), k3.none, and one
 * constructor k3.NAME{...} per plugin in the registry. A constructor returns a spec: a copy of
 * the option table, tagged (private registry table, protected metatable "k3.spec") with the
 * plugin name, the path it was loaded from and the position of the call. Options are validated
 * when the recipe is assembled (schema.c), so --set can still change them, and the messages
 * carry the position recorded here. k3.none is JSON null as a value and the built-in `none`
 * balancer when called (k3.none{}); reading an unknown k3.NAME fails with the nearest plugin
 * name (rawget(k3, "name") tests for one quietly). */
#ifndef K3RT_RECIPE_SUGAR_H
#define K3RT_RECIPE_SUGAR_H

#include <lua.h>

#include "plugin/registry.h"
#include "recipe/sandbox.h"

typedef struct sugar_ctx {
    registry *reg;
    char base_dir[1024]; /* k3.plugin resolves relative paths against the recipe's folder */
    int frozen;          /* set once the recipe has loaded: k3.plugin(path) then reaches only
                            files already loaded (on_step cannot load code mid-run) */
} sugar_ctx;

typedef struct spec_info {
    char name[64];
    char path[1024];           /* "" unless loaded by path */
    char pos[SANDBOX_POS_MAX]; /* "recipe.lua:12:" */
} spec_info;

/* Installs k3 into the sandbox environment (inside a protected call). ctx must outlive L. */
void sugar_install(lua_State *L, sugar_ctx *ctx);
/* Whether the value at idx is a spec; fills info when it is. */
int sugar_spec_info(lua_State *L, int idx, spec_info *info);
int sugar_is_none(lua_State *L, int idx);
/* Position of the k3.recipe{} call that made the table at idx, or "" when it was not. */
void sugar_recipe_pos(lua_State *L, int idx, char *buf, size_t len);

#endif
