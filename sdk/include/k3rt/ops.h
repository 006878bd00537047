/* k3rt/ops.h — shared math that plugins call instead of linking BLAS or cuBLAS themselves.
 *
 * Every op takes the stream it runs on first (the stream's device decides CPU or CUDA), then
 * the dtype of its floating-point operands: K3RT_F32 or K3RT_F64 on the CPU (f64 exists for
 * tests), K3RT_F32 or K3RT_BF16 on CUDA. Index operands (tokens, targets) are K3RT_I32.
 * Pointers are raw device pointers, row-major and contiguous unless a leading dimension says
 * otherwise. Shapes are stated in each comment as (rows, cols).
 *
 * Gradient conventions: parameter gradients (dW, db, dgain, dtable) ACCUMULATE (the engine
 * zeroes them once per optimizer step, so micro-batches add up); activation gradients (dx)
 * overwrite unless the `accumulate` argument is non-zero.
 *
 * Mixed precision (dtype K3RT_BF16): activations, weights and activation gradients are bf16;
 * parameter-gradient outputs (dW, db, dgain, dtable) and per-row statistics (rstd, lse, loss)
 * are K3RT_F32 buffers, accumulated in fp32. Arithmetic is fp32 inside every kernel. With
 * K3RT_F32 on CUDA, matrix products run in full fp32 (no TF32).
 */
#ifndef K3RT_OPS_H
#define K3RT_OPS_H

#include <stdint.h>
#include "errors.h"
#include "tensor.h"
#include "stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM --------------------------------------------------------------------------------- */

/* C(m,n) = alpha * op(A)(m,k) @ op(B)(k,n) + beta * C, row-major; op(X) = X or X^T.
 * lda/ldb/ldc are the row strides of A, B, C as stored. */
K3RT_API int k3rt_gemm(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m, int64_t n,
                       int64_t k, double alpha, const void *a, int64_t lda, const void *b,
                       int64_t ldb, double beta, void *c, int64_t ldc, k3rt_error *err);

/* The same over `batch` matrices at fixed element strides. */
K3RT_API int k3rt_gemm_strided_batched(k3rt_stream *s, int dtype, int trans_a, int trans_b,
                                       int64_t m, int64_t n, int64_t k, double alpha,
                                       const void *a, int64_t lda, int64_t stride_a,
                                       const void *b, int64_t ldb, int64_t stride_b, double beta,
                                       void *c, int64_t ldc, int64_t stride_c, int64_t batch,
                                       k3rt_error *err);
/* The same with the addend and the result apart: D = alpha op(A) op(B) + beta C, C and D of one
 * layout (ldc, stride_c; they may be one buffer). Saves the pass that copies or scales C into D
 * first (cuBLASLt reads C and writes D in the product's epilogue). */
K3RT_API int k3rt_gemm_strided_batched_into(k3rt_stream *s, int dtype, int trans_a, int trans_b,
                                            int64_t m, int64_t n, int64_t k, double alpha,
                                            const void *a, int64_t lda, int64_t stride_a,
                                            const void *b, int64_t ldb, int64_t stride_b,
                                            double beta, const void *c, void *d, int64_t ldc,
                                            int64_t stride_c, int64_t batch, k3rt_error *err);

/* ---- Linear layers (weights stored [out, in], as torch's nn.Linear) ------------------------ */

/* y(n,out) = x(n,in) @ W^T (+ bias(out) when bias != NULL) */
K3RT_API int k3rt_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                             const void *bias, void *y, int64_t n, int64_t in, int64_t out,
                             k3rt_error *err);
/* y(n,out) = x(n,in) @ W^T written in f32 whatever the input dtype: under bf16 the products of
 * bf16 values are exact in fp32 and the sum runs in fp32 (tensor cores on CUDA), which is what
 * widening x and W to f32 first would compute, without the two casts or the f32 product. On the
 * CPU dtype must be f32 (then it is k3rt_linear_fwd). A router's scores use it. */
K3RT_API int k3rt_linear_fwd_f32(k3rt_stream *s, int dtype, const void *x, const void *w,
                                 float *y, int64_t n, int64_t in, int64_t out, k3rt_error *err);
/* dx(n,in) (=|+=) dy @ W ; dW(out,in) += dy^T @ x ; db(out) += sum_rows dy. dx, dw, db may be
 * NULL to skip them. */
K3RT_API int k3rt_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                             const void *dy, void *dx, void *dw, void *db, int64_t n, int64_t in,
                             int64_t out, int accumulate_dx, k3rt_error *err);

/* Grouped linear for experts: rows of x are sorted by group; group g owns rows
 * [offsets[g], offsets[g+1]) and weight w[g] of shape (out, in). offsets is a HOST array of
 * groups + 1 entries. y(rows,out) = x_g @ W_g^T per group. */
