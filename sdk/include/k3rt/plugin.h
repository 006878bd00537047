/* k3rt/plugin.h — the plugin ABI: descriptor, instance functions and one vtable per kind.
 *
 * A plugin is a shared object exporting exactly one symbol, k3rt_plugin_entry, that returns a
 * const descriptor. The host loads it with dlopen(RTLD_NOW | RTLD_LOCAL), checks abi_major
 * (must equal the host's) and abi_minor (must not exceed the host's) before touching anything
 * else, and reads only struct_size bytes of every struct the plugin hands over: structs grow
 * only at the end, and a field beyond a plugin's struct_size reads as zero/NULL ("not
 * provided"). Likewise every struct the host passes in starts with its struct_size, so a
 * plugin built against a newer minor can tell which fields exist.
 *
 * Arguments are validated by the host. Before every call the host has checked, against the
 * plugin's own declarations (declare_params, memory, saved, state_layout, experts), that the
 * stream and every tensor are on the instance's device, that dtypes and shapes are the
 * declared ones, that batch and seq are >= 1 and that saved and workspace hold what memory()
 * asked for at this (batch, seq); it never calls a device or dtype outside the descriptor's
 * caps. A plugin's functions therefore start with their math. What the host cannot know stays
 * the plugin's to refuse, at create: rules between its own options ("latent must divide ...").
 *
 * Memory: the engine owns parameters, gradients, saved activations and workspaces and passes
 * views; a plugin owns its instance (create/destroy) and any state it allocates (optimizer
 * moments, balancer bias) with k3rt_alloc on the run's device. Saved activations may be
 * moved between forward and backward (offloaded, stored in fp8, recomputed): read them
 * through the pointers of each call, never through pointers kept from an earlier one.
 * Streams: every call receives the stream it must enqueue on; CPU streams run inline.
 * Threads: an instance is used by one thread at a time (one instance per rank and layer); CPU
 * plugins parallelise internally with k3rt_parallel_for. Errors: return a k3rt_status and
 * fill err; never abort or exit.
 *
 * Devices: "on the device" means on the instance's device: host memory for a CPU instance,
 * the GPU's memory for a CUDA one. Everything the host passes in, and everything a plugin
 * reports (routing, statistics, state), lives there; the host reads what it needs once per
 * step, so a GPU plugin never synchronises to hand over a number.
 *
 * Shapes: activations are [B, T, d] row-major; linear weights are [out, in].
 */
#ifndef K3RT_PLUGIN_H
#define K3RT_PLUGIN_H

#include <stdint.h>
#include <stddef.h>
#include "errors.h"
#include "tensor.h"
#include "stream.h"
#include "comm.h"
#include "random.h"
#include "config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3RT_ABI_MAJOR 2
#define K3RT_ABI_MINOR 3

/* ---- Kinds and capabilities ------------------------------------------------------------------ */

typedef enum k3rt_kind {
    K3RT_KIND_ATTENTION = 1, /* token mixer */
    K3RT_KIND_MOE = 2,       /* FFN: dense or mixture of experts */
    K3RT_KIND_BALANCER = 3,
    K3RT_KIND_OPTIMIZER = 4,
    K3RT_KIND_RESIDUAL = 5,
    K3RT_KIND_COUNT_ = 6
} k3rt_kind;

/* Properties of the implementation. What a plugin can do beyond its kind's required functions
 * (recurrent state, context parallelism, decoding, an auxiliary loss, ...) is said by the
 * presence of the optional function, never by a bit. */
enum {
    K3RT_CAP_CPU = 1u << 0,           /* a CPU implementation (f32) */
    K3RT_CAP_CUDA = 1u << 1,          /* a CUDA implementation (f32 and bf16) */
    K3RT_CAP_F64 = 1u << 2,           /* the CPU implementation also in double (tests) */
    K3RT_CAP_DETERMINISTIC = 1u << 3, /* bitwise reproducible when asked (args->deterministic) */
    K3RT_CAP_DOCUMENTS = 1u << 4      /* attention: honours doc_offsets (packed sequences) */
};

/* ---- Parameters -------------------------------------------------------------------------------- */

