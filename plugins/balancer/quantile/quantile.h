/* Quantile Balancing (Kimi K3): the instance shared by plugin.c (descriptor, state) and
 * quantile.c (the statistics and the update). Math: spec moe_balance_attnres.md §4. */
#ifndef K3RT_PLUGIN_QUANTILE_H
#define K3RT_PLUGIN_QUANTILE_H

#include <k3rt/k3rt.h>

enum { QB_EXACT = 0, QB_HISTOGRAM = 1 };

typedef struct quantile_balancer {
    int device;
    k3rt_stream *stream;  /* the run's compute stream (create): where reset_stats zeroes */
    int E, k;             /* experts of the MoE layer, experts per token (k < E) */
    int mode;             /* QB_EXACT or QB_HISTOGRAM */
    int64_t bins;
    float *bias;          /* [E] the selection bias (state) */
    /* accumulated over the micro-batches of one step, cleared by update() */
    int64_t ntok;
    int64_t *hist;        /* [E, bins] histogram mode */
    double *r;            /* [ntok, E] required biases, exact mode */
    int64_t r_cap;        /* rows r can hold */
    double *top;          /* [k + 1] scratch of observe() */
    /* On CUDA bias, hist and r are device memory (hist as unsigned 64-bit counts) and work
     * holds the window (lo, w) and b_hat [E] (doubles). */
    double *work;
} quantile_balancer;

/* The window [lo, lo + bins * w) holding every required bias under the current bias. */
void quantile_window(const quantile_balancer *q, double *lo, double *w);
int quantile_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err);
int quantile_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err);

/* The same on CUDA (quantile_cuda.c, built with K3RT_PLUGIN_HAVE_CUDA): the state allocated
 * and freed on the device, the statistics and the update by the kernels of bal_cuda.h. */
int quantile_gpu_alloc(quantile_balancer *q, k3rt_error *err);
void quantile_gpu_free(quantile_balancer *q);
void quantile_gpu_reset(quantile_balancer *q);
int quantile_gpu_observe(quantile_balancer *q, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err);
int quantile_gpu_update(quantile_balancer *q, k3rt_stream *s, k3rt_comm *dp, k3rt_error *err);

#endif
