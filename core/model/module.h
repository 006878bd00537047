/* One live plugin instance with the parameters it declared: the piece shared by the model,
 * `k3rt op`, the finite-difference checker and the conformance harness. Every error coming
 * out of a plugin call is prefixed with the instance's place ("layers.3.mixer (kda): "). */
#ifndef K3RT_MODEL_MODULE_H
#define K3RT_MODEL_MODULE_H

#include <k3rt/plugin.h>

#include "plugin/registry.h"
#include "plugin/sinks.h"

typedef struct module {
    const plugin_entry *e;
    void *self;
    json_t *config;              /* validated config (a reference is held) */
    struct k3rt_param_sink decls;
    char where[128];             /* "layers.3.mixer (kda)" for messages */
} module;

/* Validates a copy of config against the plugin's options, creates the instance and collects
 * its parameter declarations. args->config is replaced by the validated copy. */
int module_create(module *m, const plugin_entry *e, const json_t *config,
                  const k3rt_create_args *args, const char *where, k3rt_error *err);
void module_destroy(module *m);

static inline int module_n_params(const module *m) { return m->decls.n; }
static inline const k3rt_param_decl *module_param(const module *m, int i)
{
    return &m->decls.items[i].decl;
}

/* Fills host tensor t (f32/f64) per the declaration's init; the generator is seeded from
 * (seed, full_name) so a parameter's values do not depend on creation order or rank. */
int module_init_param(module *m, int i, k3rt_tensor t, uint64_t seed, const char *full_name,
                      k3rt_error *err);
/* The same for any declaration; owner (may be NULL) serves K3RT_INIT_PLUGIN. */
int param_init_values(const k3rt_param_decl *d, k3rt_tensor t, uint64_t seed,
                      const char *full_name, module *owner, k3rt_error *err);
/* Zero-extended results of the optional instance functions (zeros when not provided). */
int module_memory(module *m, int64_t batch, int64_t seq, k3rt_memory *out, k3rt_error *err);
int module_flops(module *m, int64_t batch, int64_t seq, k3rt_flops *out, k3rt_error *err);
/* Collects state() or stats() tensors (the sink must be freed with tensor_sink_free). */
int module_state(module *m, struct k3rt_tensor_sink *sink, k3rt_error *err);
int module_stats(module *m, struct k3rt_tensor_sink *sink, k3rt_error *err);

/* Prefixes err with the module's place; returns rc (for `return module_fail(m, rc, err)`). */
int module_fail(const module *m, int rc, k3rt_error *err);

#endif