/* The optimizer chooses its rule from the role, never from the name. */
typedef enum k3rt_role {
    K3RT_ROLE_MATRIX = 1,        /* [out, in] dense matrix */
    K3RT_ROLE_HEAD_MATRIX = 2,   /* [out, in] made of `heads` blocks along `head_axis` */
    K3RT_ROLE_EXPERT_MATRIX = 3, /* [experts, out, in] */
    K3RT_ROLE_ROUTER = 4,        /* [experts, in] */
    K3RT_ROLE_EMBEDDING = 5,     /* [vocab, d] */
    K3RT_ROLE_OUTPUT_HEAD = 6,   /* [vocab, d] */
    K3RT_ROLE_NORM_GAIN = 7,     /* [d] */
    K3RT_ROLE_VECTOR = 8,        /* biases, per-head scalars (A_log, dt_bias), pseudo-queries */
    K3RT_ROLE_CONV = 9,          /* depthwise conv filters [channels, width] */
    K3RT_ROLE_COUNT_ = 10
} k3rt_role;

typedef enum k3rt_init {
    K3RT_INIT_ZEROS = 0,
    K3RT_INIT_ONES = 1,
    K3RT_INIT_CONST = 2,     /* init_a */
    K3RT_INIT_NORMAL = 3,    /* mean 0, std init_a */
    K3RT_INIT_UNIFORM = 4,   /* [init_a, init_b) */
    K3RT_INIT_PLUGIN = 5     /* the owner's init_param() fills it */
} k3rt_init;

/* QK-clip: how a head's weights are rescaled when its max logit exceeds tau (gamma = tau/max). */
typedef enum k3rt_qk_clip {
    K3RT_QK_NONE = 0,
    K3RT_QK_SQRT = 1,  /* scale the head's block by sqrt(gamma) (query and key sides) */
    K3RT_QK_FULL = 2   /* scale the head's block by gamma (query side of a shared key) */
} k3rt_qk_clip;

enum {
    K3RT_PARAM_NO_DECAY = 1u << 0  /* exclude from weight decay whatever the role */
};

typedef struct k3rt_param_decl {
    uint32_t struct_size;
    int32_t role;          /* k3rt_role */
    const char *name;      /* relative, e.g. "q_proj.weight"; the engine prefixes
                              "layers.{i}.{mixer|ffn}." (or "layers.{i}.residual." / "residual.") */
    int32_t ndim;
    int32_t reserved_;
    int64_t shape[K3RT_MAX_DIMS];
    int32_t heads;         /* HEAD_MATRIX: number of heads */
    int32_t head_axis;     /* HEAD_MATRIX: 0 = heads split the rows (out), 1 = the columns (in) */
    int32_t experts;       /* EXPERT_MATRIX: leading dimension */
    int32_t init;          /* k3rt_init */
    double init_a, init_b;
    int32_t layer;         /* model-level plugins (residual): owning layer, -1 for model-wide */
    int32_t qk_clip;       /* k3rt_qk_clip, with the owner reporting stats "max_logit" [heads] */
    uint32_t flags;        /* K3RT_PARAM_* */
} k3rt_param_decl;

typedef struct k3rt_param_sink k3rt_param_sink;
typedef struct k3rt_tensor_sink k3rt_tensor_sink;
typedef struct k3rt_saved_sink k3rt_saved_sink;

/* Called from declare_params(); the decl is copied. */
K3RT_API int k3rt_param_sink_add(k3rt_param_sink *sink, const k3rt_param_decl *decl,
                                 k3rt_error *err);

/* How ranks combine a statistic: */
enum { K3RT_STAT_LOCAL = -1 }; /* or a k3rt_reduce_op (SUM, MAX, MIN, AVG) */

/* Called from state() and stats(): name is relative ("m", "counts"); the engine prefixes the
 * owner. The tensor is the live storage on the instance's device: for state() the host reads
 * it to save and writes it to load (then calls state_loaded); for stats() it reads it when it
 * needs the numbers. `reduce` is K3RT_STAT_LOCAL or a k3rt_reduce_op. */
K3RT_API int k3rt_tensor_sink_add(k3rt_tensor_sink *sink, const char *name, k3rt_tensor t,
                                  int reduce, k3rt_error *err);

/* ---- Saved activations ----------------------------------------------------------------------- */

/* What the activation manager may do with a saved part, besides keeping it on the device or
 * offloading it to host memory (always allowed). */
enum {
    K3RT_SAVED_GEMM_ONLY = 1u << 0,  /* read back only as a matrix-product operand: may be stored
                                        in fp8 (dtype must then be a float dtype) */
    K3RT_SAVED_RECOMPUTE = 1u << 1   /* rebuilt by running the forward again on the same x: may
                                        be dropped, at the cost of recompute_flops */
};

