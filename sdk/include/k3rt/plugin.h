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
 * Memory: the engine owns parameters, gradients, saved activations and workspaces and passes
 * views; a plugin owns its instance (create/destroy) and any state it allocates (optimizer
 * moments, balancer bias) with k3rt_alloc on the run's device. Streams: every call receives
 * the stream it must enqueue on; CPU streams run inline. Threads: an instance is used by one
 * thread at a time (one instance per rank and layer); CPU plugins parallelise internally with
 * k3rt_parallel_for. Errors: return a k3rt_status and fill err; never abort or exit.
 *
 * Shapes: activations are [B, T, d] row-major; linear weights are [out, in].
 */
#ifndef K3RT_PLUGIN_H
#define K3RT_PLUGIN_H

#include <stdint.h>
#include <stddef.h>
#include <jansson.h>
#include "errors.h"
#include "tensor.h"
#include "stream.h"
#include "comm.h"
#include "random.h"
#include "config.h"

#ifdef __cplusplus
extern "C" {
#endif

#define K3RT_ABI_MAJOR 1
#define K3RT_ABI_MINOR 0

/* ---- Kinds and capabilities ------------------------------------------------------------------ */

typedef enum k3rt_kind {
    K3RT_KIND_ATTENTION = 1, /* token mixer */
    K3RT_KIND_MOE = 2,       /* FFN: dense or mixture of experts */
    K3RT_KIND_BALANCER = 3,
    K3RT_KIND_OPTIMIZER = 4,
    K3RT_KIND_RESIDUAL = 5,
    K3RT_KIND_COUNT_ = 6
} k3rt_kind;

enum {
    K3RT_CAP_CPU = 1u << 0,              /* has a CPU implementation (f32) */
    K3RT_CAP_CUDA = 1u << 1,             /* has a CUDA implementation */
    K3RT_CAP_F64 = 1u << 2,              /* CPU implementation also in double (tests) */
    K3RT_CAP_DETERMINISTIC = 1u << 3,    /* bitwise reproducible given the same inputs */
    K3RT_CAP_CONTEXT_PARALLEL = 1u << 4, /* attention: cp_summary / cp_compose */
    K3RT_CAP_DECODE = 1u << 5,           /* attention: decode step */
    K3RT_CAP_STATE = 1u << 6,            /* attention: recurrent state in/out */
    K3RT_CAP_AUX_LOSS = 1u << 7          /* balancer: adds a loss term */
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

/* Called from declare_params(); the decl is copied. */
K3RT_API int k3rt_param_sink_add(k3rt_param_sink *sink, const k3rt_param_decl *decl,
                                 k3rt_error *err);

/* How ranks combine a statistic: */
enum { K3RT_STAT_LOCAL = -1 }; /* or a k3rt_reduce_op (SUM, MAX, MIN, AVG) */

/* Called from state() and stats(): name is relative ("m", "counts"); the engine prefixes the
 * owner. For state() the tensor is the live storage: the host reads it to save and writes it
 * to load (then calls state_loaded). `reduce` is K3RT_STAT_LOCAL or a k3rt_reduce_op. */
K3RT_API int k3rt_tensor_sink_add(k3rt_tensor_sink *sink, const char *name, k3rt_tensor t,
                                  int reduce, k3rt_error *err);

/* ---- Arguments shared by all kinds -------------------------------------------------------------- */

typedef struct k3rt_param_ref {
    uint32_t struct_size;
    int32_t index;
    const char *name;              /* full name, e.g. "layers.3.mixer.q_proj.weight" */
    const k3rt_param_decl *decl;
    k3rt_tensor param;             /* master weights (f32; f64 in tests) */
    k3rt_tensor grad;              /* same shape and dtype */
    k3rt_tensor head_max_logit;    /* [heads] f32 host, for qk_clip params; ndim 0 otherwise */
} k3rt_param_ref;

typedef struct k3rt_create_args {
    uint32_t struct_size;
    int32_t kind;
    const json_t *config;          /* validated against the descriptor's options, defaults filled */
    int32_t dtype;                 /* compute dtype of the run (K3RT_F32, K3RT_F64, K3RT_BF16) */
    int32_t device;                /* K3RT_DEVICE_CPU or a CUDA ordinal */
    int64_t d_model;
    int64_t vocab;
    int32_t n_layers;
    int32_t layer;                 /* attention/moe: this instance's layer; -1 model-level */
    int32_t n_experts, top_k;      /* balancer: of the MoE layer it serves */
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
    int64_t saved_bytes;      /* activations kept from forward to backward, per call */
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
} k3rt_instance_vtable;

/* ---- Token mixers (attention) and FFNs (moe) ------------------------------------------------ */

typedef struct k3rt_routing {
    uint32_t struct_size;
    int64_t batch, seq;     /* tokens = batch * seq, in [B, T] order */
    int32_t experts, top_k;
    k3rt_tensor scores;     /* [tokens, experts] f32 router scores before the bias */
    k3rt_tensor selected;   /* [tokens, top_k] i32 chosen experts */
    k3rt_tensor counts;     /* [experts] i64, HOST: tokens routed to each expert */
    k3rt_tensor bias;       /* [experts] f32: the selection bias that was used */
} k3rt_routing;

typedef struct k3rt_fwd_args {
    uint32_t struct_size;
    int32_t training;             /* 1: backward follows with the same saved buffer */
    k3rt_stream *stream;
    int64_t batch, seq;
    k3rt_tensor x;                /* [B, T, d] */
    k3rt_tensor y;                /* [B, T, d], written */
    const k3rt_tensor *params;    /* in declaration order */
    int32_t n_params;
    int32_t deterministic;
    void *saved;                  /* memory().saved_bytes, kept until backward */
    int64_t saved_bytes;
    void *workspace;
    int64_t workspace_bytes;
    /* attention */
    k3rt_tensor state_in;         /* optional initial recurrent state (K3RT_CAP_STATE) */
    k3rt_tensor state_out;        /* optional: receives the final state */
    /* moe */
    k3rt_tensor bias;             /* [experts] f32 selection bias; ndim 0 means zero */
    k3rt_routing *routing;        /* out: views valid until the backward (or the next forward) */
} k3rt_fwd_args;

typedef struct k3rt_bwd_args {
    uint32_t struct_size;
    k3rt_stream *stream;
    int64_t batch, seq;
    k3rt_tensor x;                /* the forward's input */
    k3rt_tensor dy;               /* [B, T, d] */
    k3rt_tensor dx;               /* [B, T, d], overwritten */
    const k3rt_tensor *params;
    const k3rt_tensor *grads;     /* accumulate */
    int32_t n_params;
    int32_t deterministic;
    void *saved;
    int64_t saved_bytes;
    void *workspace;
    int64_t workspace_bytes;
    /* attention */
    k3rt_tensor state_in;         /* as given to the forward */
    k3rt_tensor d_state_out;      /* optional gradient arriving at the final state */
    k3rt_tensor d_state_in;       /* optional: receives the gradient of the initial state */
    /* moe */
    k3rt_tensor d_scores;         /* optional [tokens, experts] f32 extra gradient of the router
                                     scores (a balancer's auxiliary loss) */
} k3rt_bwd_args;

/* Shapes (data NULL) of an attention plugin's recurrent state and context-parallel summary. */
typedef struct k3rt_state_layout {
    uint32_t struct_size;
    k3rt_tensor state;      /* e.g. KDA: [B, HV, dk, dv] */
    k3rt_tensor summary_m;  /* affine summary S_out = M S_in + B: M, e.g. [B, HV, dk, dk] */
    k3rt_tensor summary_b;  /* B, e.g. [B, HV, dk, dv] */
} k3rt_state_layout;

typedef struct k3rt_attention_vtable {
    uint32_t struct_size;
    int (*forward)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
    int (*backward)(void *self, const k3rt_bwd_args *a, k3rt_error *err);
    /* Optional (K3RT_CAP_STATE / CONTEXT_PARALLEL / DECODE). */
    int (*state_layout)(void *self, int64_t batch, k3rt_state_layout *out, k3rt_error *err);
    /* Affine summary (m, b) of the span a->x: S_out = m S_in + b. */
    int (*cp_summary)(void *self, const k3rt_fwd_args *a, k3rt_tensor m, k3rt_tensor b,
                      k3rt_error *err);
    /* (m, b) = (m2, b2) after (m1, b1): m = m2 m1, b = m2 b1 + b2. */
    int (*cp_compose)(void *self, k3rt_stream *s, k3rt_tensor m1, k3rt_tensor b1,
                      k3rt_tensor m2, k3rt_tensor b2, k3rt_tensor m, k3rt_tensor b,
                      k3rt_error *err);
    /* One token per sequence: a->seq == 1; state_in -> state_out carries the cache. */
    int (*decode)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
} k3rt_attention_vtable;

typedef struct k3rt_moe_vtable {
    uint32_t struct_size;
    int (*forward)(void *self, const k3rt_fwd_args *a, k3rt_error *err);
    int (*backward)(void *self, const k3rt_bwd_args *a, k3rt_error *err);
    /* Routed experts and top-k; 0 experts for a dense FFN (no balancer is attached). */
    int (*experts)(void *self, int32_t *n_experts, int32_t *top_k);
} k3rt_moe_vtable;

/* ---- Balancers ------------------------------------------------------------------------------------ */

typedef struct k3rt_balancer_vtable {
    uint32_t struct_size;
    /* Current selection bias [experts] f32 on the run's device (a view of balancer state). */
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
 * recovers what it read from it instead of keeping a copy per sublayer. A plugin reads the
 * field only when a->struct_size covers it. */
typedef struct k3rt_residual_args {
    uint32_t struct_size;
    k3rt_stream *stream;
    int64_t batch, seq;
    int32_t sublayer;
    int32_t n_sublayers;
    k3rt_tensor t;                /* [B, T, d] the call's tensor (see above) */
    const k3rt_tensor *params;    /* all of the plugin's parameters, in declaration order */
    const k3rt_tensor *grads;     /* accumulate; NULL in forward calls */
    int32_t n_params;
    int32_t training;
    int32_t deterministic;
    int32_t reserved_;
    void *saved;                  /* memory().saved_bytes for the whole model's forward */
    int64_t saved_bytes;
    void *workspace;
    int64_t workspace_bytes;
    /* op mode */
    const k3rt_tensor *sources;   /* [B, T, d] each */
    k3rt_tensor *d_sources;       /* op_backward: overwritten */
    int32_t n_sources;
    int32_t reserved2_;
    k3rt_tensor partial;          /* [B, T, d]; ndim 0 when the op has no partial sum */
    k3rt_tensor d_partial;
    /* mix_backward: the forward's mix(s) output [B, T, d]; ndim 0 when not given */
    k3rt_tensor sublayer_input;
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
    /* Statistics image: mean depth-attention weight per (sublayer, source); may be NULL. */
} k3rt_residual_vtable;

/* ---- Optimizers ----------------------------------------------------------------------------------- */

typedef struct k3rt_optimizer_step {
    uint32_t struct_size;
    k3rt_stream *stream;
    k3rt_comm *comm;              /* data-parallel group; gradients are already averaged */
    double lr;                    /* scheduled learning rate of this step */
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
