/* The built-in `none` balancer: a zero selection bias that never changes. */
#include "plugin/registry.h"

#include <stdlib.h>

typedef struct none_balancer {
    int device;
    int experts;
    float *bias;
} none_balancer;

static int none_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    if (a->n_experts <= 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "balancer none: needs a routed MoE layer");
    none_balancer *b = calloc(1, sizeof *b);
    if (!b)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "balancer none: out of memory");
    b->device = a->device;
    b->experts = a->n_experts;
    b->bias = k3rt_alloc(a->device, (size_t)a->n_experts * sizeof(float), err);
    if (!b->bias) {
        free(b);
        return err ? err->code : K3RT_ERR_NOMEM;
    }
    int rc = k3rt_memset(a->stream, b->bias, a->device, 0, (size_t)a->n_experts * sizeof(float),
                         err);
    if (rc) {
        k3rt_free(a->device, b->bias);
        free(b);
        return rc;
    }
    *self = b;
    return K3RT_OK;
}

static void none_destroy(void *self)
{
    none_balancer *b = self;
    if (b) {
        k3rt_free(b->device, b->bias);
        free(b);
    }
}

static int none_bias(void *self, k3rt_tensor *out, k3rt_error *err)
{
    (void)err;
    none_balancer *b = self;
    *out = k3rt_tensor_view(b->bias, K3RT_F32, b->device, 1, b->experts, 0, 0, 0);
    return K3RT_OK;
}

static int none_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err)
{
    (void)self, (void)s, (void)r, (void)err;
    return K3RT_OK;
}

static int none_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    (void)self, (void)s, (void)dp, (void)step, (void)err;
    return K3RT_OK;
}

static const k3rt_instance_vtable none_instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = none_create,
    .destroy = none_destroy,
};

static const k3rt_balancer_vtable none_vtable = {
    .struct_size = sizeof(k3rt_balancer_vtable),
    .bias = none_bias,
    .observe = none_observe,
    .update = none_update,
};

static const k3rt_plugin_descriptor none_descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "none",
    .kind = K3RT_KIND_BALANCER,
    .version = "1.0.0",
    .description = "no balancing: a zero selection bias",
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
    .option_size = sizeof(k3rt_option),
    .instance = &none_instance,
    .vtable = &none_vtable,
};

const k3rt_plugin_descriptor *builtin_none_balancer(void) { return &none_descriptor; }