/* One tensor kept from the forward for the backward. */
typedef struct k3rt_saved_decl {
    uint32_t struct_size;
    uint32_t flags;            /* K3RT_SAVED_* */
    const char *name;          /* "qkv", "states": for plans and messages */
    int64_t bytes;
    int32_t dtype;             /* element dtype, K3RT_DTYPE_INVALID for raw bytes */
    int32_t reserved_;
    double recompute_flops;    /* K3RT_SAVED_RECOMPUTE: FLOPs of rebuilding it */
} k3rt_saved_decl;

/* Called from saved(); the decl is copied. */
K3RT_API int k3rt_saved_sink_add(k3rt_saved_sink *sink, const k3rt_saved_decl *decl,
                                 k3rt_error *err);

/* For a plugin that lays its saved tensors out as one run of offsets and declares that run as
 * consecutive parts: ends[i] is where part i ends in the run (cumulative, in the run's units of
 * `unit` bytes), and the address of run offset `off` is inside the part holding it. A
 * zero-sized tensor at a part's end maps to the next part's start (never dereferenced). */
static inline void *k3rt_saved_at(void *const *saved, const int64_t *ends, int n_parts,
                                  int64_t off, size_t unit)
{
    int p = 0;
    while (p < n_parts - 1 && off >= ends[p])
        p++;
    return (char *)saved[p] + (size_t)(off - (p ? ends[p - 1] : 0)) * unit;
}

/* ---- Arguments shared by all kinds -------------------------------------------------------------- */

typedef struct k3rt_param_ref {
    uint32_t struct_size;
    int32_t index;
    const char *name;              /* full name, e.g. "layers.3.mixer.q_proj.weight" */
    const k3rt_param_decl *decl;
    k3rt_tensor param;             /* master weights (f32; f64 in tests) */
    k3rt_tensor grad;              /* same shape and dtype */
    k3rt_tensor head_max_logit;    /* [heads] f32 on the device, for qk_clip params (the
                                      owner's "max_logit" statistic, reduced over the data-
                                      parallel group); ndim 0 otherwise */
} k3rt_param_ref;

typedef struct k3rt_create_args {
    uint32_t struct_size;
    int32_t kind;
    const k3rt_config *config;     /* validated against the descriptor's options, defaults filled */
    int32_t dtype;                 /* compute dtype of the run (K3RT_F32, K3RT_F64, K3RT_BF16) */
    int32_t device;                /* K3RT_DEVICE_CPU or a CUDA ordinal; within the caps */
    int64_t d_model;               /* >= 1 for attention, moe and residual plugins */
    int64_t vocab;
    int32_t n_layers;              /* >= 1 for attention, moe and residual plugins */
    int32_t layer;                 /* attention/moe: this instance's layer; -1 model-level */
    int32_t n_experts, top_k;      /* balancer: of the MoE layer it serves (1 <= top_k <= n) */
    const k3rt_param_ref *params;  /* optimizer: every parameter of the model */
    int32_t n_params;
    int32_t deterministic;
    k3rt_comm *comm;               /* world communicator of this rank */
    k3rt_stream *stream;           /* the run's compute stream */
    uint64_t seed;
} k3rt_create_args;

typedef struct k3rt_flops {
    uint32_t struct_size;
    double forward;   /* FLOPs of one forward over B x T tokens (multiply-add = 2) */
    double backward;  /* FLOPs of its backward */
} k3rt_flops;

typedef struct k3rt_memory {
    uint32_t struct_size;
    int64_t saved_bytes;      /* activations kept from forward to backward, per call, as one
                                 raw part; ignored when the plugin declares saved() parts */
    int64_t workspace_bytes;  /* scratch during one call */
    int64_t state_bytes;      /* persistent non-parameter state (optimizer, balancer) */
} k3rt_memory;

