/* The standard residual stream, forward and backward. With S sublayers and y_s the output of
 * sublayer s:
 *
 *   forward   h_0 = embedding ; x_s = h_s (the engine norms it) ; h_{s+1} = h_s + y_s ;
 *             out = h_S
 *   backward  dh_S = d out ; dy_s = dh_{s+1} ; dh_s = dh_{s+1} + dx_s ; d embedding = dh_0
 *
 * h and dh ([B, T, d] each) live in `saved`, which the engine keeps for the whole model's
 * forward and backward: h at offset 0, dh right after it. Every call is one copy or one add
 * of B*T*d elements through k3rt_memcpy / k3rt_axpby on the call's stream, so the same code
 * runs on the CPU and on CUDA (where h and dh are device memory in the run's dtype).
 */
#include "standard.h"

#include <stdio.h>

enum { SLOT_H = 0, SLOT_DH = 1 };

static int on_device(const standard_residual *r, int device, const char *what, k3rt_error *err)
{
    if (device == r->device)
        return K3RT_OK;
    char have[32], want[32];
    return k3rt_fail(err, K3RT_ERR_INVALID, "%s: on %s, but the instance runs on %s", what,
                     k3rt_device_str(device, have, sizeof have),
                     k3rt_device_str(r->device, want, sizeof want));
}

/* A [B, T, d] tensor of the run's dtype on the instance's device (a host pointer handed to a
 * CUDA kernel, or the reverse, would fault instead of failing). */
static int check_t(const standard_residual *r, const k3rt_residual_args *a, const k3rt_tensor *t,
                   const char *what, k3rt_error *err)
{
    const int64_t shape[3] = {a->batch, a->seq, r->d};
    K3RT_TRY(k3rt_tensor_expect(t, what, r->dtype, 3, shape, err));
    return on_device(r, t->device, what, err);
}

/* The stream slot (h or dh) in saved, after checking the call's tensor and buffer. */
static int slot(const standard_residual *r, const k3rt_residual_args *a, int which, void **out,
                k3rt_error *err)
{
    K3RT_TRY(on_device(r, k3rt_stream_device(a->stream), "standard residual stream", err));
    K3RT_TRY(check_t(r, a, &a->t, "standard residual t", err));
    int64_t bytes = standard_stream_bytes(r, a->batch, a->seq);
    if (!a->saved || a->saved_bytes < 2 * bytes)
        return k3rt_fail(err, K3RT_ERR_INVALID, "standard residual: saved buffer of %lld bytes, "
                         "need %lld (see memory())", (long long)(a->saved ? a->saved_bytes : 0),
                         (long long)(2 * bytes));
    *out = (char *)a->saved + which * bytes;
    return K3RT_OK;
}

/* slot <- t */
static int load(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    void *p;
    K3RT_TRY(slot(r, a, which, &p, err));
    return k3rt_memcpy(a->stream, p, r->device, a->t.data, r->device,
                       k3rt_tensor_bytes(&a->t), err);
}

/* t <- slot */
static int store(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    void *p;
    K3RT_TRY(slot(r, a, which, &p, err));
    return k3rt_memcpy(a->stream, a->t.data, r->device, p, r->device,
                       k3rt_tensor_bytes(&a->t), err);
}

/* slot += t */
static int add(void *self, const k3rt_residual_args *a, int which, k3rt_error *err)
{
    const standard_residual *r = self;
    void *p;
    K3RT_TRY(slot(r, a, which, &p, err));
    return k3rt_axpby(a->stream, r->dtype, k3rt_tensor_numel(&a->t), 1.0, a->t.data, 1.0, p,
                      err);
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

/* ---- one mixing op in isolation (`k3rt op`): t = sum_j sources[j] + partial ---------------- */

static int has_partial(const k3rt_tensor *p) { return p->ndim > 0; }

static int check_op(const standard_residual *r, const k3rt_residual_args *a,
                    const k3rt_tensor *sources, const k3rt_tensor *partial, k3rt_error *err)
{
    K3RT_TRY(on_device(r, k3rt_stream_device(a->stream), "standard residual stream", err));
    K3RT_TRY(check_t(r, a, &a->t, "standard residual t", err));
    if (a->n_sources < 0 || (a->n_sources > 0 && !sources))
        return k3rt_fail(err, K3RT_ERR_INVALID, "standard residual: %d sources given without "
                         "tensors", a->n_sources);
    if (a->n_sources == 0 && !has_partial(partial))
        return k3rt_fail(err, K3RT_ERR_INVALID, "standard residual: the op needs at least one "
                         "source or a partial sum");
    for (int j = 0; j < a->n_sources; j++) {
        char what[64];
        snprintf(what, sizeof what, "standard residual sources.%d", j);
        K3RT_TRY(check_t(r, a, &sources[j], what, err));
    }
    if (has_partial(partial))
        K3RT_TRY(check_t(r, a, partial, "standard residual partial", err));
    return K3RT_OK;
}

int standard_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    const standard_residual *r = self;
    K3RT_TRY(check_op(r, a, a->sources, &a->partial, err));
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
    K3RT_TRY(check_op(r, a, a->d_sources, &a->d_partial, err));
    size_t bytes = k3rt_tensor_bytes(&a->t);
    for (int j = 0; j < a->n_sources; j++)
        K3RT_TRY(k3rt_memcpy(a->stream, a->d_sources[j].data, r->device, a->t.data, r->device,
                             bytes, err));
    if (has_partial(&a->d_partial))
        K3RT_TRY(k3rt_memcpy(a->stream, a->d_partial.data, r->device, a->t.data, r->device,
                             bytes, err));
    return K3RT_OK;
}
