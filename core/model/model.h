/* The model of one rank: embedding -> layers -> final norm -> LM head -> cross-entropy.
 *
 * Each layer is a token mixer plugin (chosen per layer by the recipe's pattern) and an FFN
 * plugin (dense for the first dense_layers, the recipe's ffn after), each preceded by an
 * RMSNorm owned by the model. One residual plugin forms every sublayer's input and the final
 * output; MoE layers with routed experts get a balancer instance each. Parameters live in one
 * contiguous buffer (and their gradients in another), so data-parallel all-reduce and the
 * gradient norm are single calls.
 *
 * Forward and backward are explicit, as in llm.c:
 *   h0 = embed(tokens); residual.begin(h0)
 *   for s in 0..2L-1: hs[s] = residual.mix(s); ys = sublayer_s(rmsnorm(hs[s])); residual.push(ys)
 *   hf = residual.finish(); loss = xent(head(rmsnorm(hf)))
 * The LM head and loss run in row chunks, with the head's backward fused into the training
 * forward so full logits never exist for the whole batch.
 */
#ifndef K3RT_MODEL_H
#define K3RT_MODEL_H

#include <jansson.h>
#include <k3rt/k3rt.h>

#include "plugin/registry.h"
#include "plugin/rig.h"

typedef struct param_slot {
    char name[160];
    k3rt_param_decl decl;   /* decl.name points at name */
    int module;             /* owning module index, -1 for the model's own parameters */
    int index;              /* index within the owner's declarations */
    int64_t offset;         /* element offset into the parameter and gradient buffers */
    int64_t numel;
    k3rt_tensor param;      /* what the plugins compute with (compute dtype) */
    k3rt_tensor master;     /* what the optimizer updates and checkpoints hold (master dtype);
                               the same memory as param unless the compute dtype is bf16 */
    k3rt_tensor grad;       /* master dtype: gradients accumulate in fp32 under bf16 */
} param_slot;

typedef struct model_module {
    rig r;
    int kind;
    int layer;              /* -1 for the residual (model-wide) */
    char prefix[64];        /* "layers.3.mixer." */
    int n_params;
    k3rt_tensor *params, *grads;  /* views in declaration order, bound to the rig */
    int64_t saved_offset, saved_bytes;  /* its region of the activation arena's saved block */
} model_module;

typedef struct model_layer {
    int mixer, ffn;          /* module indices */
    int balancer;            /* module index or -1 (dense FFN) */
    int mixer_norm, ffn_norm;/* parameter indices */
    int32_t experts, top_k;
    char mixer_letter;
} model_layer;

typedef struct model_options {
    int dtype;               /* compute dtype: K3RT_F32 or K3RT_F64 (tests) on the CPU;
                                K3RT_F32 or K3RT_BF16 (fp32 master weights) on CUDA */
    int device;
    k3rt_stream *stream;     /* compute stream (not owned) */
    k3rt_comm *comm;         /* this rank's world communicator (not owned; may be NULL) */
    uint64_t seed;
    int deterministic;
    const json_t *activations; /* plan.activations {class pattern: policy} or NULL (keep all);
                                  not owned, must outlive the model */
    const json_t *planned;     /* the activation planner's {class: policy} for the classes
                                  `activations` leaves free, or NULL (actman_plan_with) */
} model_options;

