/* KDA's decode step on CUDA (kda.h's kda_dec_kernels; decode.c runs the step), f32 or bf16:
 * the layer's own conv and gate kernels at one token (the cached inputs as the conv's halo),
 * then decode.cu's cache update and recurrent step (cuda/kda_layer_cuda.h). Built only with
 * CUDA. */
#include "kda.h"
#include "cuda/kda_layer_cuda.h"

static int cu_conv(const kda *m, k3rt_stream *s, int64_t B, int64_t heads, int64_t hd,
                   const void *p, void *hist, const void *w, int l2, void *out, void *scratch,
                   k3rt_error *err)
{
    (void)scratch;
    void *st = k3rt_stream_native(s);
    K3RT_TRY(kda_cu_enter(m->device, err));
    K3RT_TRY(kda_cu_conv_fwd(st, m->dtype, B, 1, heads, hd, m->W, p, m->W > 1 ? hist : NULL, w,
                             NULL, l2, out, err));
    return kda_cu_decode_push(st, m->dtype, B, m->W, heads * hd, hist, p, err);
}

static int cu_gate(const kda *m, k3rt_stream *s, int64_t B, void *z, const void *a_log,
                   const void *dt_bias, void *g, k3rt_error *err)
{
    K3RT_TRY(kda_cu_enter(m->device, err));
    return kda_cu_gate_fwd(k3rt_stream_native(s), m->dtype, B, m->HV, m->dim_k, m->lb, z,
                           a_log, dt_bias, g, err);
}

static int cu_recur(const kda *m, k3rt_stream *s, int64_t B, void *S, const void *q,
                    const void *k, const void *v, const void *g, const void *beta, void *o,
                    void *scratch, k3rt_error *err)
{
    (void)scratch;
    K3RT_TRY(kda_cu_enter(m->device, err));
    return kda_cu_decode_step(k3rt_stream_native(s), m->dtype, B, m->H, m->HV, m->dim_k, S, q,
                              k, v, g, beta, o, err);
}

static int cu_ogate(const kda *m, k3rt_stream *s, int64_t n, const void *on, const void *G,
                    void *yg, k3rt_error *err)
{
    return k3rt_glu_fwd(s, m->dtype, K3RT_GLU_SIGMOID, G, on, yg, n, 0, 0, err);
}

const kda_dec_kernels kda_dec_cuda = {cu_conv, cu_gate, cu_recur, cu_ogate};
