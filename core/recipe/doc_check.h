/* Documents that claim to be the schema's output — a checkpoint manifest's "config", the
 * balancer in effect and its mid-run changes — checked by the same schema as a recipe: every
 * spec resolves (by name on the search path, or by path only to a file the command line or the
 * recipe has loaded), every value is in its range, the cross-key rules hold, and the schema
 * gives the document back unchanged (so nothing it would not have written, such as a layer
 * count beyond its range, slips through to the engine). */
#ifndef K3RT_RECIPE_DOC_CHECK_H
#define K3RT_RECIPE_DOC_CHECK_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "plugin/registry.h"

/* A whole validated document (recipe.h's layout) into *out, the schema's (owned by the
 * caller). Messages start with the key. */
int doc_check_config(const json_t *doc, registry *reg, json_t **out, k3rt_error *err);
/* One SPEC of the given kind into *out; `what` names it in messages ("balancer"). */
int doc_check_spec(const json_t *spec, int kind, registry *reg, const char *what, json_t **out,
                   k3rt_error *err);

#endif
