/* --set overrides: "a.b.c=value", the value a Lua expression evaluated in the recipe's own
 * sandbox (so k3.NAME{...} works), stored raw into the table the recipe returned, before the
 * recipe is validated. Keys are checked on the way down against the schema and, inside a
 * spec, against the plugin's options, so a misspelt path names the nearest valid key. */
#ifndef K3RT_RECIPE_OVERRIDES_H
#define K3RT_RECIPE_OVERRIDES_H

#include "plugin/registry.h"
#include "recipe/sandbox.h"

/* root_ref: registry reference of the recipe table. `nil` as the value removes the key. */
int overrides_apply(sandbox *sb, registry *reg, int root_ref, const char *arg, k3rt_error *err);

#endif
