/* The name and layout table between k3rt checkpoints and Hugging Face folders
 * (plugins/hf_names.json, shipped beside the plugins), and the model document's layer
 * structure both directions read it through. The table is data: the core learns a plugin's
 * Hub names from it, never from the plugin's code, so core/ points into no plugin.
 *
 * A parameter's rule (the table's "params" value for it) is a Hub name relative to the
 * plugin's prefix, or an object: {"name", "conv1d": true} ([C, K] <-> [C, 1, K]), {"name",
 * "fuse_heads": [params], "widths": [options]} (the listed [H * w_k, in] matrices interleaved
 * per head into one [H * sum w_k, in], as Kimi's q_proj / q_b_proj and kv_b_proj),
 * {"fused_into": param} (consumed by that rule), {"name" with "{j}", "split_experts": true}
 * ([E, out, in] <-> E tensors) and "name_if_present": {param: name} (another Hub name when the
 * module has that parameter: q_b_proj beside q_a_proj). */
#ifndef K3RT_INTEROP_HF_TABLE_H
#define K3RT_INTEROP_HF_TABLE_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "plugin/registry.h"

#define HF_TABLE_FILE "hf_names.json"

typedef struct hf_table {
    json_t *doc;
    char path[1100];
} hf_table;

/* path: the table file, or NULL to take hf_names.json from the first folder holding one among
 * the folders of reg's plugins (in search-path order). */
int hf_table_open(hf_table *t, const char *path, const registry *reg, k3rt_error *err);
void hf_table_close(hf_table *t);

/* The table's entry of a plugin; NULL when it has none. */
const json_t *hf_table_plugin(const hf_table *t, const char *plugin);

/* A model document's module at layer i and slot ("mixer", "ffn", "residual": the model's
 * one residual): its spec {"plugin", "config"}, NULL when out of range or another slot. */
const json_t *hf_layer_spec(const json_t *model, int layer, const char *slot);

/* `template` with every "{i}" replaced by i and "{j}" by j, into buf. */
const char *hf_fill(char *buf, size_t len, const char *template, int i, int j);
/* Whether name matches template, where "{i}" and "{j}" match decimal numbers (stored in *i,
 * *j; -1 when the template has none). */
int hf_match(const char *template, const char *name, int *i, int *j);

/* A dotted key path ("linear_attn_config.head_dim") in obj: get, and set creating objects. */
const json_t *hf_get_path(const json_t *obj, const char *path);
int hf_set_path(json_t *obj, const char *path, json_t *value);

#endif
