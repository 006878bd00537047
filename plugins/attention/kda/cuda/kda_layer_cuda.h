/* The KDA layer's own CUDA kernels (layer.cu), for the pieces around the recurrence that the
 * shared ops (k3rt/ops.h) do not have: the causal depthwise short conv with SiLU and the
 * per-head L2 norm (forward and backward, with the conv halo of context parallelism and
 * document restarts), the safe forget gate g = lb sigmoid(e^A_log (z + dt_bias)) and the
 * sigmoid output gate. Spec kda_mla.md §2.1, §3.2, §3.3. The layer itself (plugins/attention/
 * kda/cuda.c) strings these together with the shared ops and the recurrence (kda_cuda.h).
 *
 * Pointers are device pointers; `stream` is the cudaStream_t (k3rt_stream_native). Activations,
 * parameters and activation gradients are `dtype` (K3RT_F32 or K3RT_BF16); pointers typed float
 * are f32 in either case (parameter gradients, which accumulate, and scratch). Arithmetic is
 * fp32. Every sum is taken in a fixed order (no atomics): the same bits on every run.
 *
 * Token layout: N = B*T tokens, row b holds tokens [b*T, (b+1)*T); a [N, C] tensor is row-major.
 * Documents (packed sequences): dstart[n] (int32, kda_cu_doc_bounds) is the first token of
 * token n's document; NULL means the row is one document. The
 * conv of a token reads only its own document; a row's first document also reads the W-1 halo
 * rows of its row (halo [B, W-1, C], NULL: zeros) — the layer inputs before the span under
 * context parallelism. The decode step's own two kernels (decode.cu) are declared last. */
#ifndef K3RT_PLUGIN_KDA_LAYER_CUDA_H
#define K3RT_PLUGIN_KDA_LAYER_CUDA_H

#include <stdint.h>

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tokens per block of the partial sums behind every parameter gradient of this file. */
#define KDA_CU_SUM_ROWS 128
/* The widest short conv the kernels take (a thread keeps W rows of its channels in registers). */
#define KDA_CU_MAX_CONV 4

/* Makes `device` current on the calling thread (kernels launch on the current device). */
int kda_cu_enter(int device, k3rt_error *err);

/* dstart[n] for the N tokens from doc_offsets (int32 [n_docs + 1], rising from 0 to N). */
int kda_cu_doc_bounds(void *stream, int64_t N, const int32_t *docs, int64_t n_docs,
                      int32_t *dstart, k3rt_error *err);

/* out = act(z), z[n, c] = sum_j w[c, j] u[n - W + 1 + j, c] (the document's tokens only), C =
 * heads * hd channels, hd in {32, 64, 128}; act = SiLU and, with l2, then the L2 norm of each
 * head's hd channels: out = a / sqrt(sum a^2 + 1e-6). */
int kda_cu_conv_fwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads, int64_t hd,
                    int64_t W, const void *u, const void *halo, const void *w,
                    const int32_t *dstart, int l2, void *out, k3rt_error *err);
/* The backward of kda_cu_conv_fwd in one pass (z and the activation recomputed, dz kept in
 * registers): du[n, c] = sum_j w[c, j] dz[n + W - 1 - j, c] over the tokens of n's document
 * (overwritten); with halo and dhalo, the same for the halo rows of each row, from the row's
 * first document (overwritten); dw[c, j] += sum_n dz[n, c] u[n - W + 1 + j, c] (halo rows
 * included), through part (f32 [ceil(N / KDA_CU_SUM_ROWS), C, W] scratch). */
int kda_cu_conv_bwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads, int64_t hd,
                    int64_t W, const void *u, const void *halo, const void *w,
                    const int32_t *dstart, int l2, const void *dout, void *du, void *dhalo,
                    float *part, float *dw, k3rt_error *err);

/* Forget gate on [N, HV*dk]: g = lb sigmoid(e^A_log[h] (zf + dt_bias[c])), h = c / dk. */
int kda_cu_gate_fwd(void *stream, int dtype, int64_t N, int64_t HV, int64_t dk, double lb,
                    const void *zf, const void *a_log, const void *dt_bias, void *g,
                    k3rt_error *err);
/* From dg: dzf = dg dg/dz (overwritten), d_dt_bias[c] += sum_n dzf, d_a_log[h] += sum over n
 * and the head's channels of dg dg/dA_log; part: f32 scratch of
 * 2 * ceil(N / KDA_CU_SUM_ROWS) * HV * dk. */
int kda_cu_gate_bwd(void *stream, int dtype, int64_t N, int64_t HV, int64_t dk, double lb,
                    const void *zf, const void *a_log, const void *dt_bias, const void *dg,
                    void *dzf, float *part, float *d_dt_bias, float *d_a_log, k3rt_error *err);

/* Decoding (decode.cu), one token per sequence: hist [B, W-1, C] (the conv inputs of the last
 * W-1 tokens, oldest first) drops its oldest row and appends p [B, C]; and one token of the
 * recurrence on the fp32 state S [B, HV, D, D] (dk = dv = D in {32, 64, 128}) from q, k
 * [B, H, D], v [B, HV, D], g [B, HV, D], beta [B, HV], writing o [B, HV, D] (scale D^-1/2). */
int kda_cu_decode_push(void *stream, int dtype, int64_t B, int64_t W, int64_t C, void *hist,
                       const void *p, k3rt_error *err);
int kda_cu_decode_step(void *stream, int dtype, int64_t B, int64_t H, int64_t HV, int64_t D,
                       float *S, const void *q, const void *k, const void *v, const void *g,
                       const void *beta, void *o, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