typedef struct k3rt_instance_vtable {
    uint32_t struct_size;
    int (*create)(const k3rt_create_args *a, void **self, k3rt_error *err);
    void (*destroy)(void *self);
    /* Parameters this instance owns (NULL: none). */
    int (*declare_params)(void *self, k3rt_param_sink *sink, k3rt_error *err);
    /* Fills a K3RT_INIT_PLUGIN parameter (host memory of the compute dtype). */
    int (*init_param)(void *self, const k3rt_param_decl *decl, k3rt_tensor t, k3rt_rng *rng,
                      k3rt_error *err);
    int (*flops)(void *self, int64_t batch, int64_t seq, k3rt_flops *out);
    int (*memory)(void *self, int64_t batch, int64_t seq, k3rt_memory *out);
    /* Non-parameter state to checkpoint (NULL: none) and a hook after it was loaded. */
    int (*state)(void *self, k3rt_tensor_sink *sink, k3rt_error *err);
    int (*state_loaded)(void *self, k3rt_error *err);
    /* Statistics accumulated since reset_stats (routing counts, max logits, depth weights). */
    int (*stats)(void *self, k3rt_tensor_sink *sink, k3rt_error *err);
    void (*reset_stats)(void *self);
    /* Optional: the saved activations of one call at (batch, seq) as parts, in the order the
     * calls receive them (args->saved[i]), so the activation manager can treat each by its
     * class. Without it the saved activations are one raw part of memory().saved_bytes. */
    int (*saved)(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                 k3rt_error *err);
} k3rt_instance_vtable;

/* ---- Token mixers (attention) and FFNs (moe) ------------------------------------------------ */

/* What an MoE forward reports, on the device; views stay valid until the backward (or the next
 * forward). */
typedef struct k3rt_routing {
    uint32_t struct_size;
    int64_t batch, seq;     /* tokens = batch * seq, in [B, T] order */
    int32_t experts, top_k;
    k3rt_tensor scores;     /* [tokens, experts] f32 router scores before the bias */
    k3rt_tensor selected;   /* [tokens, top_k] i32 chosen experts, in slot order */
    k3rt_tensor counts;     /* [experts] i64: tokens routed to each expert */
    k3rt_tensor bias;       /* [experts] f32: the selection bias given (ndim 0: zero); the
                               host fills it, and batch, seq, experts, top_k */
    k3rt_tensor offsets;    /* optional [experts + 1] i64: rows of expert e in the expert-sorted
                               order are offsets[e] .. offsets[e+1] (prefix sums of counts) */
} k3rt_routing;

/* Packed sequences. doc_offsets, when given (ndim 1), is i32 [n_docs + 1] on the device:
 * document j covers the tokens [doc_offsets[j], doc_offsets[j+1]) of the flattened B * T order,
 * doc_offsets[0] = 0, the last entry is B * T, the offsets increase, and every row start b * T
 * is among them. A token mixer must not let information cross a boundary: state and short-conv
 * windows restart there. The host passes it to attention plugins with K3RT_CAP_DOCUMENTS only
 * (and refuses packed data for the others); FFNs are per token and ignore it.
 *
 * Context parallelism splits each sequence into spans, one per cp rank. A span that does not
 * start its sequence is given what it needs of the spans before it, as its plugin's context()
 * asks: x_prefix [B, prefix_rows, d], the layer inputs just before x (KDA's short-conv halo),
 * and kv_prefix [B, T_before, kv_width], the latent KV of every earlier token of the sequence
 * (MLA; each rank computes its own with kv_project and the engine gathers them). Both are ndim
 * 0 for the span that starts the sequence, which then sees zeros / nothing before it. The
 * backward returns their gradients in d_x_prefix and d_kv_prefix (overwritten), which the
 * engine sends back to the ranks that own those rows. */
typedef struct k3rt_fwd_args {
    uint32_t struct_size;
    int32_t training;             /* 1: backward follows with the same saved parts */
    k3rt_stream *stream;
    int64_t batch, seq;
    k3rt_tensor x;                /* [B, T, d] */
    k3rt_tensor y;                /* [B, T, d], written */
    const k3rt_tensor *params;    /* in declaration order */
    int32_t n_params;
    int32_t deterministic;
    void *const *saved;           /* one pointer per saved part, in saved()'s order (or the one
                                     part of memory().saved_bytes); given for every forward */
    int32_t n_saved;
    int32_t reserved_;
    void *workspace;
    int64_t workspace_bytes;
    k3rt_tensor doc_offsets;      /* optional: packed sequences (above) */
    /* attention */
    k3rt_tensor state_in;         /* optional initial recurrent state (state_layout) */
    k3rt_tensor state_out;        /* optional: receives the final state */
    k3rt_tensor x_prefix;         /* context parallelism (above) */
    k3rt_tensor kv_prefix;
    /* moe */
    k3rt_tensor bias;             /* [experts] f32 selection bias; ndim 0 means zero */
    k3rt_routing *routing;        /* out: filled by routed MoEs when given */
} k3rt_fwd_args;

