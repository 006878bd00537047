/* CPU reference kernels of the shared ops, built once for float (_f32) and once for double
 * (_f64) from cpu_ops.inc.c. `threads` bounds the OpenMP team. */
#ifndef K3RT_CPU_OPS_H
#define K3RT_CPU_OPS_H

#include <stdint.h>

#define CPU_OPS_DECLARE(REAL, SUF)                                                            \
    void cpu_rmsnorm_fwd_##SUF(const REAL *x, const REAL *gain, REAL *y, REAL *rstd,          \
                               int64_t n, int64_t d, double eps, int threads);                \
    void cpu_rmsnorm_bwd_##SUF(const REAL *x, const REAL *gain, const REAL *rstd,             \
                               const REAL *dy, REAL *dx, REAL *dgain, int64_t n, int64_t d,   \
                               int acc, int threads);                                         \
    void cpu_embedding_fwd_##SUF(const REAL *table, const int32_t *tok, REAL *out, int64_t n, \
                                 int64_t d, int threads);                                     \
    void cpu_embedding_bwd_##SUF(const int32_t *tok, const REAL *dout, REAL *dtable,          \
                                 int64_t n, int64_t d, int threads);                          \
    void cpu_xent_fwd_##SUF(const REAL *logits, const int32_t *tgt, REAL *loss, REAL *lse,    \
                            int64_t n, int64_t v, int threads);                               \
    void cpu_xent_bwd_##SUF(const REAL *logits, const int32_t *tgt, const REAL *lse,          \
                            double scale, REAL *dlogits, int64_t n, int64_t v, int threads);  \
    void cpu_act_fwd_##SUF(int act, const REAL *x, REAL *y, int64_t n, int threads);          \
    void cpu_act_bwd_##SUF(int act, const REAL *x, const REAL *dy, REAL *dx, int64_t n,       \
                           int acc, int threads);                                             \
    void cpu_glu_fwd_##SUF(int glu, const REAL *g, const REAL *u, REAL *out, int64_t n,       \
                           double b1, double b2, int threads);                                \
    void cpu_glu_bwd_##SUF(int glu, const REAL *g, const REAL *u, const REAL *dout,           \
                           REAL *dg, REAL *du, int64_t n, double b1, double b2, int threads); \
    void cpu_axpby_##SUF(int64_t n, double alpha, const REAL *x, double beta, REAL *y,        \
                         int threads);                                                        \
    void cpu_mul_##SUF(int64_t n, const REAL *a, const REAL *b, REAL *out, int threads);      \
    void cpu_fill_##SUF(REAL *x, int64_t n, double value, int threads);                       \
    double cpu_sum_squares_##SUF(const REAL *x, int64_t n);                                   \
    void cpu_bias_grad_##SUF(const REAL *dy, REAL *db, int64_t n, int64_t out, int threads); \
    void cpu_adamw_##SUF(REAL *p, const REAL *g, REAL *m, REAL *v, int64_t n, double lr,      \
                         double b1, double b2, double eps, double wd, int64_t step,           \
                         int threads);

CPU_OPS_DECLARE(float, f32)
CPU_OPS_DECLARE(double, f64)

/* Rows are reduced in fixed blocks of this many, then the blocks in order, so column sums do
 * not depend on the thread count (bitwise-stable across runs and resumes). */
#define CPU_REDUCE_BLOCK 64

#endif
