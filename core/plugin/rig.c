/* The instance rig: creation, parameters, initialisation, statistics, and the argument checks
 * and teardown the other rig files (buffers, calls, kinds) build on (rig.h). */
#include "plugin/rig.h"

#include <k3rt/ops.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

int rig_fail(const rig *r, int rc, k3rt_error *err)
{
    if (rc && err)
        k3rt_error_prefix(err, "%s: ", r->where);
    return rc;
}

/* The device and dtype of a create call against the descriptor's caps. */
static int check_caps(const rig *r, const k3rt_create_args *a, k3rt_error *err)
{
    uint64_t caps = r->e->desc.caps;
    char dev[32], have[96];
    plugin_caps_str(r->e, 0, have, sizeof have);
    k3rt_device_str(a->device, dev, sizeof dev);
    if (a->device < K3RT_DEVICE_CPU)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: device %d is neither the CPU (-1) nor a "
                         "CUDA ordinal", r->where, a->device);
    int cpu = a->device == K3RT_DEVICE_CPU;
    if (!(caps & (cpu ? K3RT_CAP_CPU : K3RT_CAP_CUDA)))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no %s implementation "
                         "(its caps: %s), so it cannot run on %s; %s", r->where,
                         cpu ? "CPU" : "CUDA", have, dev,
                         cpu ? "run it on a GPU" : "run on the CPU (plan.device = \"cpu\", or "
                         "\"auto\" to choose by the plugins' caps)");
    int ok = cpu ? a->dtype == K3RT_F32 || (a->dtype == K3RT_F64 && (caps & K3RT_CAP_F64))
                 : a->dtype == K3RT_F32 || a->dtype == K3RT_BF16;
    if (!ok)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: cannot compute in %s on %s (the "
                         "plugin's caps: %s; the CPU runs f32, or f64 with the f64 cap; CUDA "
                         "runs f32 or bf16)", r->where, k3rt_dtype_name(a->dtype), dev, have);
    int shaped = a->kind == K3RT_KIND_ATTENTION || a->kind == K3RT_KIND_MOE ||
                 a->kind == K3RT_KIND_RESIDUAL;
    if (shaped && (a->d_model < 1 || a->n_layers < 1))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: d_model (%lld) and n_layers (%d) must be "
                         ">= 1", r->where, (long long)a->d_model, a->n_layers);
    if (a->kind == K3RT_KIND_BALANCER &&
        (a->n_experts < 1 || a->top_k < 1 || a->top_k > a->n_experts))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a balancer serves a routed MoE layer; "
                         "got %d experts with top-%d", r->where, a->n_experts, a->top_k);
    if (a->kind == K3RT_KIND_OPTIMIZER && a->n_params > 0 && !a->params)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %d parameters given without a list",
                         r->where, a->n_params);
    return K3RT_OK;
}

/* A routed MoE's experts() must agree with itself: 0 experts, or 1 <= top_k <= experts. */
static int read_experts(rig *r, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_MOE || !r->e->vt.moe.experts)
        return K3RT_OK;
    r->e->vt.moe.experts(r->self, &r->experts, &r->top_k);
    if (r->experts < 0 || r->top_k < 0 ||
        (r->experts > 0 && (r->top_k < 1 || r->top_k > r->experts)))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: reports %d experts with top-%d", r->where,
                         r->experts, r->top_k);
    return K3RT_OK;
}

int rig_create(rig *r, const plugin_entry *e, const json_t *config, const k3rt_create_args *args,
               const char *where, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->e = e;
    r->kind = e->desc.kind;
    snprintf(r->where, sizeof r->where, "%s (%s)", where, e->desc.name);
    k3rt_create_args a = *args;
    a.struct_size = sizeof a;
    a.kind = e->desc.kind;
    K3RT_TRY(check_caps(r, &a, err));
    r->config = config ? json_deep_copy(config) : json_object();
    if (!r->config)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", r->where);
    int rc = options_apply(e->desc.options, e->desc.n_options, e->desc.option_size, r->config,
                           r->where, err);
    if (rc) {
        rig_destroy(r);
        return rc;
    }
    a.config = config_of(r->config);
    r->dtype = a.dtype;
    r->grad_dtype = a.dtype == K3RT_BF16 ? K3RT_F32 : a.dtype;
    r->device = a.device;
    r->deterministic = a.deterministic;
    r->stream = a.stream;
    r->d = a.d_model;
    r->n_sublayers = 2 * a.n_layers;
    r->n_refs = a.n_params;
    if (r->kind == K3RT_KIND_BALANCER)
        r->experts = a.n_experts, r->top_k = a.top_k;
    for (int i = 0; !rc && r->kind == K3RT_KIND_OPTIMIZER && i < a.n_params; i++)
        rc = rig_check_ref(r, &a.params[i], i, err);
    if (!rc)
        rc = e->inst.create(&a, &r->self, err);
    if (rc) {
        r->self = NULL;
        rig_fail(r, rc, err);
        rig_destroy(r);
        return rc;
    }
    if (e->inst.declare_params)
        rc = rig_fail(r, e->inst.declare_params(r->self, &r->decls, err), err);
    if (!rc)
        rc = read_experts(r, err);
    if (rc)
        rig_destroy(r);
    return rc;
}