typedef struct k3rt_bwd_args {
    uint32_t struct_size;
    int32_t reserved0_;
    k3rt_stream *stream;
    int64_t batch, seq;
    k3rt_tensor x;                /* the forward's input */
    k3rt_tensor dy;               /* [B, T, d] */
    k3rt_tensor dx;               /* [B, T, d], overwritten */
    const k3rt_tensor *params;
    const k3rt_tensor *grads;     /* accumulate (f32 under bf16 compute) */
    int32_t n_params;
    int32_t deterministic;
    void *const *saved;           /* as the forward wrote them (possibly moved since) */
    int32_t n_saved;
    int32_t reserved_;
    void *workspace;
    int64_t workspace_bytes;
    k3rt_tensor doc_offsets;      /* as given to the forward */
    /* attention */
    k3rt_tensor state_in;         /* as given to the forward */
    k3rt_tensor d_state_out;      /* optional gradient arriving at the final state */
    k3rt_tensor d_state_in;       /* optional: receives the gradient of the initial state */
    k3rt_tensor x_prefix;         /* as given to the forward */
    k3rt_tensor kv_prefix;
    k3rt_tensor d_x_prefix;       /* with x_prefix: receives its gradient */
    k3rt_tensor d_kv_prefix;      /* with kv_prefix: receives its gradient */
    /* moe */
    k3rt_tensor d_scores;         /* optional [tokens, experts] f32 extra gradient of the router
                                     scores (a balancer's auxiliary loss) */
} k3rt_bwd_args;

/* Shapes and dtypes (data NULL) of an attention plugin's recurrent state and context-parallel
 * summary; the host places them on the instance's device. */
typedef struct k3rt_state_layout {
    uint32_t struct_size;
    k3rt_tensor state;      /* e.g. KDA: [B, HV, dk, dv] */
    k3rt_tensor summary_m;  /* affine summary S_out = M S_in + B: M, e.g. [B, HV, dk, dk] */
    k3rt_tensor summary_b;  /* B, e.g. [B, HV, dk, dv] */
} k3rt_state_layout;

/* What a span needs of the spans before it under context parallelism (see k3rt_fwd_args). */
typedef struct k3rt_context_needs {
    uint32_t struct_size;
    int32_t reserved_;
    int64_t prefix_rows;    /* rows of x_prefix (KDA: conv_width - 1); 0: none */
    int64_t kv_width;       /* width of kv_prefix rows (MLA: the latent KV); 0: none */
} k3rt_context_needs;

/* ABI 2.2: incremental decoding, one token per sequence with a cache the plugin owns (see
 * k3rt_attention_vtable.decode_step). */
typedef struct k3rt_cache_args {
    uint32_t struct_size;
    int32_t reserved_;
    k3rt_stream *stream;          /* the run's compute stream */
    int64_t batch;                /* sequences decoded side by side, >= 1 */
    int64_t capacity;             /* tokens per sequence the engine expects to decode (>= 1): a
                                     cache that grows per token may reserve that much, and must
                                     still grow past it when asked */
} k3rt_cache_args;

typedef struct k3rt_decode_args {
    uint32_t struct_size;
    int32_t reserved_;
    k3rt_stream *stream;
    int64_t batch;                /* as at cache_create */
    int64_t pos;                  /* the new token's position: tokens of each sequence the cache
                                     already holds (0 for the first) */
    k3rt_tensor x;                /* [B, 1, d] the layer input of the new token */
    k3rt_tensor y;                /* [B, 1, d], written: what forward would give at position pos
                                     of the whole sequence */
    const k3rt_tensor *params;    /* in declaration order */
    int32_t n_params;
    int32_t reserved2_;
} k3rt_decode_args;

