/* What the schema's files share (schema_section.c): the validation context, the core sections'
 * scalar keys and the spec slots. schema_model.c (the model section) and schema.c (the top
 * level) build on it. */
#ifndef K3RT_RECIPE_SCHEMA_SECTION_H
#define K3RT_RECIPE_SCHEMA_SECTION_H

#include "recipe/schema.h"

typedef struct schema_ctx {
    const raw_doc *raw;
    registry *reg;
    char *pos;      /* position of the failing element; starts as the recipe's */
    k3rt_error *err;
} schema_ctx;

/* Validates the scalar keys of the named section (raw may be NULL: all defaults) into a new
 * object in declaration order; unknown keys are checked against scalars and structured keys. */
int sch_section_scalars(schema_ctx *c, const char *section, const json_t *raw, json_t **out);
/* The keys of a core section (scalars, then structured keys) into names; -1 when `section`
 * names none. */
int sch_section_names(const char *section, const char **names, int max);
/* The plan section: its scalars, plan.activations and plan.memory_budget. */
int sch_plan(schema_ctx *c, const json_t *raw, json_t **out);
/* A spec of `kind` at `what`. */
int sch_spec(schema_ctx *c, const json_t *v, int kind, const char *what, json_t **out);
/* A balancer slot: absent or k3.none mean the built-in `none` balancer. */
int sch_balancer(schema_ctx *c, const json_t *v, const char *what, json_t **out);
/* "%s: expected a table, got ..." */
int sch_not_a_table(schema_ctx *c, const char *what, const json_t *v);

#endif