K3RT_API int k3rt_grouped_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                     void *y, const int64_t *offsets, int64_t groups, int64_t in,
                                     int64_t out, k3rt_error *err);
/* dx (=|+=) dy_g @ W_g ; dW_g += dy_g^T @ x_g. dx or dw may be NULL. */
K3RT_API int k3rt_grouped_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                     const void *dy, void *dx, void *dw, const int64_t *offsets,
                                     int64_t groups, int64_t in, int64_t out, int accumulate_dx,
                                     k3rt_error *err);
/* The same two with the group boundaries where a router on the device writes them: offsets
 * holds groups + 1 entries of offsets_dtype, K3RT_I32 or K3RT_I64 (offsets[0] = 0,
 * nondecreasing, offsets[groups] <= rows), in the stream device's memory (host memory on a CPU
 * stream); x, y, dy and dx hold `rows` rows. With
 * bf16, in and out multiples of 8, at most 1024 groups, on an sm_90 GPU (the CUTLASS grouped
 * GEMM) the host reads nothing: no synchronisation, and offsets outside [0, rows] are clamped
 * on the device (a group comes out empty). Otherwise the offsets are copied to the host first
 * (the call waits for the stream) and checked as above. */
K3RT_API int k3rt_grouped_linear_fwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                         void *y, const void *offsets, int offsets_dtype,
                                         int64_t groups, int64_t rows, int64_t in, int64_t out,
                                         k3rt_error *err);
K3RT_API int k3rt_grouped_linear_bwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                         const void *dy, void *dx, void *dw,
                                         const void *offsets, int offsets_dtype, int64_t groups,
                                         int64_t rows, int64_t in, int64_t out,
                                         int accumulate_dx, k3rt_error *err);
/* The weight gradient alone, dW_g (=|+=) dy_g^T @ x_g, offsets as k3rt_grouped_linear_bwd_dev:
 * accumulate = 0 overwrites dW (an empty group's dW_g comes out zero) without reading it, for
 * the first backward of a step into a gradient that would otherwise be zeroed first; on the
 * CUTLASS path that halves the fp32 gradient's memory traffic. */
K3RT_API int k3rt_grouped_linear_dw_dev(k3rt_stream *s, int dtype, const void *x, const void *dy,
                                        void *dw, const void *offsets, int offsets_dtype,
                                        int64_t groups, int64_t rows, int64_t in, int64_t out,
                                        int accumulate, k3rt_error *err);

/* ---- Normalisation ------------------------------------------------------------------------- */

/* y(n,d) = x / sqrt(mean(x^2) + eps) * gain(d); gain may be NULL (no gain). rstd(n) receives
 * 1/sqrt(mean(x^2)+eps) for the backward (may be NULL when no backward follows). */
K3RT_API int k3rt_rmsnorm_fwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                              void *y, void *rstd, int64_t n, int64_t d, double eps,
                              k3rt_error *err);
/* dx (=|+=) ; dgain += (gain and dgain may be NULL). */
K3RT_API int k3rt_rmsnorm_bwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                              const void *rstd, const void *dy, void *dx, void *dgain, int64_t n,
                              int64_t d, int accumulate_dx, k3rt_error *err);

/* ---- Embedding and loss -------------------------------------------------------------------- */

/* out(n,d) = table[tokens[i]]; a token outside [0, vocab) is an error naming it. */
K3RT_API int k3rt_embedding_fwd(k3rt_stream *s, int dtype, const void *table,
                                const int32_t *tokens, void *out, int64_t n, int64_t vocab,
                                int64_t d, k3rt_error *err);
/* dtable(vocab,d) += scatter of dout rows; deterministic (no float atomics). */
K3RT_API int k3rt_embedding_bwd(k3rt_stream *s, int dtype, const int32_t *tokens,
                                const void *dout, void *dtable, int64_t n, int64_t vocab,
                                int64_t d, k3rt_error *err);

/* Softmax cross-entropy over rows of logits(n,v): loss(n) = lse - logit[target],
 * lse(n) = log sum exp(logits). A target < 0 is ignored (loss 0). */
K3RT_API int k3rt_xent_fwd(k3rt_stream *s, int dtype, const void *logits,
                           const int32_t *targets, void *loss, void *lse, int64_t n, int64_t v,
                           k3rt_error *err);
/* dlogits(n,v) = (softmax(logits) - onehot(target)) * scale; dlogits may alias logits. */
K3RT_API int k3rt_xent_bwd(k3rt_stream *s, int dtype, const void *logits,
                           const int32_t *targets, const void *lse, double scale, void *dlogits,
                           int64_t n, int64_t v, k3rt_error *err);

/* ---- Elementwise ----------------------------------------------------------------------------- */

