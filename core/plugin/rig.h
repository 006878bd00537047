/* The instance rig: one live plugin instance and everything a call to it needs.
 *
 * The host side of the call contract (plugin.h: "arguments are validated by the host"). A rig
 * creates an instance after validating its configuration and refusing a device or dtype the
 * plugin's caps do not cover; holds the parameters it declared (bound views into the model's
 * buffers, or its own allocation for `k3rt op`, the checkers and the tests); sizes or binds
 * the saved parts and workspace of one (batch, seq) from the plugin's own memory() / saved();
 * and builds every call's arguments, checking device, dtype and shape of each tensor once
 * before the call. The model, `k3rt op`, `k3rt check-plugin`, the finite-difference checker
 * and the tests drive plugins only through it.
 *
 * Every error coming out of a call is prefixed with the instance's place
 * ("layers.3.mixer (kda): "). */
#ifndef K3RT_PLUGIN_RIG_H
#define K3RT_PLUGIN_RIG_H

#include <k3rt/plugin.h>

#include "plugin/registry.h"
#include "plugin/sinks.h"

enum { RIG_MAX_SAVED = 64 };

typedef struct rig {
    const plugin_entry *e;
    void *self;
    json_t *config;              /* validated config (a reference is held) */
    struct k3rt_param_sink decls;
    char where[128];             /* "layers.3.mixer (kda)" for messages */
    int kind, dtype, device, deterministic;
    int grad_dtype;              /* f32 under bf16 compute, else the compute dtype */
    k3rt_stream *stream;         /* the create stream: every call runs on it */
    int64_t d;                   /* d_model */
    int n_sublayers;             /* residual: 2 * n_layers */
    int32_t experts, top_k;      /* moe: routed experts (0: dense); balancer: of its layer */
    int n_refs;                  /* optimizer: parameters given at create */
    /* parameters, in declaration order (rig_bind_params or rig_alloc_params) */
    k3rt_tensor *params, *grads;
    int own_params;
    /* buffers of one (batch, seq) (rig_bind_shape or rig_alloc_shape) */
    int64_t B, T;
    k3rt_memory mem;
    int n_parts;                 /* the last rig_saved_parts */
    k3rt_saved_decl parts[RIG_MAX_SAVED];
    char part_names[RIG_MAX_SAVED][64];
    int n_saved;                 /* the bound shape's parts */
    void *saved[RIG_MAX_SAVED];
    int64_t saved_bytes[RIG_MAX_SAVED];
    void *saved_block, *ws;      /* the parts back to back; the workspace */
    int own_buffers, guard;
    k3rt_state_layout state;     /* attention with state_layout: shapes at B (device set) */
} rig;

/* Validates a copy of config against the plugin's options, refuses a device / dtype outside
 * its caps, creates the instance and collects its parameter declarations; a routed MoE's
 * experts() is read and checked. args->config is replaced by the validated copy, args->kind
 * by the plugin's. */
int rig_create(rig *r, const plugin_entry *e, const json_t *config, const k3rt_create_args *args,
               const char *where, k3rt_error *err);
void rig_destroy(rig *r);

static inline int rig_n_params(const rig *r) { return r->decls.n; }
static inline const k3rt_param_decl *rig_param(const rig *r, int i)
{
    return &r->decls.items[i].decl;
}

/* Prefixes err with the instance's place; returns rc (for `return rig_fail(r, rc, err)`). */
int rig_fail(const rig *r, int rc, k3rt_error *err);

/* ---- parameters --------------------------------------------------------------------------- */

/* Views in declaration order owned by the caller (the model): each is checked against its
 * declaration (shape, the compute dtype / grad dtype, the instance's device, data). */
int rig_bind_params(rig *r, k3rt_tensor *params, k3rt_tensor *grads, k3rt_error *err);
/* The rig's own zeroed parameters and gradients on the instance's device. */
int rig_alloc_params(rig *r, k3rt_error *err);
/* Fills host tensor t (f32/f64) per declaration i's init; the generator is seeded from
 * (seed, full_name) so a parameter's values do not depend on creation order or rank. */
