/* adamw: AdamW with decoupled weight decay, chosen per parameter by its declared role. */
#ifndef ADAMW_H
#define ADAMW_H

#include <k3rt/k3rt.h>

typedef struct adamw_param {
    char *name;         /* full name, for state names and messages */
    int dtype;          /* of the parameter; m and v share it */
    int64_t n;
    int decayed;
    void *m, *v;        /* one allocation: m, then v */
} adamw_param;

typedef struct adamw {
    int device;
    double beta1, beta2, eps, weight_decay;
    int32_t n;
    adamw_param *p;
    int64_t step;       /* steps taken; host i64, checkpointed as "step" */
} adamw;

int adamw_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err);
int adamw_describe(void *self, int32_t index, char *buf, size_t len);

#endif
