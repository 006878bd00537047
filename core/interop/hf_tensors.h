/* The tensors of one side of a conversion: a growing list of safetensors entries with the
 * buffers it owns, the per-head interleave of Kimi's fused projections, and a Hugging Face
 * folder's weights (one model.safetensors, or shards listed by model.safetensors.index.json)
 * written and read. */
#ifndef K3RT_INTEROP_HF_TENSORS_H
#define K3RT_INTEROP_HF_TENSORS_H

#include <stdint.h>
#include <k3rt/errors.h>

#include "train/safetensors.h"

typedef struct hf_list {
    st_entry *e;
    char **names;      /* owned copies of e[i].name */
    void **owned;      /* buffers the list allocated (NULL where e[i].data is borrowed) */
    int n, cap;
} hf_list;

/* Appends a tensor; data is borrowed, or owned when own is set (freed with the list). */
int hf_list_add(hf_list *l, const char *name, int dtype, int ndim, const int64_t *shape,
                const void *data, int own, k3rt_error *err);
void hf_list_free(hf_list *l);
/* Index of name, -1 when absent. */
int hf_list_find(const hf_list *l, const char *name);

/* Per-head interleave: k parts of [H * w[p], cols] into out [H * sum(w), cols] (head h's rows
 * of part 0, then of part 1, ...); split does the reverse. esize: bytes per element. */
void hf_fuse_heads(const void *const *parts, const int64_t *w, int k, int64_t H, int64_t cols,
                   size_t esize, void *out);
void hf_split_heads(const void *in, const int64_t *w, int k, int64_t H, int64_t cols,
                    size_t esize, void *const *parts);

/* Writes the list into dir as model.safetensors, or as model-0000k-of-0000n.safetensors of at
 * most shard_bytes each (a larger tensor alone in its shard) with model.safetensors.index.json
 * ({"metadata": {"total_size"}, "weight_map"}); the number of files into *shards. */
int hf_write_weights(const char *dir, const hf_list *l, int64_t shard_bytes, int *shards,
                     k3rt_error *err);

/* The folder's weights, every tensor of every shard: files[] stay open (the list borrows their
 * data) until hf_close_weights. */
typedef struct hf_weights {
    st_file **files;
    int n_files;
    hf_list all;
} hf_weights;
int hf_read_weights(const char *dir, hf_weights *w, k3rt_error *err);
void hf_close_weights(hf_weights *w);

#endif