int rig_init_param(rig *r, int i, k3rt_tensor t, uint64_t seed, const char *full_name,
                   k3rt_error *err);
/* The same for any declaration; owner (may be NULL) serves K3RT_INIT_PLUGIN. */
int param_init_values(const k3rt_param_decl *d, k3rt_tensor t, uint64_t seed,
                      const char *full_name, rig *owner, k3rt_error *err);

/* ---- sizes and buffers -------------------------------------------------------------------- */

/* Zero-extended results of the optional instance functions (zeros when not provided). */
int rig_memory(rig *r, int64_t batch, int64_t seq, k3rt_memory *out, k3rt_error *err);
int rig_flops(rig *r, int64_t batch, int64_t seq, k3rt_flops *out, k3rt_error *err);
/* The saved parts at (batch, seq), the plugin's saved() or the one raw part of memory(),
 * into r->parts / r->n_parts (names held by the rig). */
int rig_saved_parts(rig *r, int64_t batch, int64_t seq, k3rt_error *err);
/* Bytes of the parts laid back to back on 64-byte boundaries (what rig_bind_shape takes). */
int rig_saved_total(rig *r, int64_t batch, int64_t seq, int64_t *bytes, k3rt_error *err);
/* Binds caller-owned buffers for calls at (batch, seq): saved holds the parts back to back
 * (rig_saved_total bytes), ws at least memory().workspace_bytes. */
int rig_bind_shape(rig *r, int64_t batch, int64_t seq, void *saved, int64_t saved_bytes,
                   void *ws, int64_t ws_bytes, k3rt_error *err);
/* saved NULL with saved_bytes RIG_SAVED_POINTED: the parts have no block; the caller (the
 * activation manager, model/actman.h) points each with rig_point_saved before every call. */
#define RIG_SAVED_POINTED (-1)
void rig_point_saved(rig *r, int i, void *p);
/* Allocates them on the instance's device; with guard (CPU only), 64 canary bytes follow each
 * buffer and rig_guards_ok tells whether a call wrote past its end. */
int rig_alloc_shape(rig *r, int64_t batch, int64_t seq, int guard, k3rt_error *err);
int rig_guards_ok(const rig *r);
/* Forgets (and frees, when the rig allocated them) the buffers of the current shape. */
void rig_unbind_shape(rig *r);
/* Fills the saved parts and the workspace with byte `value` (poison before a check). */
int rig_fill_buffers(rig *r, int value, k3rt_error *err);

/* ---- state and statistics ----------------------------------------------------------------- */

/* Collects state() or stats() tensors (the sink must be freed with tensor_sink_free). */
int rig_state(rig *r, struct k3rt_tensor_sink *sink, k3rt_error *err);
int rig_state_loaded(rig *r, k3rt_error *err);
int rig_stats(rig *r, struct k3rt_tensor_sink *sink, k3rt_error *err);
void rig_reset_stats(rig *r);

/* ---- calls -------------------------------------------------------------------------------- */

/* Attention and MoE. The caller sets the tensors it owns (x, y, training, state, bias,
 * routing, doc_offsets, prefixes; dy, dx, d_state_*, d_scores); the rig sets the rest
 * (struct_size, stream, batch, seq, params, grads, saved, workspace, deterministic), checks
 * everything and calls the plugin. A routed MoE's routing is checked after its forward. */
int rig_forward(rig *r, k3rt_fwd_args *a, k3rt_error *err);
int rig_backward(rig *r, k3rt_bwd_args *a, k3rt_error *err);
int rig_decode(rig *r, k3rt_fwd_args *a, k3rt_error *err);
int rig_cp_summary(rig *r, k3rt_fwd_args *a, k3rt_tensor m, k3rt_tensor b, k3rt_error *err);
int rig_cp_compose(rig *r, k3rt_tensor m1, k3rt_tensor b1, k3rt_tensor m2, k3rt_tensor b2,
                   k3rt_tensor m, k3rt_tensor b, k3rt_error *err);