typedef struct k3rt_attention_vtable {
    uint32_t struct_size;
    int (*forward)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
    int (*backward)(void *self, const k3rt_bwd_args *a, k3rt_error *err);
    /* Optional: a recurrent state carried across calls (state_in / state_out). */
    int (*state_layout)(void *self, int64_t batch, k3rt_state_layout *out, k3rt_error *err);
    /* Optional, with state_layout: context parallelism through affine state summaries.
     * cp_summary gives (m, b) of the span a->x: S_out = m S_in + b. */
    int (*cp_summary)(void *self, const k3rt_fwd_args *a, k3rt_tensor m, k3rt_tensor b,
                      k3rt_error *err);
    /* (m, b) = (m2, b2) after (m1, b1): m = m2 m1, b = m2 b1 + b2; outputs may alias inputs. */
    int (*cp_compose)(void *self, k3rt_stream *s, k3rt_tensor m1, k3rt_tensor b1,
                      k3rt_tensor m2, k3rt_tensor b2, k3rt_tensor m, k3rt_tensor b,
                      k3rt_error *err);
    /* Optional (ABI 2.0): one token per sequence, a->seq == 1, the cache carried in state_in
     * -> state_out (so it must fit state_layout). The engine decodes with it when decode_step
     * (ABI 2.2, below) is absent. */
    int (*decode)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
    /* Optional: what a span needs of earlier spans (x_prefix / kv_prefix). NULL: nothing but
     * the state (or, without state_layout, the plugin cannot split a sequence). */
    int (*context)(void *self, k3rt_context_needs *out);
    /* Optional, when context() gives kv_width > 0: this span's latent KV [B, T, kv_width], which
     * the engine gathers as the later spans' kv_prefix; and its backward: d_kv (the sum of what
     * the later spans returned) accumulates into the gradients and is added into a->dx. */
    int (*kv_project)(void *self, const k3rt_fwd_args *a, k3rt_tensor kv, k3rt_error *err);
    int (*kv_project_backward)(void *self, const k3rt_bwd_args *a, k3rt_tensor d_kv,
                               k3rt_error *err);
    /* ABI 2.2, optional, all three or none: incremental decoding. cache_create makes an empty
     * cache for a->batch sequences on the instance's device (KDA: the recurrent state and the
     * short conv's last inputs; MLA: the latent KV of every position so far), owned by the
     * plugin; decode_step runs one token per sequence through the layer, reading and extending
     * the cache (its y equals forward's at that position of the whole sequence, up to
     * rounding); cache_destroy frees it. Inference only: no saved activations, statistics or
     * gradients. Without them the engine decodes by running forward over the whole context. */
    int (*cache_create)(void *self, const k3rt_cache_args *a, void **cache, k3rt_error *err);
    int (*decode_step)(void *self, void *cache, const k3rt_decode_args *a, k3rt_error *err);
    void (*cache_destroy)(void *self, void *cache);
} k3rt_attention_vtable;

/* One call of an MoE's experts on the rows a rank holds (expert parallelism, below). */
typedef struct k3rt_expert_args {
    uint32_t struct_size;
    int32_t training;
    k3rt_stream *stream;
    int64_t rows;                 /* rows on this rank, grouped by local expert */
    int32_t first_expert;         /* this rank holds experts [first_expert, first_expert + n) */
    int32_t n_experts;
    k3rt_tensor offsets;          /* [n_experts + 1] i64 on the device: rows of local expert e */
    k3rt_tensor in;               /* [rows, width]: the dispatched rows */
    k3rt_tensor out;              /* [rows, width]: forward output, written */
    k3rt_tensor d_out;            /* backward: gradient of out */
    k3rt_tensor d_in;             /* backward: gradient of in, overwritten */
    const k3rt_tensor *params;    /* as in forward; an EXPERT_MATRIX is the local slice
                                     [n_experts, out, in] */
    const k3rt_tensor *grads;
    int32_t n_params;
    int32_t deterministic;
    void *const *saved;
    int32_t n_saved;
    int32_t reserved_;
    void *workspace;
    int64_t workspace_bytes;
} k3rt_expert_args;

/* Expert parallelism splits a routed MoE's forward where tokens leave for the ranks that hold
 * their experts. The engine calls, in order:
 *   dispatch(a, rows)        router, selection (a->routing) and the rows to send, [tokens *
 *                            top_k, row_width] in (token, slot) order
 *   (engine: sort by expert, all-to-all to the owning ranks)
 *   expert_forward(e)        the local experts on the rows received, grouped by expert
 *   (engine: all-to-all back, restore (token, slot) order)
 *   combine(a, rows)         the experts' rows -> y: the weighted sum over slots, and whatever
 *                            the plugin adds per token (shared experts, projections)
 * and for the backward combine_backward (dy -> d rows), expert_backward, dispatch_backward
 * (d rows -> dx). A plugin provides all seven functions or none; forward/backward remain the
 * single-rank path and must equal the composition. */