typedef enum k3rt_act {
    K3RT_ACT_IDENTITY = 0,
    K3RT_ACT_SILU = 1,      /* x * sigmoid(x) */
    K3RT_ACT_SIGMOID = 2,
    K3RT_ACT_SOFTPLUS = 3,  /* log(1 + e^x), computed stably for all x */
    K3RT_ACT_TANH = 4,
    K3RT_ACT_RELU = 5
} k3rt_act;

K3RT_API int k3rt_act_fwd(k3rt_stream *s, int dtype, int act, const void *x, void *y, int64_t n,
                          k3rt_error *err);
/* dx (=|+=) dy * act'(x) */
K3RT_API int k3rt_act_bwd(k3rt_stream *s, int dtype, int act, const void *x, const void *dy,
                          void *dx, int64_t n, int accumulate_dx, k3rt_error *err);

typedef enum k3rt_glu {
    K3RT_GLU_SWIGLU = 0,  /* silu(g) * u */
    K3RT_GLU_SITU = 1,    /* SiTU-GLU: beta1*tanh(g/beta1)*sigmoid(g) * beta2*tanh(u/beta2)
                             (K3 defaults beta1 = 4, beta2 = 25; |out| <= beta1*beta2) */
    K3RT_GLU_SIGMOID = 2  /* sigmoid(g) * u: the original GLU, and the attention layers'
                             sigmoid output gates (g the gate logits, u the heads' output) */
} k3rt_glu;

/* out(n) = glu(gate, up); beta1/beta2 are used by SiTU only. */
K3RT_API int k3rt_glu_fwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                          void *out, int64_t n, double beta1, double beta2, k3rt_error *err);
/* dgate, dup overwritten; dup may alias dout (each element is read before it is written). */
K3RT_API int k3rt_glu_bwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                          const void *dout, void *dgate, void *dup, int64_t n, double beta1,
                          double beta2, k3rt_error *err);

/* y = alpha * x + beta * y over n elements (beta == 0 ignores y's old contents). */
K3RT_API int k3rt_axpby(k3rt_stream *s, int dtype, int64_t n, double alpha, const void *x,
                        double beta, void *y, k3rt_error *err);
/* out = a * b elementwise; out may alias a or b. */
K3RT_API int k3rt_mul(k3rt_stream *s, int dtype, int64_t n, const void *a, const void *b,
                      void *out, k3rt_error *err);
K3RT_API int k3rt_fill(k3rt_stream *s, int dtype, void *x, int64_t n, double value,
                       k3rt_error *err);
/* Converts n elements between float dtypes on the stream's device. */
K3RT_API int k3rt_cast(k3rt_stream *s, const void *src, int src_dtype, void *dst, int dst_dtype,
                       int64_t n, k3rt_error *err);
/* Sum of squares of n elements into a host double (synchronises the stream). NaN/Inf in x
 * give a non-finite result, which is how the trainer detects bad gradients. */
K3RT_API int k3rt_sum_squares(k3rt_stream *s, int dtype, const void *x, int64_t n, double *out,
                              k3rt_error *err);

/* ---- Optimizer math ---------------------------------------------------------------------------- */

/* One AdamW step over n elements (param, grad, m, v share the dtype):
 *   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
 *   p = p (1 - lr wd) - lr (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
 * step is 1-based. Shared by every optimizer plugin that keeps an AdamW group. */
K3RT_API int k3rt_adamw_step(k3rt_stream *s, int dtype, void *param, const void *grad, void *m,
                             void *v, int64_t n, double lr, double beta1, double beta2,
                             double eps, double weight_decay, int64_t step, k3rt_error *err);

/* The same step over `count` tensors that share dtype, lr, betas, eps and step: tensor i is
 * param[i], grad[i], m[i], v[i] of n[i] elements with decay weight_decay[i] (weight_decay NULL:
 * no decay on any). The arrays are HOST arrays of device pointers. On CUDA (f32 only, as
 * k3rt_adamw_step) every tensor is updated by one kernel launch; on the CPU it equals
 * k3rt_adamw_step called per tensor. A tensor with n[i] == 0 is skipped. */
K3RT_API int k3rt_adamw_step_multi(k3rt_stream *s, int dtype, int64_t count, void *const *param,
                                   const void *const *grad, void *const *m, void *const *v,
                                   const int64_t *n, const double *weight_decay, double lr,
                                   double beta1, double beta2, double eps, int64_t step,
                                   k3rt_error *err);

/* ---- CPU parallelism ------------------------------------------------------------------------- */

/* Runs fn over [0, n) split into contiguous ranges across the stream's CPU threads (inline when
 * the stream has one thread or n < grain). fn must not call back into k3rt_parallel_for. */
typedef void (*k3rt_range_fn)(void *ctx, int64_t begin, int64_t end);
K3RT_API void k3rt_parallel_for(k3rt_stream *s, int64_t n, int64_t grain, k3rt_range_fn fn,
                                void *ctx);

#ifdef __cplusplus
}
#endif
#endif