/* Context-parallel needs (zeros when context() is absent). */
int rig_context(rig *r, k3rt_context_needs *out, k3rt_error *err);

/* Incremental decoding of a token mixer. The cache of `batch` sequences is the plugin's own
 * (cache_create / decode_step, ABI 2.2) or, for a plugin with only the ABI 2.0 decode(), two
 * state tensors of its state_layout that the steps use in turn (decode() needs the rig bound at
 * (batch, 1)). pos counts the tokens each sequence has been given. */
typedef struct rig_cache {
    void *plugin;                /* decode_step: the plugin's cache */
    void *state[2];              /* decode(): the state before and after a step (device memory) */
    int cur;                     /* which of state[] holds the state so far */
    int64_t B, pos;
} rig_cache;
/* 1 when the mixer decodes incrementally (decode_step or decode). */
int rig_can_decode(const rig *r);
int rig_cache_create(rig *r, int64_t batch, int64_t capacity, rig_cache *c, k3rt_error *err);
/* One token per sequence: x, y [B, 1, d] of the compute dtype on the instance's device. */
int rig_decode_step(rig *r, rig_cache *c, k3rt_tensor x, k3rt_tensor y, k3rt_error *err);
void rig_cache_destroy(rig *r, rig_cache *c);

/* Residual calls by name. */
typedef enum rig_residual_call {
    RIG_BEGIN, RIG_MIX, RIG_PUSH, RIG_FINISH, RIG_FINISH_BACKWARD, RIG_PUSH_BACKWARD,
    RIG_MIX_BACKWARD, RIG_BEGIN_BACKWARD, RIG_OP_FORWARD, RIG_OP_BACKWARD, RIG_MIX_NORM,
    RIG_MIX_NORM_BACKWARD, RIG_RESIDUAL_CALLS_
} rig_residual_call;
/* 1 when the plugin provides the call (the optional ones: op_*, mix_norm*). */
int rig_has_residual(const rig *r, rig_residual_call call);
/* The caller sets sublayer, t and the op / mix_norm tensors; the rig the rest. */
int rig_residual(rig *r, rig_residual_call call, k3rt_residual_args *a, k3rt_error *err);

/* Balancer calls. */
/* 1 when the balancer adds an auxiliary loss (it provides aux_loss or aux_loss_add). */
int rig_has_aux_loss(const rig *r);
int rig_bias(rig *r, k3rt_tensor *out, k3rt_error *err);
int rig_observe(rig *r, const k3rt_routing *routing, k3rt_error *err);
int rig_aux_loss(rig *r, const k3rt_routing *routing, double scale, double *loss,
                 k3rt_tensor d_scores, k3rt_error *err);
/* The loss added into loss_sum (f64 [1] on the rig's device) by aux_loss_add, nothing read
 * back; a balancer with only aux_loss adds its host value into *host_sum instead. */
int rig_aux_loss_add(rig *r, const k3rt_routing *routing, double scale, k3rt_tensor loss_sum,
                     double *host_sum, k3rt_tensor d_scores, k3rt_error *err);
int rig_update(rig *r, k3rt_comm *dp, int64_t step, k3rt_error *err);

/* Optimizer calls; the parameters must be the ones given at create. */
int rig_step(rig *r, k3rt_comm *comm, double lr, int64_t step, const k3rt_param_ref *params,
             int n_params, k3rt_error *err);
int rig_describe(rig *r, int index, char *buf, size_t len);
/* One parameter of an optimizer: weights and gradient of the instance's dtype and device in
 * the declared shape, max logits only for QK-clip parameters. */
int rig_check_ref(const rig *r, const k3rt_param_ref *p, int i, k3rt_error *err);

/* Checks one tensor: present, dtype, shape (entries < 0 are wildcards), on the instance's
 * device. `what` names it in the message ("forward: x"). */
int rig_expect(const rig *r, const k3rt_tensor *t, const char *what, int dtype, int ndim,
               const int64_t *shape, k3rt_error *err);

#endif
