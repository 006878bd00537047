/* The recipe schema: core sections as k3rt_option tables (so unknown keys, types, ranges and
 * defaults read like plugin options), plugin specs checked against each plugin's descriptor,
 * and the cross-key rules (pattern, dense layers, data sources, mid-run changes). Input is the
 * raw tree of convert.c; output the validated document described in recipe.h. */
#ifndef K3RT_RECIPE_SCHEMA_H
#define K3RT_RECIPE_SCHEMA_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "plugin/registry.h"
#include "recipe/convert.h"

/* Builds the document. On failure err holds the message and pos (len >= SANDBOX_POS_MAX) the
 * recipe position it belongs to ("recipe.lua:12:"; "" when none is known). */
int schema_build(const raw_doc *raw, registry *reg, const char *stem, json_t **doc, char *pos,
                 k3rt_error *err);
/* Validates what on_step returned: NULL (no change) or { "balancer": SPEC }. */
int schema_changes(const raw_doc *raw, registry *reg, json_t **changes, char *pos,
                   k3rt_error *err);

/* One spec of the given kind at `what` ("model.ffn"): options validated, defaults filled,
 * an optimizer's "lr" moved next to "config". JSON null is refused; each slot decides what
 * none means there. On failure pos receives the spec's position. */
int schema_spec(const raw_doc *raw, registry *reg, const json_t *v, int kind, const char *what,
                json_t **out, char *pos, k3rt_error *err);
/* The spec of a default plugin (no options given), e.g. standard{} for model.residual. */
int schema_default_spec(registry *reg, const char *name, int kind, const char *what,
                        json_t **out, k3rt_error *err);
/* cfg (taken) rebuilt in declaration order, FLOAT options stored as reals, so the document
 * does not depend on how a value was written. */
json_t *schema_ordered(const k3rt_option *opts, uint32_t n, uint32_t size, json_t *cfg);
/* "a table", "a string", ... for messages ("nothing" for NULL). */
const char *schema_json_kind(const json_t *v);

/* The plugin a spec names: by path when it was loaded by path, else by name and kind (kind 0:
 * any). NULL when absent. */
const plugin_entry *schema_resolve(const registry *reg, const char *name, const char *path,
                                   int kind);

/* What --set may name inside the container at comps[0..depth): */
enum {
    SCHEMA_LEAF = -1, /* nothing (a scalar) */
    SCHEMA_MAP = -2,  /* any key (model.mixers) */
    SCHEMA_LIST = -3, /* list positions 1..n (train.changes) */
    SCHEMA_SPEC = -4  /* a plugin's options; *kind receives the plugin kind */
};
/* Returns the number of valid names written to names (a section), or one of the above. */
int schema_names(const char *const *comps, int depth, const char **names, int max, int *kind);
/* Option names of a plugin (plus the core-owned "lr" of optimizers); returns the count. */
int schema_plugin_names(const plugin_entry *e, const char **names, int max);
/* The "unknown key" message shared by every level: nearest valid key or the list of them. */
int schema_unknown_key(const char *what, const char *key, const char *const *names, int n,
                       k3rt_error *err);
/* Every key of the JSON object obj is one of names[0..n); else that message for the first. */
int schema_check_keys(const json_t *obj, const char *const *names, int n, const char *what,
                      k3rt_error *err);

#endif
