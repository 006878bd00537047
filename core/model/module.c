/* Live plugin instances (module.h). */
#include "model/module.h"

#include <k3rt/ops.h>

#include "backend/backend.h"

#include <string.h>

int module_fail(const module *m, int rc, k3rt_error *err)
{
    if (rc && err)
        k3rt_error_prefix(err, "%s: ", m->where);
    return rc;
}

int module_create(module *m, const plugin_entry *e, const json_t *config,
                  const k3rt_create_args *args, const char *where, k3rt_error *err)
{
    memset(m, 0, sizeof *m);
    m->e = e;
    snprintf(m->where, sizeof m->where, "%s (%s)", where, e->desc.name);
    m->config = config ? json_deep_copy(config) : json_object();
    if (!m->config)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", m->where);
    int rc = k3rt_options_apply(e->desc.options, e->desc.n_options, e->desc.option_size,
                                m->config, m->where, err);
    if (rc) {
        json_decref(m->config);
        m->config = NULL;
        return rc;
    }
    k3rt_create_args a = *args;
    a.struct_size = sizeof a;
    a.kind = e->desc.kind;
    a.config = m->config;
    rc = e->inst.create(&a, &m->self, err);
    if (rc) {
        json_decref(m->config);
        m->config = NULL;
        m->self = NULL;
        return module_fail(m, rc, err);
    }
    if (e->inst.declare_params) {
        rc = e->inst.declare_params(m->self, &m->decls, err);
        if (rc) {
            module_fail(m, rc, err);
            module_destroy(m);
            return rc;
        }
    }
    return K3RT_OK;
}

void module_destroy(module *m)
{
    if (m->self && m->e)
        m->e->inst.destroy(m->self);
    m->self = NULL;
    param_sink_free(&m->decls);
    if (m->config)
        json_decref(m->config);
    m->config = NULL;
}

int param_init_values(const k3rt_param_decl *d, k3rt_tensor t, uint64_t seed,
                      const char *full_name, module *owner, k3rt_error *err)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, k3rt_hash_string(full_name));
    int64_t n = k3rt_tensor_numel(&t);
    k3rt_stream *cpu = cpu_host_stream();
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
        return module_fail(owner, owner->e->inst.init_param(owner->self, d, t, &rng, err), err);
    default:
        return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s has unknown init %d", full_name,
                         d->init);
    }
}

int module_init_param(module *m, int i, k3rt_tensor t, uint64_t seed, const char *full_name,
                      k3rt_error *err)
{
    return param_init_values(module_param(m, i), t, seed, full_name, m, err);
}

int module_memory(module *m, int64_t batch, int64_t seq, k3rt_memory *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (!m->e->inst.memory)
        return K3RT_OK;
    k3rt_memory got;
    memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    int rc = m->e->inst.memory(m->self, batch, seq, &got);
    if (rc)
        return module_fail(m, k3rt_fail(err, rc, "memory() failed"), err);
    if (got.saved_bytes < 0 || got.workspace_bytes < 0 || got.state_bytes < 0)
        return module_fail(m, k3rt_fail(err, K3RT_ERR_INVALID, "memory() returned a negative "
                                        "byte count"), err);
    *out = got;
    return K3RT_OK;
}

int module_flops(module *m, int64_t batch, int64_t seq, k3rt_flops *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (!m->e->inst.flops)
        return K3RT_OK;
    int rc = m->e->inst.flops(m->self, batch, seq, out);
    if (rc)
        return module_fail(m, k3rt_fail(err, rc, "flops() failed"), err);
    return K3RT_OK;
}

int module_state(module *m, struct k3rt_tensor_sink *sink, k3rt_error *err)
{
    memset(sink, 0, sizeof *sink);
    if (!m->e->inst.state)
        return K3RT_OK;
    return module_fail(m, m->e->inst.state(m->self, sink, err), err);
}

int module_stats(module *m, struct k3rt_tensor_sink *sink, k3rt_error *err)
{
    memset(sink, 0, sizeof *sink);
    if (!m->e->inst.stats)
        return K3RT_OK;
    return module_fail(m, m->e->inst.stats(m->self, sink, err), err);
}
