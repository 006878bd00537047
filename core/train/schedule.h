/* Learning-rate schedule of `train` (warmup + cosine | linear | constant). */
#ifndef K3RT_SCHEDULE_H
#define K3RT_SCHEDULE_H

#include <stdint.h>

typedef struct lr_schedule {
    double lr;          /* peak, from the optimizer table */
    double min_ratio;   /* final lr = min_ratio * lr */
    int64_t warmup;     /* linear from 0 over these steps */
    int64_t steps;      /* total steps */
    char kind[16];      /* "cosine", "linear", "constant" */
} lr_schedule;

/* lr of a 1-based step. */
double schedule_lr(const lr_schedule *s, int64_t step);

#endif
