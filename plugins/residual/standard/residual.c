/* The standard residual stream, forward and backward. With S sublayers and y_s the output of
 * sublayer s:
 *
 *   forward   h_0 = embedding ; x_s = h_s (the engine norms it) ; h_{s+1} = h_s + y_s ;
 *             out = h_S
 *   backward  dh_S = d out ; dy_s = dh_{s+1} ; dh_s = dh_{s+1} + dx_s ; d embedding = dh_0
 *
 * The pre-norm is fused (mix_norm): the forward norms h_s straight from the stream, and the
 * backward accumulates the norm's input gradient into dh in the same pass instead of the
 * engine writing it to a buffer that mix_backward then adds.
 *
 * h and dh ([B, T, d] each) live in `saved`, which the engine keeps for the whole model's
 * forward and backward: h at offset 0, dh right after it. Every call is one copy or one add
 * of B*T*d elements through k3rt_memcpy / k3rt_axpby on the call's stream, so the same code
 * runs on the CPU and on CUDA (where h and dh are device memory in the run's dtype).
 */
#include "standard.h"

enum { SLOT_H = 0, SLOT_DH = 1 };

/* The stream slot (h or dh) in the saved part. */
static void *slot(const standard_residual *r, const k3rt_residual_args *a, int which)
{
    return (char *)a->saved[0] + which * standard_activation_bytes(r, a->batch, a->seq);
}

/* slot <- t */
static int load(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    return k3rt_memcpy(a->stream, slot(r, a, which), r->device, a->t.data, r->device,
                       k3rt_tensor_bytes(&a->t), err);
}

/* t <- slot */
static int store(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    return k3rt_memcpy(a->stream, a->t.data, r->device, slot(r, a, which), r->device,
                       k3rt_tensor_bytes(&a->t), err);
}

/* slot += t */
static int add(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    return k3rt_axpby(a->stream, r->dtype, k3rt_tensor_numel(&a->t), 1.0, a->t.data, 1.0,
                      slot(r, a, which), err);
}

int standard_begin(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return load(self, a, SLOT_H, err);
}

int standard_mix(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return store(self, a, SLOT_H, err);
}

int standard_push(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return add(self, a, SLOT_H, err);
}

int standard_finish(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return store(self, a, SLOT_H, err);
}

int standard_finish_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return load(self, a, SLOT_DH, err);
}

int standard_push_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return store(self, a, SLOT_DH, err);
}

int standard_mix_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return add(self, a, SLOT_DH, err);
}

int standard_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return store(self, a, SLOT_DH, err);
}

/* t = h_s, normed = RMSNorm(h_s) * gain, rstd for the backward. */
int standard_mix_norm(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    const standard_residual *r = self;
    K3RT_TRY(store(self, a, SLOT_H, err));
    return k3rt_rmsnorm_fwd(a->stream, r->dtype, slot(r, a, SLOT_H), a->norm_gain.data,
                            a->normed.data, a->rstd.data, a->batch * a->seq, r->d, a->norm_eps,
                            err);
}

/* t = d normed: dh_s += RMSNorm'(h_s)^T t, gain gradient += (one pass). */
int standard_mix_norm_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    const standard_residual *r = self;
    return k3rt_rmsnorm_bwd(a->stream, r->dtype, a->sublayer_input.data, a->norm_gain.data,
                            a->rstd.data, a->t.data, slot(r, a, SLOT_DH),
                            a->norm_gain_grad.data, a->batch * a->seq, r->d, 1, err);
}

/* ---- one mixing op in isolation (`k3rt op`): t = sum_j sources[j] + partial ---------------- */

static int has_partial(const k3rt_tensor *p) { return p->ndim > 0; }

int standard_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    const standard_residual *r = self;
    int64_t n = k3rt_tensor_numel(&a->t);
    double keep = 0.0;  /* the first term overwrites t */
    for (int j = 0; j < a->n_sources; j++, keep = 1.0)
        K3RT_TRY(k3rt_axpby(a->stream, r->dtype, n, 1.0, a->sources[j].data, keep, a->t.data,
                            err));
    if (has_partial(&a->partial))
        K3RT_TRY(k3rt_axpby(a->stream, r->dtype, n, 1.0, a->partial.data, keep, a->t.data,
                            err));
    return K3RT_OK;
}

/* Every term has weight 1: each source and the partial sum receive t, the output gradient. */
int standard_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    const standard_residual *r = self;
    size_t bytes = k3rt_tensor_bytes(&a->t);
    for (int j = 0; j < a->n_sources; j++)
        K3RT_TRY(k3rt_memcpy(a->stream, a->d_sources[j].data, r->device, a->t.data, r->device,
                             bytes, err));
    if (has_partial(&a->d_partial))
        K3RT_TRY(k3rt_memcpy(a->stream, a->d_partial.data, r->device, a->t.data, r->device,
                             bytes, err));
    return K3RT_OK;
}
