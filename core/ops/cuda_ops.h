/* CUDA kernels of the shared ops (core/ops/cuda/), called by the public entry points in
 * ops.c and gemm.c when the stream is a CUDA stream. Same arguments and conventions as
 * k3rt/ops.h; dtype is K3RT_F32 or K3RT_BF16, with the mixed-precision rule of ops.h: under
 * K3RT_BF16, parameter gradients (dW, db, dgain, dtable) and per-row statistics (rstd, lse,
 * loss) are F32 buffers. Only built with the CUDA toolkit (K3RT_HAVE_CUDA).
 *
 * Determinism: every op here gives bitwise-equal results when repeated on the same device with
 * the same inputs (reductions run in a fixed order; no floating-point atomics). GEMMs are
 * cuBLASLt's, with a fixed workspace and a cached algorithm per shape.
 *
 * Indices (tokens, targets) live on the device, so they are checked there: an index outside
 * its range never reads out of bounds; it makes its output row NaN (forward) or is skipped
 * (embedding backward), and the first one is recorded for cuda_ops_take_index_error. */
#ifndef K3RT_CUDA_OPS_H
#define K3RT_CUDA_OPS_H

#include <k3rt/ops.h>

int cuda_gemm(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m, int64_t n,
              int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
              double beta, void *c, int64_t ldc, k3rt_error *err);
int cuda_gemm_strided_batched(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m,
                              int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                              int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                              double beta, const void *c, void *d, int64_t ldc,
                              int64_t stride_c, int64_t batch, k3rt_error *err);
int cuda_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w, const void *bias,
                    void *y, int64_t n, int64_t in, int64_t out, k3rt_error *err);
int cuda_linear_fwd_f32(k3rt_stream *s, int dtype, const void *x, const void *w, float *y,
                        int64_t n, int64_t in, int64_t out, k3rt_error *err);
int cuda_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w, const void *dy,
                    void *dx, void *dw, void *db, int64_t n, int64_t in, int64_t out,
                    int accumulate_dx, k3rt_error *err);
int cuda_grouped_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w, void *y,
                            const int64_t *offsets, int64_t groups, int64_t in, int64_t out,
                            k3rt_error *err);
int cuda_grouped_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                            const void *dy, void *dx, void *dw, const int64_t *offsets,
                            int64_t groups, int64_t in, int64_t out, int accumulate_dx,
                            k3rt_error *err);
int cuda_grouped_linear_fwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                void *y, const void *offsets, int offsets_dtype, int64_t groups,
                                int64_t rows, int64_t in, int64_t out, k3rt_error *err);
int cuda_grouped_linear_bwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                const void *dy, void *dx, void *dw, const void *offsets,
                                int offsets_dtype, int64_t groups, int64_t rows, int64_t in,
                                int64_t out, int accumulate_dx, k3rt_error *err);
int cuda_grouped_linear_dw_dev(k3rt_stream *s, int dtype, const void *x, const void *dy,
                               void *dw, const void *offsets, int offsets_dtype, int64_t groups,
                               int64_t rows, int64_t in, int64_t out, int accumulate,
                               k3rt_error *err);

int cuda_rmsnorm_fwd(k3rt_stream *s, int dtype, const void *x, const void *gain, void *y,
                     void *rstd, int64_t n, int64_t d, double eps, k3rt_error *err);
int cuda_rmsnorm_bwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                     const void *rstd, const void *dy, void *dx, void *dgain, int64_t n,
                     int64_t d, int accumulate_dx, k3rt_error *err);

int cuda_embedding_fwd(k3rt_stream *s, int dtype, const void *table, const int32_t *tokens,
                       void *out, int64_t n, int64_t vocab, int64_t d, k3rt_error *err);
int cuda_embedding_bwd(k3rt_stream *s, int dtype, const int32_t *tokens, const void *dout,
                       void *dtable, int64_t n, int64_t vocab, int64_t d, k3rt_error *err);
int cuda_xent_fwd(k3rt_stream *s, int dtype, const void *logits, const int32_t *targets,
                  void *loss, void *lse, int64_t n, int64_t v, k3rt_error *err);
int cuda_xent_bwd(k3rt_stream *s, int dtype, const void *logits, const int32_t *targets,
                  const void *lse, double scale, void *dlogits, int64_t n, int64_t v,
                  k3rt_error *err);

int cuda_act_fwd(k3rt_stream *s, int dtype, int act, const void *x, void *y, int64_t n,
                 k3rt_error *err);
int cuda_act_bwd(k3rt_stream *s, int dtype, int act, const void *x, const void *dy, void *dx,
                 int64_t n, int accumulate_dx, k3rt_error *err);
int cuda_glu_fwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                 void *out, int64_t n, double beta1, double beta2, k3rt_error *err);
int cuda_glu_bwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                 const void *dout, void *dgate, void *dup, int64_t n, double beta1,
                 double beta2, k3rt_error *err);
int cuda_axpby(k3rt_stream *s, int dtype, int64_t n, double alpha, const void *x, double beta,
               void *y, k3rt_error *err);
int cuda_mul(k3rt_stream *s, int dtype, int64_t n, const void *a, const void *b, void *out,
             k3rt_error *err);
int cuda_fill(k3rt_stream *s, int dtype, void *x, int64_t n, double value, k3rt_error *err);
/* Any pair of f32, f64, bf16 and fp8 e4m3 (saturating at +-448, as k3rt_f32_to_fp8e4m3). */
int cuda_cast(k3rt_stream *s, const void *src, int src_dtype, void *dst, int dst_dtype,
              int64_t n, k3rt_error *err);

/* Sum of squares into a host double; synchronises the stream. */
int cuda_sum_squares(k3rt_stream *s, int dtype, const void *x, int64_t n, double *out,
                     k3rt_error *err);
/* The same into a device double, without synchronising: *dev_out = (accumulate ? *dev_out : 0)
 * + sum. For a gradient norm over many tensors with one synchronisation at the end. */
int cuda_sum_squares_device(k3rt_stream *s, int dtype, const void *x, int64_t n,
                            double *dev_out, int accumulate, k3rt_error *err);

/* AdamW on f32 master parameters, gradients and moments (k3rt_adamw_step's formula). */
int cuda_adamw_step(k3rt_stream *s, int dtype, void *param, const void *grad, void *m, void *v,
                    int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step, k3rt_error *err);

/* k3rt_adamw_step_multi on f32 tensors: one launch for all of them (arguments checked by the
 * public entry point). */
int cuda_adamw_step_multi(k3rt_stream *s, int dtype, int64_t count, void *const *param,
                          const void *const *grad, void *const *m, void *const *v,
                          const int64_t *n, const double *weight_decay, double lr, double beta1,
                          double beta2, double eps, int64_t step, k3rt_error *err);

/* Reports (and clears) the first out-of-range token or target that a kernel on `device` met
 * since the last call: K3RT_ERR_INVALID naming the op, position and value, else K3RT_OK.
 * Synchronises the device; call it where the trainer synchronises anyway (once a step). */
int cuda_ops_take_index_error(int device, k3rt_error *err);

#endif
