/* MLA's decode step on CUDA (mla.h's mla_dec_kernels; decode.c runs the step), f32 or bf16:
 * decode.cu's attention over the latent cache, and the output gate as the core's sigmoid GLU.
 * Built only with CUDA. */
#include "mla.h"
#include "mla_cuda.h"

static int cu_attend(const mla *m, k3rt_stream *s, int64_t B, int64_t L, const mla_cache *c,
                     const void *q_abs, const void *q_r, void *ctx, k3rt_error *err)
{
    K3RT_TRY(mla_cuda_enter(m->device, err));
    return mla_decode_attend_cuda(k3rt_stream_native(s), m->dtype, B, m->H, m->dc, m->dr, L,
                                  c->cap, m->scale, q_abs, q_r, c->kv, c->scores, ctx, err);
}

static int cu_gate(const mla *m, k3rt_stream *s, int64_t n, const void *o, const void *z,
                   void *og, k3rt_error *err)
{
    return k3rt_glu_fwd(s, m->dtype, K3RT_GLU_SIGMOID, z, o, og, n, 0, 0, err);
}

const mla_dec_kernels mla_dec_cuda = {cu_attend, cu_gate};