typedef struct model {
    model_options opt;
    int64_t d, vocab;
    int n_layers;
    double norm_eps, init_std;
    model_module *mods;
    int n_mods, cap_mods;
    model_layer *layers;
    int residual;            /* module index */
    param_slot *params;
    int n_params, cap_params;
    int embed, final_norm, head;  /* parameter indices */
    void *param_buf, *grad_buf;  /* master weights and gradients (master dtype) */
    void *compute_buf;       /* bf16 copies of the master weights, or NULL (same dtype) */
    int64_t total_numel;
    size_t elem;             /* bytes per element of the compute dtype */
    int master_dtype;        /* F32 under bf16 compute, else the compute dtype; also the dtype
                                of per-row statistics (rstd, lse, loss), as ops.h asks */
    size_t master_elem;
    /* activations for the current (B, T); see model_fwd.c */
    int64_t B, T;
    void *act;               /* one arena */
    size_t act_bytes;
    struct model_acts *a;
    struct actman *am;       /* where the modules' saved parts live (model/actman.h) */
    double aux_loss;         /* balancers' auxiliary loss (already weighted) summed over the
                                training forwards since model_reset_routed: on a GPU the part
                                staged in aux_stage arrives with model_flush_routed */
    int64_t **routed;        /* per layer [experts]: tokens routed since model_reset_routed
                                (training forwards only); NULL for dense layers */
    /* On a GPU the counts of every training forward are copied on the device into one slot of
     * routed_stage ([MODEL_ROUTED_SLOTS][routed_width] i64) and read into `routed` once, by
     * model_flush_routed at the end of the step (or when the slots run out), so no micro-batch
     * waits for them. routed_at[layer] is a layer's offset in a slot. aux_stage, one f64 just
     * before the slots in the same allocation, sums the balancers' auxiliary losses of those
     * forwards (aux_loss_add) and comes back with the same copy. */
    int64_t *routed_stage, *routed_at, routed_width;
    double *aux_stage;
    int routed_used;
    struct profile *prof;    /* set by the trainer during a profiled step, else NULL
                                (model/profile.h) */
    k3rt_tensor docs;        /* packed documents of the next forwards and backwards
                                (model_set_documents): i32 [n_docs + 1] on the device, ndim 0
                                when none */
    void *docs_buf;          /* its storage, B * T + 1 entries, with the activations */
    struct {                 /* incremental decoding (model_decode_begin .. _end) */
        rig_cache *caches;   /* [n_layers] each mixer's, or NULL when not decoding */
        int64_t B, pos;      /* sequences, tokens fed to each */
        int active;          /* a decode step runs: mixers take their token via the cache */
    } decode;
} model;

#define MODEL_ROUTED_SLOTS 64

/* The model's modules and parameter declarations without any parameter, gradient or
 * activation storage: what `k3rt plan` sizes a model by (counts, FLOPs, plugin byte counts)
 * without allocating it. Only model_param_counts, model_flops, model_act_bytes, the module
 * calls that need no tensors and model_free may be used on it. */
int model_declare(model *m, const json_t *model_doc, registry *reg, const model_options *opt,
                  k3rt_error *err);
/* Builds from the "model" section of a validated recipe document (recipe.h). Plugins named
 * by specs are resolved in reg. Parameters are allocated and initialised (seeded by name). */
int model_build(model *m, const json_t *model_doc, registry *reg, const model_options *opt,
                k3rt_error *err);
void model_free(model *m);
/* Resolves a SPEC {"plugin", "kind", "path", "config"} to its plugin: by name and kind, or,
 * with a path, to the entry already loaded from that file (the command line's --plugin or the
 * recipe's k3.plugin); a path nothing loaded is refused, never dlopen'd. */
int model_resolve_spec(registry *reg, const json_t *spec, int kind, const char *where,
                       const plugin_entry **out, k3rt_error *err);

/* Sizes the activation arena for micro-batches of B x T (reallocates when it grows). */
int model_set_shape(model *m, int64_t B, int64_t T, k3rt_error *err);
/* Packed sequences for the following forwards and backwards at the current shape: offsets
 * [n_docs + 1] over the B * T tokens as plugin.h's doc_offsets (0, every row start among them,
 * increasing, B * T last), given to every mixer (one without K3RT_CAP_DOCUMENTS refuses the
 * call); n_docs = 0 goes back to one sequence per row. */
int model_set_documents(model *m, const int32_t *offsets, int64_t n_docs, k3rt_error *err);
/* Bytes model_set_shape would allocate for micro-batches of B x T (modules' saved
 * activations, the largest workspace, the model's own buffers), without allocating them. */
