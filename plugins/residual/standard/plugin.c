/* standard: descriptor, instance and counts of the plain pre-norm residual stream. */
#include "standard.h"

#include <stdlib.h>

int64_t standard_activation_bytes(const standard_residual *r, int64_t batch, int64_t seq)
{
    return batch * seq * r->d * (int64_t)k3rt_dtype_size(r->dtype);
}

static int standard_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    standard_residual *r = calloc(1, sizeof *r);
    if (!r)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "standard residual: out of memory");
    r->dtype = a->dtype;
    r->device = a->device;
    r->d = a->d_model;
    r->n_layers = a->n_layers;
    *self = r;
    return K3RT_OK;
}

static void standard_destroy(void *self) { free(self); }

/* One add per sublayer each way (2 sublayers per layer), an add counted as one FLOP. */
static int standard_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const standard_residual *r = self;
    double adds = 2.0 * r->n_layers * (double)(batch * seq) * (double)r->d;
    out->forward = adds;
    out->backward = adds;
    return K3RT_OK;
}

/* saved: the stream h and its gradient dh, [B, T, d] each; no scratch. */
static int standard_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    const standard_residual *r = self;
    out->saved_bytes = 2 * standard_activation_bytes(r, batch, seq);
    out->workspace_bytes = 0;
    out->state_bytes = 0;
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = standard_create,
    .destroy = standard_destroy,
    .flops = standard_flops,
    .memory = standard_memory,
};

static const k3rt_residual_vtable residual = {
    .struct_size = sizeof(k3rt_residual_vtable),
    .begin = standard_begin,
    .mix = standard_mix,
    .push = standard_push,
    .finish = standard_finish,
    .finish_backward = standard_finish_backward,
    .push_backward = standard_push_backward,
    .mix_backward = standard_mix_backward,
    .begin_backward = standard_begin_backward,
    .op_forward = standard_op_forward,
    .op_backward = standard_op_backward,
    .mix_norm = standard_mix_norm,
    .mix_norm_backward = standard_mix_norm_backward,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "standard",
    .kind = K3RT_KIND_RESIDUAL,
    .version = "1.0.0",
    .description = "pre-norm residual stream: each sublayer adds its output to the stream",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &residual,
};

K3RT_PLUGIN_EXPORT(descriptor)
