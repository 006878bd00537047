/* quantile: Quantile Balancing (Kimi K3) — descriptor, options, instance and checkpointed
 * state. The statistics and the update are in quantile.c. */
#include <stdlib.h>
#include <string.h>

#include "quantile.h"

static const k3rt_option options[] = {
    {"mode", K3RT_OPT_STRING, 0, "\"histogram\"", K3RT_RANGE_ANY, "histogram|exact",
     "histogram: per-expert histograms of the required biases, summed across data-parallel "
     "ranks (K3); exact: sort every rank's required biases (the oracle)"},
    {"bins", K3RT_OPT_INT, 0, "1000", 2, 1 << 24, NULL,
     "histogram bins over [min b - 1, max b + 1]; the bias error is about one bin width"},
};

static void quantile_destroy(void *self)
{
    quantile_balancer *q = self;
    if (!q)
        return;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (q->device != K3RT_DEVICE_CPU)
        quantile_gpu_free(q);
#endif
    free(q->bias);
    free(q->hist);
    free(q->r);
    free(q->top);
    free(q);
}

static int quantile_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    if (a->top_k >= a->n_experts)
        return k3rt_fail(err, K3RT_ERR_INVALID, "quantile: needs top_k < experts (the cutoff is "
                         "the (k+1)-th score), got top-%d of %d experts", a->top_k,
                         a->n_experts);
    quantile_balancer *q = calloc(1, sizeof *q);
    if (!q)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
    q->device = a->device;
    q->stream = a->stream;
    q->E = a->n_experts;
    q->k = a->top_k;
    q->mode = strcmp(k3rt_cfg_string(a->config, "mode"), "exact") ? QB_HISTOGRAM : QB_EXACT;
    q->bins = k3rt_cfg_int(a->config, "bins");
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (q->device != K3RT_DEVICE_CPU) {
        int rc = quantile_gpu_alloc(q, err);
        if (rc) {
            quantile_destroy(q);
            return rc;
        }
        *self = q;
        return K3RT_OK;
    }
#endif
    q->bias = calloc((size_t)q->E, sizeof *q->bias);
    q->top = calloc((size_t)q->k + 1, sizeof *q->top);
    if (q->mode == QB_HISTOGRAM)
        q->hist = calloc((size_t)(q->E * q->bins), sizeof *q->hist);
    if (!q->bias || !q->top || (q->mode == QB_HISTOGRAM && !q->hist)) {
        quantile_destroy(q);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
    }
    *self = q;
    return K3RT_OK;
}

static int quantile_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    const quantile_balancer *q = self;
    out->saved_bytes = 0;
    out->workspace_bytes = 0;
    /* the histograms, or one step's required biases (one micro-batch's worth shown) */
    out->state_bytes = q->E * (int64_t)sizeof(float) +
                       (q->mode == QB_HISTOGRAM ? q->E * q->bins * 8 : batch * seq * q->E * 8);
    return K3RT_OK;
}

/* Only the bias persists: the statistics are cleared by every update, and checkpoints are
 * taken between steps. */
static int quantile_state(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    quantile_balancer *q = self;
    k3rt_tensor t = k3rt_tensor_view(q->bias, K3RT_F32, q->device, 1, q->E, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "bias", t, K3RT_STAT_LOCAL, err);
}

/* Called at the start of every step: statistics of a step that was skipped (non-finite loss,
 * so no update) must not leak into the next one. */
static void quantile_reset(void *self)
{
    quantile_balancer *q = self;
    q->ntok = 0;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (q->device != K3RT_DEVICE_CPU) {
        quantile_gpu_reset(q);
        return;
    }
#endif
    if (q->hist)
        memset(q->hist, 0, (size_t)(q->E * q->bins) * sizeof *q->hist);
}

static int quantile_bias(void *self, k3rt_tensor *out, k3rt_error *err)
{
    (void)err;
    quantile_balancer *q = self;
    *out = k3rt_tensor_view(q->bias, K3RT_F32, q->device, 1, q->E, 0, 0, 0);
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = quantile_create,
    .destroy = quantile_destroy,
    .memory = quantile_memory,
    .state = quantile_state,
    .reset_stats = quantile_reset,
};

static const k3rt_balancer_vtable balancer = {
    .struct_size = sizeof(k3rt_balancer_vtable),
    .bias = quantile_bias,
    .observe = quantile_observe,
    .update = quantile_update,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "quantile",
    .kind = K3RT_KIND_BALANCER,
    .version = "1.0.0",
    .description = "Quantile Balancing (K3): per-expert bias from quantiles of the required "
                   "biases over the global batch, applied from the next step",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &balancer,
};

K3RT_PLUGIN_EXPORT(descriptor)
