/* Lua values to JSON and back. A recipe table becomes a raw JSON tree that mirrors it (keys
 * sorted, so the result does not depend on Lua's hash order); specs become objects of their
 * options, remembered in `specs` with their plugin name, path and position for schema.c.
 * The Lua side runs inside sandbox_run and raises Lua errors ("model.x: ..."); everything it
 * allocates hangs off the raw_doc as soon as it exists, so the caller frees it all even when
 * a conversion stops half-way. The JSON counts against the sandbox's memory cap: a string or
 * table that many keys share is one Lua object but one copy per key in JSON. */
#ifndef K3RT_RECIPE_CONVERT_H
#define K3RT_RECIPE_CONVERT_H

#include <jansson.h>
#include <lua.h>

#include "recipe/sugar.h"

typedef struct raw_spec {
    const json_t *obj; /* the spec's options in the raw tree */
    spec_info info;
} raw_spec;

typedef struct raw_doc {
    json_t *root;                 /* NULL when the converted value was nil */
    raw_spec *specs;
    int n_specs, cap_specs;
    char pos[SANDBOX_POS_MAX];    /* where k3.recipe{} was called, "" when it was not */
    int has_on_step;
    size_t bytes;                 /* what the JSON built so far holds, charged to the cap */
} raw_doc;

void raw_doc_free(raw_doc *d);
const raw_spec *raw_doc_spec(const raw_doc *d, const json_t *obj);

/* The table a recipe returned: every key but a function-valued on_step. */
void convert_recipe(lua_State *L, int idx, raw_doc *d);
/* Any value (an on_step result); `path` names it in messages. */
void convert_value(lua_State *L, int idx, raw_doc *d, const char *path);
/* Pushes a JSON value as a Lua value (objects and arrays as tables, null as nil). */
void convert_push_json(lua_State *L, const json_t *v);

#endif
