/* dense_glu forward and backward, the llm.c way. With N = B*T tokens, d = d_model, H = hidden:
 *
 *   x  [N, d]        Wg, Wu [H, d]        Wd [d, H]
 *   g = x Wg^T       [N, H]   saved (training)
 *   u = x Wu^T       [N, H]   saved (training)
 *   a = glu(g, u)    [N, H]   saved (training): on the CPU the SiTU transcendentals cost
 *                             several GEMMs' time, so the backward does not recompute it
 *   y = a Wd^T       [N, d]
 *
 * Every product is a k3rt_linear_fwd/bwd call and the GLU is the core op shared with
 * latent_moe; those ops run on the stream's device (CPU or CUDA) in the instance's dtype, so
 * this file is device- and dtype-agnostic: buffers are addressed in bytes and never touched
 * from the host. Under bf16 the activations, g, u, a and their gradients are bf16 and the
 * parameter gradients f32 (k3rt/ops.h). Inference (training == 0) keeps g, u, a in the
 * workspace instead.
 */
#include "dense_glu.h"

#include <stdio.h>

/* t has the dtype and shape, and lives on the instance's device: a host pointer handed to a
 * CUDA kernel (or the reverse) would fault instead of failing. */
static int expect(const dense_glu *f, const k3rt_tensor *t, const char *what, int dtype,
                  int ndim, const int64_t *shape, k3rt_error *err)
{
    K3RT_TRY(k3rt_tensor_expect(t, what, dtype, ndim, shape, err));
    if (t->device != f->device) {
        char have[32], want[32];
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: on %s, but the instance runs on %s", what,
                         k3rt_device_str(t->device, have, sizeof have),
                         k3rt_device_str(f->device, want, sizeof want));
    }
    return K3RT_OK;
}

static const char *const param_names[GLU_N_PARAMS] = {"gate_proj.weight", "up_proj.weight",
                                                      "down_proj.weight"};

/* The parameters, or (grads != 0) their gradients. */
static int check_params(const dense_glu *f, const k3rt_tensor *t, int32_t n, int grads,
                        k3rt_error *err)
{
    if (n != GLU_N_PARAMS || !t)
        return k3rt_fail(err, K3RT_ERR_INVALID, "dense_glu: expected %d %s, got %d",
                         GLU_N_PARAMS, grads ? "gradients" : "parameters", t ? n : 0);
    const int64_t in_shape[2] = {f->hidden, f->d}, out_shape[2] = {f->d, f->hidden};
    for (int i = 0; i < GLU_N_PARAMS; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s%s", grads ? "gradient of " : "", param_names[i]);
        K3RT_TRY(expect(f, &t[i], what, grads ? f->grad_dtype : f->dtype, 2,
                        i == GLU_DOWN ? out_shape : in_shape, err));
    }
    return K3RT_OK;
}

static int check_shapes(const dense_glu *f, k3rt_stream *s, const k3rt_tensor *x,
                        const k3rt_tensor *out, const char *out_name, const k3rt_tensor *params,
                        int32_t n_params, int64_t B, int64_t T, k3rt_error *err)
{
    if (k3rt_stream_device(s) != f->device) {
        char have[32], want[32];
        return k3rt_fail(err, K3RT_ERR_INVALID, "dense_glu: called with a stream of %s, but "
                         "the instance runs on %s",
                         k3rt_device_str(k3rt_stream_device(s), have, sizeof have),
                         k3rt_device_str(f->device, want, sizeof want));
    }
    const int64_t act[3] = {B, T, f->d};
    K3RT_TRY(expect(f, x, "dense_glu x", f->dtype, 3, act, err));
    K3RT_TRY(expect(f, out, out_name, f->dtype, 3, act, err));
    return check_params(f, params, n_params, 0, err);
}