typedef struct k3rt_moe_vtable {
    uint32_t struct_size;
    int (*forward)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
    int (*backward)(void *self, const k3rt_bwd_args *a, k3rt_error *err);
    /* Routed experts and top-k; 0 experts for a dense FFN (no balancer is attached). */
    int (*experts)(void *self, int32_t *n_experts, int32_t *top_k);
    /* Optional, all or none: expert parallelism (above). */
    int (*row_width)(void *self, int64_t *width);
    int (*dispatch)(void *self, const k3rt_fwd_args *a, k3rt_tensor rows, k3rt_error *err);
    int (*expert_forward)(void *self, const k3rt_expert_args *a, k3rt_error *err);
    int (*combine)(void *self, const k3rt_fwd_args *a, k3rt_tensor rows, k3rt_error *err);
    int (*combine_backward)(void *self, const k3rt_bwd_args *a, k3rt_tensor d_rows,
                            k3rt_error *err);
    int (*expert_backward)(void *self, const k3rt_expert_args *a, k3rt_error *err);
    int (*dispatch_backward)(void *self, const k3rt_bwd_args *a, k3rt_tensor d_rows,
                             k3rt_error *err);
} k3rt_moe_vtable;

/* ---- Balancers ------------------------------------------------------------------------------------ */

typedef struct k3rt_balancer_vtable {
    uint32_t struct_size;
    /* Current selection bias [experts] f32 on the device (a view of balancer state). */
    int (*bias)(void *self, k3rt_tensor *out, k3rt_error *err);
    /* Accumulates one micro-batch's routing (training only). */
    int (*observe)(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err);
    /* Optional auxiliary loss of one micro-batch: *loss receives its value (already weighted);
     * d_scores [tokens, experts] f32 receives scale * d(loss)/d(scores). */
    int (*aux_loss)(void *self, k3rt_stream *s, const k3rt_routing *r, double scale,
                    double *loss, k3rt_tensor d_scores, k3rt_error *err);
    /* End of an optimizer step: combine statistics across the data-parallel group, update the
     * bias for the next step, clear the accumulators. */
    int (*update)(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err);
    /* ABI 2.1, optional: aux_loss without the host value, so a micro-batch on a GPU waits for
     * nothing: the loss (already weighted) is ADDED into loss_sum, one f64 on the stream's
     * device (host memory on a CPU stream), and d_scores is written as aux_loss writes it. The
     * engine prefers it to aux_loss and reads the sum once per step. */
    int (*aux_loss_add)(void *self, k3rt_stream *s, const k3rt_routing *r, double scale,
                        k3rt_tensor loss_sum, k3rt_tensor d_scores, k3rt_error *err);
} k3rt_balancer_vtable;

/* ---- Residuals ------------------------------------------------------------------------------------ */

/* The residual plugin forms each sublayer's input from earlier outputs and aggregates the
 * final output. One instance serves the whole model; sublayer s = 2*layer (mixer) or
 * 2*layer + 1 (FFN). The engine applies each sublayer's pre-norm to what mix() returns.
 *   forward:  begin(t = embedding) ; for s: mix(s, t = out) -> norm -> sublayer -> push(s, t = y)
 *             ; finish(t = out)
 *   backward: finish_backward(t = d out) ; for s descending: push_backward(s, t = dy out)
 *             -> sublayer and norm backward -> mix_backward(s, t = d input) ;
 *             begin_backward(t = d embedding, overwritten)
 * op_forward / op_backward evaluate one mixing operation in isolation (`k3rt op`): the input of
 * sublayer s from explicit sources and the current partial sum.
 * mix_backward also receives `sublayer_input`, what mix(s) wrote in the forward (the engine
 * keeps it for the pre-norm's backward): a residual whose mixing is not linear in its sources
 * recovers what it read from it instead of keeping a copy per sublayer.
 *
 * The pre-norm may be fused (optional, both or neither): mix_norm(s) does mix(s) into t and
 * also writes normed = RMSNorm(t) * norm_gain (eps norm_eps) and its rstd; the engine then
 * skips its own norm. mix_norm_backward(s) receives in t the gradient of `normed`, with
 * sublayer_input and rstd of the forward: it accumulates norm_gain_grad and does what
 * mix_backward does with the gradient of the sublayer input. */
