/* dense_glu forward and backward, the llm.c way. With N = B*T tokens, d = d_model, H = hidden:
 *
 *   x  [N, d]        Wg, Wu [H, d]        Wd [d, H]
 *   g = x Wg^T       [N, H]   saved (training)
 *   u = x Wu^T       [N, H]   saved (training)
 *   a = glu(g, u)    [N, H]   saved (training): on the CPU the SiTU transcendentals cost
 *                             several GEMMs' time, so the backward does not recompute it;
 *                             read back only by dWd += dy^T a, so it may be stored in fp8
 *   y = a Wd^T       [N, d]
 *
 * Every product is a k3rt_linear_fwd/bwd call and the GLU is the core op shared with
 * latent_moe; those ops run on the stream's device (CPU or CUDA) in the instance's dtype, so
 * this file is device- and dtype-agnostic: buffers are addressed in bytes and never touched
 * from the host. Under bf16 the activations, g, u, a and their gradients are bf16 and the
 * parameter gradients f32 (k3rt/ops.h).
 */
#include "dense_glu.h"

int dense_glu_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const dense_glu *f = self;
    int64_t N = a->batch * a->seq, d = f->d, H = f->hidden;
    char *g = a->saved[GLU_SAVED_G], *u = a->saved[GLU_SAVED_U], *act = a->saved[GLU_SAVED_A];
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
    int64_t N = a->batch * a->seq, d = f->d, H = f->hidden;
    int64_t hb = dense_glu_hidden_bytes(f, a->batch, a->seq);
    const char *g = a->saved[GLU_SAVED_G], *u = a->saved[GLU_SAVED_U];
    const char *act = a->saved[GLU_SAVED_A];
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
