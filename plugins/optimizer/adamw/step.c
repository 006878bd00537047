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

static int check_param(const adamw *o, const adamw_param *p, const k3rt_param_ref *ref,
                       k3rt_error *err)
{
    if (!ref->param.data || !ref->grad.data)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: parameter %s: missing %s", p->name,
                         ref->param.data ? "gradient" : "weights");
    if (ref->param.dtype != o->dtype || ref->grad.dtype != o->dtype ||
        k3rt_tensor_numel(&ref->param) != p->n || k3rt_tensor_numel(&ref->grad) != p->n)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: parameter %s: expected %lld %s "
                         "elements as at create, got weights of %lld %s and a gradient of "
                         "%lld %s", p->name, (long long)p->n, k3rt_dtype_name(o->dtype),
                         (long long)k3rt_tensor_numel(&ref->param),
                         k3rt_dtype_name(ref->param.dtype),
                         (long long)k3rt_tensor_numel(&ref->grad),
                         k3rt_dtype_name(ref->grad.dtype));
    /* A host pointer handed to a CUDA kernel (or the reverse) would fault, not fail. */
    if (ref->param.device != o->device || ref->grad.device != o->device) {
        char w[32], g[32], want[32];
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: parameter %s: weights on %s and "
                         "gradient on %s, but the optimizer state lives on %s", p->name,
                         k3rt_device_str(ref->param.device, w, sizeof w),
                         k3rt_device_str(ref->grad.device, g, sizeof g),
                         k3rt_device_str(o->device, want, sizeof want));
    }
    return K3RT_OK;
}

int adamw_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err)
{
    adamw *o = self;
    if (a->n_params != o->n || (o->n > 0 && !a->params))
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: step got %d parameters, create got %d",
                         a->n_params, o->n);
    if (a->step < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: step number %lld is negative",
                         (long long)a->step);
    if (k3rt_stream_device(a->stream) != o->device) {
        char have[32], want[32];
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: step on a stream of %s, but the "
                         "optimizer state lives on %s",
                         k3rt_device_str(k3rt_stream_device(a->stream), have, sizeof have),
                         k3rt_device_str(o->device, want, sizeof want));
    }
    /* The engine's count wins (it survives resumes that skip or repeat steps); our own
     * count is the fallback when none is given. */
    int64_t t = a->step > 0 ? a->step : o->step + 1;
    for (int32_t i = 0; i < o->n; i++) {
        K3RT_TRY(check_param(o, &o->p[i], &a->params[i], err));
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