static void free_params(rig *r)
{
    if (r->own_params) {
        for (int i = 0; i < rig_n_params(r); i++) {
            k3rt_free(r->device, r->params[i].data);
            k3rt_free(r->device, r->grads[i].data);
        }
        free(r->params);
        free(r->grads);
    }
    r->params = r->grads = NULL;
    r->own_params = 0;
}

void rig_destroy(rig *r)
{
    if (r->self && r->e)
        r->e->inst.destroy(r->self);
    r->self = NULL;
    rig_unbind_shape(r);
    free_params(r);
    param_sink_free(&r->decls);
    if (r->config)
        json_decref(r->config);
    r->config = NULL;
}

/* ---- parameters ------------------------------------------------------------------------------ */

static k3rt_tensor decl_tensor(const rig *r, const k3rt_param_decl *d, int dtype, void *data)
{
    k3rt_tensor t = k3rt_tensor_view(data, dtype, r->device, d->ndim, d->shape[0], d->shape[1],
                                     d->shape[2], d->shape[3]);
    return t;
}

int rig_bind_params(rig *r, k3rt_tensor *params, k3rt_tensor *grads, k3rt_error *err)
{
    int n = rig_n_params(r);
    if (n && (!params || !grads))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %d parameters to bind, none given",
                         r->where, n);
    for (int i = 0; i < n; i++) {
        const k3rt_param_decl *d = rig_param(r, i);
        char what[192];
        snprintf(what, sizeof what, "parameter %s", d->name);
        K3RT_TRY(rig_expect(r, &params[i], what, r->dtype, d->ndim, d->shape, err));
        snprintf(what, sizeof what, "gradient of %s", d->name);
        K3RT_TRY(rig_expect(r, &grads[i], what, r->grad_dtype, d->ndim, d->shape, err));
    }
    free_params(r);
    r->params = params;
    r->grads = grads;
    return K3RT_OK;
}

int rig_alloc_params(rig *r, k3rt_error *err)
{
    int n = rig_n_params(r);
    k3rt_tensor *p = calloc((size_t)n + 1, sizeof *p), *g = calloc((size_t)n + 1, sizeof *g);
    if (!p || !g) {
        free(p), free(g);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", r->where);
    }
    free_params(r);
    r->params = p, r->grads = g, r->own_params = 1;
    for (int i = 0; i < n; i++) {
        const k3rt_param_decl *d = rig_param(r, i);
        p[i] = decl_tensor(r, d, r->dtype, NULL);
        g[i] = decl_tensor(r, d, r->grad_dtype, NULL);
        size_t pb = k3rt_tensor_bytes(&p[i]), gb = k3rt_tensor_bytes(&g[i]);
        p[i].data = k3rt_alloc(r->device, pb, err);
        g[i].data = p[i].data ? k3rt_alloc(r->device, gb, err) : NULL;
        if (!g[i].data)
            return rig_fail(r, err && err->code ? err->code : K3RT_ERR_NOMEM, err);
        K3RT_TRY(k3rt_memset(r->stream, p[i].data, r->device, 0, pb, err));
        K3RT_TRY(k3rt_memset(r->stream, g[i].data, r->device, 0, gb, err));
    }
    return K3RT_OK;
}

int param_init_values(const k3rt_param_decl *d, k3rt_tensor t, uint64_t seed,
                      const char *full_name, rig *owner, k3rt_error *err)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, k3rt_hash_string(full_name));
    int64_t n = k3rt_tensor_numel(&t);
    k3rt_stream *cpu = k3rt_host_stream();
    switch (d->init) {
    case K3RT_INIT_ZEROS: return k3rt_fill(cpu, t.dtype, t.data, n, 0.0, err);
    case K3RT_INIT_ONES: return k3rt_fill(cpu, t.dtype, t.data, n, 1.0, err);
    case K3RT_INIT_CONST: return k3rt_fill(cpu, t.dtype, t.data, n, d->init_a, err);
    case K3RT_INIT_NORMAL: return k3rt_fill_normal(&t, &rng, 0.0, d->init_a, err);
    case K3RT_INIT_UNIFORM: return k3rt_fill_uniform(&t, &rng, d->init_a, d->init_b, err);
    case K3RT_INIT_PLUGIN:
        if (!owner || !owner->e->inst.init_param)
            return k3rt_fail(err, K3RT_ERR_ABI, "parameter %s asks for plugin init but its "
                             "owner has no init_param", full_name);
        return rig_fail(owner, owner->e->inst.init_param(owner->self, d, t, &rng, err), err);
    default:
        return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s has unknown init %d", full_name,
                         d->init);
    }
}

int rig_init_param(rig *r, int i, k3rt_tensor t, uint64_t seed, const char *full_name,
                   k3rt_error *err)
{
    return param_init_values(rig_param(r, i), t, seed, full_name, r, err);
}

/* ---- counts, state and statistics ------------------------------------------------------------ */

