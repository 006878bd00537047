/* LatentMoE's own CUDA kernels: routing (biased top-k, gates, counts), the expert-sorted
 * permutation (a device counting sort) and the row moves between token order and expert-grouped
 * order, with their backwards. The products, norms and GLUs are the shared ops (k3rt/ops.h);
 * ../cuda.c strings them together. Math: the CPU loops of ../cpu_tokens.inc.c, which these equal.
 *
 * Pointers are device pointers; `stream` is the cudaStream_t (k3rt_stream_native). Activations
 * (c, xe, ye, U, dU, dye, dxe, dc) are `dtype` (K3RT_F32 or K3RT_BF16); scores, gates and their
 * gradients are f32 in either dtype, so the selection and the gates are computed in fp32 on every
 * run. Arithmetic is fp32. No float atomics anywhere: every sum runs in a fixed order (slot order
 * per token), so every result is the same bits on every run.
 *
 * Shapes: N tokens, E experts (<= LMOE_CU_MAX_EXPERTS), k slots per token (<= LMOE_CU_MAX_TOPK),
 * R = N k routed rows (< 2^31), l row width. pos[t, j] is the grouped row of (token t, slot j);
 * src[row] = t k + j is its inverse. */
#ifndef K3RT_PLUGIN_LATENT_MOE_CUDA_H
#define K3RT_PLUGIN_LATENT_MOE_CUDA_H

#include <stdint.h>

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LMOE_CU_MAX_EXPERTS 1024
#define LMOE_CU_MAX_TOPK 16
/* (token, slot) pairs per chunk of the counting sort */
#define LMOE_CU_SORT_CHUNK 2048

/* Makes `device` current on the calling thread (kernels launch on the current device). */
int lmoe_cu_enter(int device, k3rt_error *err);

/* sel[t] = the k experts of largest s + bias (bias NULL = 0), in descending order, equal values
 * in ascending expert id (the CPU's order); p[t, j] = rscale s_sel / (sum_j s_sel + 1e-20)
 * (renormalize) or rscale s_sel. s, bias, p f32. */
int lmoe_cu_route(void *stream, const float *s, const float *bias, int64_t N, int64_t E, int64_t k,
                int renormalize, double rscale, int32_t *sel, float *p, k3rt_error *err);

/* Bytes of scratch lmoe_cu_dispatch needs. */
int64_t lmoe_cu_dispatch_scratch(int64_t R, int64_t E);
/* Counting sort of the R = N k pairs by expert, stable in (token, slot) order (the CPU's
 * order): counts [E] and offsets [E + 1] (i64), pos [R] and src [R] (i32). */
int lmoe_cu_dispatch(void *stream, const int32_t *sel, int64_t R, int64_t E, void *scratch,
                   int64_t *counts, int64_t *offsets, int32_t *pos, int32_t *src,
                   k3rt_error *err);

/* xe[row] = c[src[row] / k] for the R rows. */
int lmoe_cu_gather(void *stream, int dtype, const void *c, const int32_t *src, int64_t R, int64_t k,
                 int64_t l, void *xe, k3rt_error *err);
/* U[t] = sum_j w[t, j] ye[pos[t, j]] in slot order (w NULL: 1, the scatter of dxe into dc). */
int lmoe_cu_combine(void *stream, int dtype, const void *ye, const int32_t *pos, const float *w,
                  int64_t N, int64_t k, int64_t l, void *U, k3rt_error *err);
/* dp[t, j] = dU[t] . ye[pos[t, j]] (f32) ; dye[pos[t, j]] = p[t, j] dU[t] */
int lmoe_cu_combine_bwd(void *stream, int dtype, const void *dU, const void *ye,
                      const int32_t *pos, const float *p, int64_t N, int64_t k, int64_t l,
                      float *dp, void *dye, k3rt_error *err);
/* dz = s (1 - s) (ds + d_scores), ds the gates' backward of dp over the chosen k (0 elsewhere);
 * d_scores may be NULL. All f32 [N, E] but dp [N, k]. */
int lmoe_cu_router_bwd(void *stream, const float *s, const int32_t *sel, const float *dp,
                     const float *d_scores, int64_t N, int64_t E, int64_t k, int renormalize,
                     double rscale, float *dz, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
