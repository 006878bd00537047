/* The model section of a recipe (schema_model.c): scalars, the mixers and their layer
 * pattern, FFNs, balancer, residual. */
#ifndef K3RT_RECIPE_SCHEMA_MODEL_H
#define K3RT_RECIPE_SCHEMA_MODEL_H

#include "recipe/schema_section.h"

int sch_model(schema_ctx *c, const json_t *raw, json_t **out);

#endif
