/* adamw: descriptor, options, state allocation and checkpointed state. */
#include "adamw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const k3rt_option options[] = {
    {"beta1", K3RT_OPT_FLOAT, 0, "0.9", 0, 1, NULL, "first-moment decay, in [0, 1)"},
    {"beta2", K3RT_OPT_FLOAT, 0, "0.95", 0, 1, NULL, "second-moment decay, in [0, 1)"},
    {"eps", K3RT_OPT_FLOAT, 0, "1e-8", 0, 1, NULL, "added to sqrt(v_hat), > 0"},
    {"weight_decay", K3RT_OPT_FLOAT, 0, "0.1", 0, 100, NULL,
     "decoupled decay p *= 1 - lr*wd, applied to matrix, head_matrix, expert_matrix, router, "
     "embedding and output_head roles (never to norm_gain, vector, conv or no-decay params)"},
};

/* Whether weight decay applies to a role (the option's help says which). */
static int role_decays(int role)
{
    return role != K3RT_ROLE_NORM_GAIN && role != K3RT_ROLE_VECTOR && role != K3RT_ROLE_CONV;
}

static void adamw_destroy(void *self)
{
    adamw *o = self;
    if (!o)
        return;
    for (int32_t i = 0; o->p && i < o->n; i++) {
        k3rt_free(o->device, o->p[i].m);
        free(o->p[i].name);
    }
    free(o->p);
    free(o->w), free(o->g), free(o->m), free(o->v), free(o->len), free(o->wd);
    free(o);
}

static size_t aligned_bytes(const adamw *o, const adamw_param *p)
{
    return (p->n * k3rt_dtype_size(o->dtype) + 63) & ~(size_t)63;
}

/* Records parameter ref's layout and decay, and allocates its zeroed moments. */
static int add_param(adamw *o, const k3rt_param_ref *ref, k3rt_stream *s, adamw_param *p,
                     k3rt_error *err)
{
    const char *name = ref->name;
    size_t len = strlen(name) + 1;
    p->name = malloc(len);
    if (!p->name)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "adamw: out of memory");
    memcpy(p->name, name, len);
    p->decayed = role_decays(ref->decl->role) && !(ref->decl->flags & K3RT_PARAM_NO_DECAY);
    p->n = k3rt_tensor_numel(&ref->param);
    size_t half = aligned_bytes(o, p);
    p->m = k3rt_alloc(o->device, 2 * half, err);
    if (!p->m)
        return k3rt_error_prefix(err, "adamw: moments of %s: ", name);
    p->v = (char *)p->m + half;
    return k3rt_memset(s, p->m, o->device, 0, 2 * half, err);
}

/* The multi-tensor op's argument arrays; the per-parameter entries are filled by add_param's
 * caller. */
static int alloc_tables(adamw *o, int32_t n, k3rt_error *err)
{
    size_t k = (size_t)n + 1;
    o->p = calloc(k, sizeof *o->p);
    o->w = calloc(k, sizeof *o->w);
    o->g = calloc(k, sizeof *o->g);
    o->m = calloc(k, sizeof *o->m);
    o->v = calloc(k, sizeof *o->v);
    o->len = calloc(k, sizeof *o->len);
    o->wd = calloc(k, sizeof *o->wd);
    if (!o->p || !o->w || !o->g || !o->m || !o->v || !o->len || !o->wd)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "adamw: out of memory");
    return K3RT_OK;
}

static int adamw_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    /* the CUDA step updates f32 master weights only (k3rt_adamw_step_multi) */
    if (a->device != K3RT_DEVICE_CPU && a->dtype != K3RT_F32)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "adamw: master weights on CUDA must be f32, "
                         "not %s", k3rt_dtype_name(a->dtype));
    double b1 = k3rt_cfg_float(a->config, "beta1"), b2 = k3rt_cfg_float(a->config, "beta2");
    double eps = k3rt_cfg_float(a->config, "eps");
    if (b1 >= 1 || b2 >= 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: key '%s' must be < 1 (the bias "
                         "correction divides by 1 - beta^step), got %g",
                         b1 >= 1 ? "beta1" : "beta2", b1 >= 1 ? b1 : b2);
    if (!(eps > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw: key 'eps' must be > 0, got %g", eps);
    adamw *o = calloc(1, sizeof *o);
    if (!o)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "adamw: out of memory");
    o->device = a->device;
    o->dtype = a->dtype;
    o->beta1 = b1;
    o->beta2 = b2;
    o->eps = eps;
    o->weight_decay = k3rt_cfg_float(a->config, "weight_decay");
    int rc = alloc_tables(o, a->n_params, err);
    for (int32_t i = 0; !rc && i < a->n_params; i++) {
        o->n = i + 1;  /* so destroy frees what this iteration allocated */
        adamw_param *p = &o->p[i];
        rc = add_param(o, &a->params[i], a->stream, p, err);
        o->m[i] = p->m;
        o->v[i] = p->v;
        o->len[i] = p->n;
        o->wd[i] = p->decayed ? o->weight_decay : 0.0;
    }
    if (rc) {
        adamw_destroy(o);
        return rc;
    }
    o->n = a->n_params;
    *self = o;
    return K3RT_OK;
}

static int adamw_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    (void)batch, (void)seq;
    const adamw *o = self;
    out->saved_bytes = 0;
    out->workspace_bytes = 0;
    out->state_bytes = 0;
    for (int32_t i = 0; i < o->n; i++)
        out->state_bytes += 2 * o->p[i].n * (int64_t)k3rt_dtype_size(o->dtype);
    return K3RT_OK;
}

/* The live moments "<param>.m" / "<param>.v" on the run's device (device memory on CUDA: the
 * host copies through, as the tensor's device says) and the step counter "step" [1] i64 on the
 * host. */
static int adamw_state(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    adamw *o = self;
    char name[256];
    for (int32_t i = 0; i < o->n; i++) {
        const adamw_param *p = &o->p[i];
        k3rt_tensor m = k3rt_tensor_view(p->m, o->dtype, o->device, 1, p->n, 0, 0, 0);
        k3rt_tensor v = k3rt_tensor_view(p->v, o->dtype, o->device, 1, p->n, 0, 0, 0);
        snprintf(name, sizeof name, "%s.m", p->name);
        K3RT_TRY(k3rt_tensor_sink_add(sink, name, m, K3RT_STAT_LOCAL, err));
        snprintf(name, sizeof name, "%s.v", p->name);
        K3RT_TRY(k3rt_tensor_sink_add(sink, name, v, K3RT_STAT_LOCAL, err));
    }
    k3rt_tensor step = k3rt_tensor_view(&o->step, K3RT_I64, K3RT_DEVICE_CPU, 1, 1, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "step", step, K3RT_STAT_LOCAL, err);
}

static int adamw_state_loaded(void *self, k3rt_error *err)
{
    const adamw *o = self;
    if (o->step < 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "adamw: loaded step counter is %lld (expected "
                         ">= 0)", (long long)o->step);
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = adamw_create,
    .destroy = adamw_destroy,
    .memory = adamw_memory,
    .state = adamw_state,
    .state_loaded = adamw_state_loaded,
};

static const k3rt_optimizer_vtable optimizer = {
    .struct_size = sizeof(k3rt_optimizer_vtable),
    .step = adamw_step,
    .describe = adamw_describe,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "adamw",
    .kind = K3RT_KIND_OPTIMIZER,
    .version = "1.0.0",
    .description = "AdamW with decoupled weight decay chosen by parameter role",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &optimizer,
};

K3RT_PLUGIN_EXPORT(descriptor)
