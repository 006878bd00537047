/* config.json both ways: KimiLinearConfig's fields from a k3rt model document (the table's
 * "config" maps, layers listed 1-indexed per mixer plugin in "layers_key"), and a model
 * document from a Hub config.json without k3rt's own block (the table's "hub" values for the
 * options the Hub fields do not hold). */
#ifndef K3RT_INTEROP_HF_CONFIG_H
#define K3RT_INTEROP_HF_CONFIG_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "interop/hf_table.h"

/* model_type is "kimi_linear" when every module has the Hub's values of the table's "hub"
 * options and extra_differs (what the export found in the tensors; may be NULL) is empty, else
 * "kimi_k3" with the differences listed under k3rt.differs_from_kimi_linear. The table's
 * "fixed" fields are written as they are. */
int hf_config_from_model(const hf_table *t, const json_t *model, int dtype,
                         const json_t *extra_differs, json_t **out, k3rt_error *err);
/* The model document of a config.json: its "k3rt"."model" when present, else built from the
 * Hub fields (a "fixed" field with another value is refused; a routed FFN with the table's
 * balancer_state gets its "hub_balancer"); *out is new. path names the file in messages. */
int hf_model_from_config(const hf_table *t, const json_t *cfg, const char *path, json_t **out,
                         k3rt_error *err);

#endif
