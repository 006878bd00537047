/* One AttnRes mixing op on CUDA (attnres.cu), f32 or bf16 sources with fp32 arithmetic: the
 * same function as the CPU's cpu.inc.c (see there for the math), in two kernels a call:
 *
 *   forward   one thread block per token reads each source row once: the key norms' sums of
 *             squares and the logits q . v of a chunk of sources (all of them, for a few) come
 *             from one block reduction, and an online softmax folds the chunk into the running
 *             weighted sum (spec §7); the engine's pre-norm (RMSNorm(h) * gain) is applied to
 *             h before it leaves registers.
 *   backward  a fixed grid of blocks walks the tokens; delta = dh . h (h is the forward's
 *             output) needs no source, so each source is read once: one reduction per chunk
 *             gives every source's dh . v, |v|^2 and q . v (and delta with the first), and the
 *             gradients are written in the same pass. With `recon` the last source (the
 *             within-block partial sum) is not read at all but rebuilt from h and the other
 *             sources in registers. The pseudo-query and norm gradients are per-block partial
 *             sums added in block order by a second kernel: no float atomics, the same bits
 *             on every run on a given device.
 *
 * Pointers are device pointers, `stream` a cudaStream_t. Sources, h, dh, w, gamma and the
 * pre-norm's gain and output are `dtype`; everything typed float is f32 in both dtypes
 * (alpha, rho, z, rstd, h32, the parameter gradients and the source-gradient accumulators). */
#ifndef BLOCK_ATTNRES_CUDA_H
#define BLOCK_ATTNRES_CUDA_H

#include <stdint.h>

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_CUDA_MAX_SOURCES 128  /* sources of one op (the kernel parameter holds them) */
#define AR_CUDA_MAX_D 8192       /* 16 elements per thread, 512 threads */
#define AR_CUDA_D_MULTIPLE 8     /* rows are read in 16-byte vectors */
#define AR_CUDA_BWD_BLOCKS 2048  /* the backward's grid: tokens per block is fixed by N */

typedef struct ar_cuda_op {
    int dtype;                             /* K3RT_F32 or K3RT_BF16 */
    int n;                                 /* sources; the partial sum, if any, is the last */
    int64_t N, d;
    const void *v[AR_CUDA_MAX_SOURCES];    /* [N, d] each */
    const void *w, *gamma;                 /* [d] pseudo-query and key-norm gain */
    float eps;                             /* key RMSNorm epsilon */
    float *alpha;                          /* [N, n]: forward writes, backward reads */
    float *rho_last, *z_last;              /* [N] or NULL: key scale and logit of source n-1 */
    /* the engine's pre-norm, fused (norm_gain NULL: none) */
    const void *norm_gain;                 /* [d] */
    float norm_eps;
    void *normed;                          /* forward: [N, d] RMSNorm(h) * norm_gain */
    float *rstd;                           /* [N]: forward writes, backward reads */
} ar_cuda_op;

/* Makes `device` current on the calling thread. */
int ar_cuda_enter(int device, k3rt_error *err);

/* Refuses what the kernels cannot run (dtype, d, n), naming the limit. */
int ar_cuda_supported(int dtype, int64_t d, int n, k3rt_error *err);

/* h [N, d] = sum_i alpha_i v_i; also h32 (f32 copy of h before rounding, may be NULL), alpha,
 * rho_last / z_last when given, and with norm_gain normed and rstd. */
int ar_cuda_fwd(void *stream, const ar_cuda_op *op, void *h, float *h32, k3rt_error *err);

/* Bytes of the backward's scratch (per-block partial sums) for d columns. */
int64_t ar_cuda_bwd_scratch_bytes(int64_t N, int64_t d);

typedef struct ar_cuda_bwd {
    const void *h;           /* the forward's output h [N, d] (dtype), or */
    const float *h32;        /* the same in f32 (preferred when given) */
    const void *dh;          /* [N, d] gradient of h; with op->norm_gain, of normed */
    int recon;               /* source n-1 is rebuilt from h (needs rho_last, z_last) */
    int overwrite;           /* dv[i] are dtype and overwritten; else float, accumulated */
    void *dv[AR_CUDA_MAX_SOURCES];  /* NULL: skipped */
    float *dw, *dgamma;      /* [d] accumulate */
    float *norm_gain_grad;   /* [d] accumulate (with op->norm_gain) */
    void *scratch;           /* ar_cuda_bwd_scratch_bytes */
} ar_cuda_bwd;

int ar_cuda_bwd_run(void *stream, const ar_cuda_op *op, const ar_cuda_bwd *b, k3rt_error *err);

/* Depth-weight statistics of one op: sum[i] (f64) = (fresh ? 0 : sum[i]) + sum over tokens of
 * alpha[:, i] for i < n (alpha NULL: the identity mix, all weight on source 0), and
 * mean[i] = sum[i] / tokens for the cols slots of the row (slots i >= n keep their sum). */
int ar_cuda_alpha_stats(void *stream, const float *alpha, int64_t N, int n, int cols,
                        int fresh, double tokens, double *sum, float *mean, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