int rig_memory(rig *r, int64_t batch, int64_t seq, k3rt_memory *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (!r->e->inst.memory)
        return K3RT_OK;
    k3rt_memory got;
    memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    int rc = r->e->inst.memory(r->self, batch, seq, &got);
    if (rc)
        return rig_fail(r, k3rt_fail(err, rc, "memory(%lld, %lld) failed", (long long)batch,
                                     (long long)seq), err);
    if (got.saved_bytes < 0 || got.workspace_bytes < 0 || got.state_bytes < 0)
        return rig_fail(r, k3rt_fail(err, K3RT_ERR_INVALID, "memory() returned a negative "
                                     "byte count"), err);
    *out = got;
    return K3RT_OK;
}

int rig_flops(rig *r, int64_t batch, int64_t seq, k3rt_flops *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (!r->e->inst.flops)
        return K3RT_OK;
    int rc = r->e->inst.flops(r->self, batch, seq, out);
    if (rc)
        return rig_fail(r, k3rt_fail(err, rc, "flops() failed"), err);
    return K3RT_OK;
}

int rig_state(rig *r, struct k3rt_tensor_sink *sink, k3rt_error *err)
{
    memset(sink, 0, sizeof *sink);
    if (!r->e->inst.state)
        return K3RT_OK;
    return rig_fail(r, r->e->inst.state(r->self, sink, err), err);
}

int rig_state_loaded(rig *r, k3rt_error *err)
{
    if (!r->e->inst.state_loaded)
        return K3RT_OK;
    return rig_fail(r, r->e->inst.state_loaded(r->self, err), err);
}

int rig_stats(rig *r, struct k3rt_tensor_sink *sink, k3rt_error *err)
{
    memset(sink, 0, sizeof *sink);
    if (!r->e->inst.stats)
        return K3RT_OK;
    return rig_fail(r, r->e->inst.stats(r->self, sink, err), err);
}

void rig_reset_stats(rig *r)
{
    if (r->e->inst.reset_stats)
        r->e->inst.reset_stats(r->self);
}

/* ---- checks and teardown every other rig file builds on (so none of them calls back up) ---- */

/* "[2, *, 16]": a wanted shape, wildcards (< 0) as '*'. */
static const char *want_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += shape[i] < 0 ? (size_t)snprintf(buf + at, len - at, i ? ", *" : "*")
                           : (size_t)snprintf(buf + at, len - at, i ? ", %lld" : "%lld",
                                              (long long)shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
    return buf;
}

int rig_expect(const rig *r, const k3rt_tensor *t, const char *what, int dtype, int ndim,
               const int64_t *shape, k3rt_error *err)
{
    char have[96], want[96], dev[32], tdev[32];
    int ok = t->ndim == ndim && t->dtype == dtype && t->device == r->device && t->data;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || t->shape[i] == shape[i];
    if (ok)
        return K3RT_OK;
    want_str(ndim, shape, want, sizeof want);
    k3rt_device_str(r->device, dev, sizeof dev);
    if (t->ndim == 0 || !t->data)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s is missing (expected %s %s on %s)",
                         r->where, what, k3rt_dtype_name(dtype), want, dev);
    return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s: expected %s %s on %s, got %s %s on %s",
                     r->where, what, k3rt_dtype_name(dtype), want, dev,
                     k3rt_dtype_name(t->dtype), k3rt_tensor_shape_str(t, have, sizeof have),
                     k3rt_device_str(t->device, tdev, sizeof tdev));
}

int rig_check_ref(const rig *r, const k3rt_param_ref *p, int i, k3rt_error *err)
{
    if (!p->decl || !p->name)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: parameter %d has no name or declaration",
                         r->where, i);
    if (p->decl->role <= 0 || p->decl->role >= K3RT_ROLE_COUNT_)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: parameter %s has unknown role %d",
                         r->where, p->name, p->decl->role);
    char what[224];
    snprintf(what, sizeof what, "parameter %s", p->name);
    K3RT_TRY(rig_expect(r, &p->param, what, r->dtype, p->decl->ndim, p->decl->shape, err));
    snprintf(what, sizeof what, "gradient of %s", p->name);
    K3RT_TRY(rig_expect(r, &p->grad, what, r->dtype, p->decl->ndim, p->decl->shape, err));
    if (p->head_max_logit.ndim) {
        if (p->decl->qk_clip == K3RT_QK_NONE)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: max logits given for %s, which has no "
                             "QK-clip", r->where, p->name);
        const int64_t h[1] = {p->decl->heads};
        snprintf(what, sizeof what, "max logits of %s", p->name);
        K3RT_TRY(rig_expect(r, &p->head_max_logit, what, K3RT_F32, 1, h, err));
    }
    return K3RT_OK;
}

void rig_unbind_shape(rig *r)
{
    if (r->own_buffers) {
        k3rt_free(r->device, r->saved_block);
        k3rt_free(r->device, r->ws);
    }
    r->own_buffers = 0;
    memset(r->saved, 0, sizeof r->saved);
    r->saved_block = r->ws = NULL;
    r->n_saved = 0;
    r->guard = 0;
    r->B = r->T = 0;
}
