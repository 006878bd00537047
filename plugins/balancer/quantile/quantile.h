/* Quantile Balancing (Kimi K3): the instance shared by plugin.c (descriptor, state) and
 * quantile.c (the statistics and the update). Math: spec moe_balance_attnres.md §4. */
#ifndef K3RT_PLUGIN_QUANTILE_H
#define K3RT_PLUGIN_QUANTILE_H

#include <k3rt/k3rt.h>

enum { QB_EXACT = 0, QB_HISTOGRAM = 1 };

typedef struct qb {
    int device;
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
} qb;

/* The window [lo, lo + bins * w) holding every required bias under the current bias. */
void qb_window(const qb *q, double *lo, double *w);
int qb_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err);
int qb_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err);

#endif