typedef struct k3rt_residual_args {
    uint32_t struct_size;
    k3rt_stream *stream;
    int64_t batch, seq;
    int32_t sublayer;             /* 0 .. n_sublayers (n_sublayers: the output aggregation) */
    int32_t n_sublayers;
    k3rt_tensor t;                /* [B, T, d] the call's tensor (see above) */
    const k3rt_tensor *params;    /* all of the plugin's parameters, in declaration order */
    const k3rt_tensor *grads;     /* accumulate; NULL in forward calls */
    int32_t n_params;
    int32_t training;
    int32_t deterministic;
    int32_t n_saved;
    void *const *saved;           /* the whole model's forward, as memory() / saved() declared */
    void *workspace;
    int64_t workspace_bytes;
    /* op mode */
    const k3rt_tensor *sources;   /* [B, T, d] each */
    k3rt_tensor *d_sources;       /* op_backward: overwritten */
    int32_t n_sources;
    int32_t reserved_;
    k3rt_tensor partial;          /* [B, T, d]; ndim 0 when the op has no partial sum */
    k3rt_tensor d_partial;
    /* mix_backward and mix_norm_backward: the forward's mix(s) output [B, T, d] */
    k3rt_tensor sublayer_input;
    /* mix_norm / mix_norm_backward */
    k3rt_tensor norm_gain;        /* [d], compute dtype */
    k3rt_tensor norm_gain_grad;   /* [d], f32 under bf16 compute; accumulate */
    k3rt_tensor normed;           /* [B, T, d], written by mix_norm */
    k3rt_tensor rstd;             /* [B * T], f32 under bf16 compute: written / read */
    double norm_eps;
} k3rt_residual_args;

typedef struct k3rt_residual_vtable {
    uint32_t struct_size;
    int (*begin)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*mix)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*push)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*finish)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*finish_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*push_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*mix_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*begin_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*op_forward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*op_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    /* Optional, both or neither: the pre-norm fused (above). */
    int (*mix_norm)(void *self, const k3rt_residual_args *a, k3rt_error *err);
    int (*mix_norm_backward)(void *self, const k3rt_residual_args *a, k3rt_error *err);
} k3rt_residual_vtable;

/* ---- Optimizers ----------------------------------------------------------------------------------- */

typedef struct k3rt_optimizer_step {
    uint32_t struct_size;
    k3rt_stream *stream;
    k3rt_comm *comm;              /* data-parallel group; gradients are already averaged */
    double lr;                    /* scheduled learning rate of this step (finite, >= 0) */
    int64_t step;                 /* 1-based */
    const k3rt_param_ref *params; /* the same parameters, in the same order, as at create */
    int32_t n_params;
} k3rt_optimizer_step;

typedef struct k3rt_optimizer_vtable {
    uint32_t struct_size;
    int (*step)(void *self, const k3rt_optimizer_step *a, k3rt_error *err);
    /* One line naming the rule applied to parameter `index` ("muon per-head x8", "adamw"). */
    int (*describe)(void *self, int32_t index, char *buf, size_t len);
} k3rt_optimizer_vtable;

/* ---- The descriptor ------------------------------------------------------------------------------- */

typedef struct k3rt_plugin_descriptor {
    uint32_t struct_size;
    uint16_t abi_major;
    uint16_t abi_minor;
    const char *name;            /* the name recipes use: "kda", "quantile" */
    int32_t kind;                /* k3rt_kind */
    int32_t reserved_;
    const char *version;         /* the plugin's own version, "1.2.0" */
    const char *description;     /* one line */
    uint64_t caps;               /* K3RT_CAP_* */
    const k3rt_option *options;
    uint32_t n_options;
    uint32_t option_size;        /* sizeof(k3rt_option) as the plugin was built */
    const k3rt_instance_vtable *instance;
    const void *vtable;          /* the kind's vtable: k3rt_attention_vtable, ... */
} k3rt_plugin_descriptor;

typedef const k3rt_plugin_descriptor *(*k3rt_plugin_entry_fn)(void);

#define K3RT_PLUGIN_ENTRY_SYMBOL "k3rt_plugin_entry"

/* Defines the single exported entry of a plugin. */
#define K3RT_PLUGIN_EXPORT(descriptor)                                                      \
    __attribute__((visibility("default"))) const k3rt_plugin_descriptor *k3rt_plugin_entry(  \
        void);                                                                              \
    const k3rt_plugin_descriptor *k3rt_plugin_entry(void) { return &(descriptor); }

/* Host version, to compare with the compile-time macros. */
K3RT_API void k3rt_abi_version(int *major, int *minor);
K3RT_API const char *k3rt_version_string(void);
K3RT_API const char *k3rt_kind_name(int kind);  /* "attention", "moe", ... */
K3RT_API const char *k3rt_role_name(int role);  /* "matrix", "head_matrix", ... */

#ifdef __cplusplus
}
#endif
#endif