int model_act_bytes(model *m, int64_t B, int64_t T, int64_t *bytes, k3rt_error *err);
/* Zeroes every gradient. */
void model_zero_grads(model *m);
/* Refreshes the compute copies of the weights from the master weights (after every optimizer
 * step and checkpoint load; nothing to do when the two dtypes agree). */
int model_sync_compute(model *m, k3rt_error *err);
/* Zeroes the per-layer routing counters and aux_loss (start of an optimizer step). */
void model_reset_routed(model *m);
/* Adds the counts staged on the device into `routed` and the staged auxiliary loss into
 * aux_loss (one copy and one wait; nothing to do on the CPU): before either is read. */
int model_flush_routed(model *m, k3rt_error *err);

/* One micro-batch of training: forward, loss, backward. Gradients accumulate scaled by
 * grad_scale per token (1 / tokens of the whole step). *loss_sum gets the summed token loss
 * (the balancers' auxiliary loss, already weighted, is added into m->aux_loss: on a GPU at
 * model_flush_routed). */
int model_train_step(model *m, const int32_t *tokens, const int32_t *targets, double grad_scale,
                     double aux_scale, double *loss_sum, k3rt_error *err);
/* Forward only: summed loss over targets >= 0 and their count. */
int model_eval(model *m, const int32_t *tokens, const int32_t *targets, double *loss_sum,
               int64_t *count, k3rt_error *err);
/* Forward only over tokens [B, T]; writes the logits at position pos of each row into
 * logits [B, vocab] (host, double). Causality makes positions after pos irrelevant, so a
 * shorter context can be right-padded to T. */
int model_logits_at(model *m, const int32_t *tokens, int64_t pos, double *logits,
                    k3rt_error *err);

/* Incremental decoding: B sequences fed one token at a time, every token mixer keeping a
 * cache (rig_cache: the plugin's decode_step, or its ABI 2.0 decode()) and everything else
 * (norms, FFNs and their routers, the residual, the head) running on the one new token, at
 * the shape (B, 1). Logits equal model_logits_at's on the whole sequence so far, up to
 * rounding; the context has no length limit (a recurrent mixer's cache is fixed-size, an
 * attention cache grows by one position per token).
 * model_can_decode is 1 when every mixer decodes incrementally; otherwise it names the first
 * that cannot in why (callers then run model_logits_at over the context). */
int model_can_decode(const model *m, char *why, size_t len);
/* Empty caches for B sequences; capacity is the number of tokens expected (a hint). */
int model_decode_begin(model *m, int64_t B, int64_t capacity, k3rt_error *err);
/* Feeds tokens [B] (one per sequence) and writes the next-token logits [B, vocab] (host
 * doubles; NULL skips the head, e.g. for all but the last prompt token). Other forwards may
 * run between steps (the shape is set back to (B, 1) here). After a failed step the caches
 * may disagree with each other: end decoding. */
int model_decode_step(model *m, const int32_t *tokens, double *logits, k3rt_error *err);
/* Tokens fed per sequence since model_decode_begin. */
int64_t model_decode_pos(const model *m);
/* Frees the caches (nothing to do when not decoding); model_free calls it. */
void model_decode_end(model *m);

/* FLOPs of one forward and one backward over B x T tokens, from the plugins' own counts
 * plus the model's embedding, norms and head. */
int model_flops(model *m, int64_t B, int64_t T, double *forward, double *backward,
                k3rt_error *err);
/* Parameter counts: total; active per token (routed experts count top_k of experts, the
 * embedding lookup does not count, the head does). */
void model_param_counts(const model *m, int64_t *total, int64_t *active);
/* The share of parameter i that model_param_counts counts as active. */
int64_t model_param_active(const model *m, int i);

/* The balancer of a layer can be replaced mid-run (a recipe change or on_step). */
int model_set_balancer(model *m, const json_t *spec, registry *reg, k3rt_error *err);

/* Parameter lookup by full name (-1 when absent). */
int model_find_param(const model *m, const char *name);
/* The balancer instance of layer i, NULL for a layer without routed experts. */
rig *model_balancer(model *m, int layer);

#endif
