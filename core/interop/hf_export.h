/* `k3rt export CHECKPOINT --hf DIR`: a checkpoint's weights as a Hugging Face folder in the
 * Kimi-Linear layout (hf_table.h), with config.json, and its reverse `k3rt import`. */
#ifndef K3RT_INTEROP_HF_EXPORT_H
#define K3RT_INTEROP_HF_EXPORT_H

#include <stdint.h>
#include <k3rt/errors.h>

typedef struct hf_options {
    const char *src;           /* export: a checkpoint (or checkpoints root); import: DIR */
    const char *out;           /* export: the folder to write; import: where the weights go */
    const char *recipe_out;    /* import: the recipe to write */
    const char *names;         /* the table file; NULL: beside the plugins */
    const char *plugin_path;   /* extra plugin directories */
    int dtype;                 /* export: K3RT_F32 or K3RT_BF16 */
    int64_t shard_bytes;       /* export: largest shard (a larger tensor gets its own) */
} hf_options;

int hf_export(const hf_options *o, k3rt_error *err);
int hf_import(const hf_options *o, k3rt_error *err);

#endif
