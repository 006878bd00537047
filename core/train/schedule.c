/* Learning-rate schedule: linear warmup, then cosine, linear or constant decay to
 * min_lr_ratio * lr at the last step. */
#include "train/schedule.h"

#include <math.h>
#include <string.h>

double schedule_lr(const lr_schedule *s, int64_t step)
{
    if (s->warmup > 0 && step <= s->warmup)
        return s->lr * (double)step / (double)s->warmup;
    if (!strcmp(s->kind, "constant") || s->steps <= s->warmup)
        return s->lr;
    double t = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    if (t > 1)
        t = 1;
    double floor = s->lr * s->min_ratio, span = s->lr - floor;
    if (!strcmp(s->kind, "linear"))
        return s->lr - span * t;
    return floor + 0.5 * span * (1.0 + cos(3.14159265358979323846 * t));
}
