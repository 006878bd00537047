/* The balancers' CUDA kernels (quantile, aux_free, aux_loss): the statistics of one micro-batch
 * and the bias updates, on the device, so a GPU run never reads routing back to the host to
 * balance. Math: spec moe_balance_attnres.md §3-§4; each kernel equals its plugin's CPU loop
 * (the oracle), in double where the CPU works in double, without fused multiply-adds where the
 * CPU has none, and with integer atomics only (histograms, counts): the same bits on every run.
 *
 * Pointers are device pointers, `stream` the cudaStream_t. scores are the router's f32
 * [N, E], sel the i32 [N, k] selection, bias the f32 [E] state. E <= BAL_CU_MAX_EXPERTS. */
#ifndef K3RT_PLUGIN_BALANCER_CUDA_H
#define K3RT_PLUGIN_BALANCER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BAL_CU_MAX_EXPERTS 1024

int bal_cu_enter(int device, k3rt_error *err);
/* Zeroes bytes at p on `stream`; with no stream (NULL) on the legacy stream, waited for, so the
 * zeros are in place before any later work of any stream. */
int bal_cu_zero(void *stream, void *p, size_t bytes, k3rt_error *err);

/* ---- quantile ---- */

/* window[0..1] = (lo, w): [min b - 1, max b + 1] in `bins` bins (the CPU's quantile_window). */
int quantile_cu_window(void *stream, const float *bias, int E, int64_t bins, double *window,
                 k3rt_error *err);
/* Per token: alpha = (k+1)-th largest (double) s + b; r = alpha - s. r_out != NULL: the rows
 * [N, E] (exact mode); else hist[e, bin(r)] += 1 over window (histogram mode). */
int quantile_cu_observe(void *stream, const float *scores, const float *bias, int64_t N, int E, int k,
                  const double *window, int64_t bins, double *r_out, unsigned long long *hist,
                  k3rt_error *err);
/* bhat[e] = the idx-th smallest (0-based) of column e of r [n, E] (NaN sorts last). */
int quantile_cu_select(void *stream, const double *r, int64_t n, int E, int64_t idx, double *bhat,
                 k3rt_error *err);
/* bhat[e] from the histogram: the first bin whose cumulative count reaches ceil(tau),
 * interpolated linearly inside it. */
int quantile_cu_hist_quantiles(void *stream, const unsigned long long *hist, int E, int64_t bins,
                         const double *window, double tau, double *bhat, k3rt_error *err);
/* bias = (float)(bhat - mean(bhat)), the mean summed in expert order. */
int quantile_cu_center(void *stream, const double *bhat, int E, float *bias, k3rt_error *err);

/* ---- aux_free ---- */

/* acc[e] += counts[e] (i64). */
int aux_free_cu_accumulate(void *stream, const int64_t *counts, int E, int64_t *acc, k3rt_error *err);
/* With total = sum acc > 0: bias[e] = (float)(bias[e] + gamma sign(total - E acc[e])). */
int aux_free_cu_update(void *stream, const int64_t *acc, int E, double gamma, float *bias,
                 k3rt_error *err);

/* ---- aux_loss ---- */

/* Bytes of scratch aux_loss_cu_loss needs for B sequences of T tokens. */
int64_t aux_loss_cu_scratch(int64_t B, int64_t T, int E);
/* The sequence-wise balance loss of B sequences of T tokens (spec §3): d_scores [N, E] f32
 * receives scale * dL/ds, *loss_dev (one device double) the loss, the mean over sequences
 * (accumulate: *loss_dev += the loss). */
int aux_loss_cu_loss(void *stream, const float *scores, const int32_t *sel, int64_t B, int64_t T,
               int E, int k, double alpha, double scale, void *scratch, float *d_scores,
               double *loss_dev, int accumulate, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