static int check_bytes(const char *what, const void *p, int64_t have, int64_t need,
                       k3rt_error *err)
{
    if (!p || have < need)
        return k3rt_fail(err, K3RT_ERR_INVALID, "dense_glu: %s buffer of %lld bytes, need %lld "
                         "(see memory())", what, (long long)(p ? have : 0), (long long)need);
    return K3RT_OK;
}

int dense_glu_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const dense_glu *f = self;
    K3RT_TRY(check_shapes(f, a->stream, &a->x, &a->y, "dense_glu y", a->params, a->n_params,
                          a->batch, a->seq, err));
    int64_t N = a->batch * a->seq, d = f->d, H = f->hidden;
    int64_t hb = dense_glu_hidden_bytes(f, a->batch, a->seq);
    char *g;
    if (a->training) {
        K3RT_TRY(check_bytes("saved", a->saved, a->saved_bytes, 3 * hb, err));
        g = a->saved;
    } else {
        K3RT_TRY(check_bytes("workspace", a->workspace, a->workspace_bytes, 3 * hb, err));
        g = a->workspace;
    }
    char *u = g + hb, *act = g + 2 * hb;
    k3rt_stream *s = a->stream;
    int dt = f->dtype;
    K3RT_TRY(k3rt_linear_fwd(s, dt, a->x.data, a->params[GLU_GATE].data, NULL, g, N, d, H, err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, a->x.data, a->params[GLU_UP].data, NULL, u, N, d, H, err));
    K3RT_TRY(k3rt_glu_fwd(s, dt, f->glu, g, u, act, N * H, f->beta1, f->beta2, err));
    return k3rt_linear_fwd(s, dt, act, a->params[GLU_DOWN].data, NULL, a->y.data, N, H, d, err);
}

/* dWd += dy^T a ; da = dy Wd ; (dg, du) = glu'(g, u) da ;
 * dWg += dg^T x ; dWu += du^T x ; dx = dg Wg + du Wu */
int dense_glu_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    const dense_glu *f = self;
    K3RT_TRY(check_shapes(f, a->stream, &a->x, &a->dy, "dense_glu dy", a->params, a->n_params,
                          a->batch, a->seq, err));
    const int64_t shape[3] = {a->batch, a->seq, f->d};
    K3RT_TRY(expect(f, &a->dx, "dense_glu dx", f->dtype, 3, shape, err));
    K3RT_TRY(check_params(f, a->grads, a->n_params, 1, err));
    int64_t N = a->batch * a->seq, d = f->d, H = f->hidden;
    int64_t hb = dense_glu_hidden_bytes(f, a->batch, a->seq);
    K3RT_TRY(check_bytes("saved", a->saved, a->saved_bytes, 3 * hb, err));
    K3RT_TRY(check_bytes("workspace", a->workspace, a->workspace_bytes, 3 * hb, err));
    const char *g = a->saved, *u = g + hb, *act = g + 2 * hb;
    char *da = a->workspace, *dg = da + hb, *du = da + 2 * hb;
    const void *wg = a->params[GLU_GATE].data, *wu = a->params[GLU_UP].data;
    const void *wd = a->params[GLU_DOWN].data;
    k3rt_stream *s = a->stream;
    int dt = f->dtype;

    K3RT_TRY(k3rt_linear_bwd(s, dt, act, wd, a->dy.data, da, a->grads[GLU_DOWN].data, NULL, N,
                             H, d, 0, err));
    K3RT_TRY(k3rt_glu_bwd(s, dt, f->glu, g, u, da, dg, du, N * H, f->beta1, f->beta2, err));
    K3RT_TRY(k3rt_linear_bwd(s, dt, a->x.data, wg, dg, a->dx.data, a->grads[GLU_GATE].data,
                             NULL, N, d, H, 0, err));
    return k3rt_linear_bwd(s, dt, a->x.data, wu, du, a->dx.data, a->grads[GLU_UP].data, NULL,
                           N, d, H, 1, err);
}
