/* adamw: AdamW with decoupled weight decay, chosen per parameter by its declared role. */
#ifndef ADAMW_H
#define ADAMW_H

#include <k3rt/k3rt.h>

typedef struct adamw_param {
    char *name;         /* full name, for state names and messages */
    int64_t n;
    int decayed;
    void *m, *v;        /* one allocation on the run's device: m, then v */
} adamw_param;

typedef struct adamw {
    int device;         /* K3RT_DEVICE_CPU or a CUDA ordinal: where the moments live */
    int dtype;          /* of every master weight, gradient and moment: f32 (f64 in CPU tests) */
    double beta1, beta2, eps, weight_decay;
    int32_t n;
    adamw_param *p;
    /* k3rt_adamw_step_multi's host arrays, one entry per parameter: lengths, decays and
     * moments fixed at create, weight and gradient pointers refreshed at every step. */
    void **w;
    const void **g;
    void **m, **v;
    int64_t *len;
    double *wd;
    int64_t step;       /* steps taken; host i64, checkpointed as "step" */
} adamw;

int adamw_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err);
int adamw_describe(void *self, int32_t index, char *buf, size_t len);

#endif
