/* adamw: one optimizer step over every parameter, and the per-parameter rule description.
 *
 *   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
 *   p = p (1 - lr wd) - lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 *
 * with wd = weight_decay for decayed roles and 0 otherwise, lr the scheduled rate the engine
 * passes, and t the 1-based step. The element loop is the core op k3rt_adamw_step_multi over
 * all parameters at once: on CUDA one fused kernel launch updates every tensor. */
#include "adamw.h"

#include <stdio.h>

int adamw_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err)
{
    adamw *o = self;
    int64_t t = a->step;  /* the engine's count: it survives resumes that skip or repeat steps */
    for (int32_t i = 0; i < o->n; i++) {
        o->w[i] = a->params[i].param.data;
        o->g[i] = a->params[i].grad.data;
    }
    if (k3rt_adamw_step_multi(a->stream, o->dtype, o->n, o->w, o->g, o->m, o->v, o->len, o->wd,
                              a->lr, o->beta1, o->beta2, o->eps, t, err))
        return k3rt_error_prefix(err, "adamw: ");
    o->step = t;
    return K3RT_OK;
}

int adamw_describe(void *self, int32_t index, char *buf, size_t len)
{
    const adamw *o = self;
    if (!buf || !len)
        return K3RT_ERR_INVALID;
    if (index < 0 || index >= o->n) {
        buf[0] = '\0';
        return K3RT_ERR_INVALID;
    }
    snprintf(buf, len, "%s", o->p[index].decayed ? "adamw" : "adamw (no decay)");
    return K3RT_OK;
}
