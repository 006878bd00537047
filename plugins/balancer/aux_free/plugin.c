/* aux_free: DeepSeek-V3's auxiliary-loss-free balancing (spec moe_balance_attnres.md §3).
 *
 * After every optimizer step, with c_i the tokens routed to expert i over the step's global
 * batch (summed across data-parallel ranks) and c_mean = sum_i c_i / E:
 *   b_i <- b_i + gamma * sign(c_mean - c_i)
 * The bias only enters the selection and is installed for the next step. On CUDA the bias and
 * the counts live on the device and the kernels of bal_cuda.h accumulate and update them. */
#include <stdlib.h>
#include <string.h>

#include <k3rt/k3rt.h>

#ifdef K3RT_PLUGIN_HAVE_CUDA
#include "bal_cuda.h"
#endif

static const k3rt_option options[] = {
    {"gamma", K3RT_OPT_FLOAT, 0, "0.001", 0, 1e3, NULL,
     "bias step per update (DeepSeek-V3: 0.001, then 0 for the last tokens)"},
};

typedef struct aux_free {
    int E, device;
    k3rt_stream *stream;  /* the run's compute stream (create): where reset_stats zeroes */
    double gamma;
    float *bias;      /* [E] state */
    int64_t *counts;  /* [E] tokens per expert since the last update */
} aux_free;

static void aux_free_destroy(void *self)
{
    aux_free *b = self;
    if (!b)
        return;
    k3rt_free(b->device, b->bias);
    k3rt_free(b->device, b->counts);
    free(b);
}

static int aux_free_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    aux_free *b = calloc(1, sizeof *b);
    if (!b)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "aux_free: out of memory");
    b->E = a->n_experts;
    b->device = a->device;
    b->stream = a->stream;
    b->gamma = k3rt_cfg_float(a->config, "gamma");
    size_t bb = (size_t)b->E * sizeof *b->bias, cb = (size_t)b->E * sizeof *b->counts;
    b->bias = k3rt_alloc(b->device, bb, err);
    b->counts = b->bias ? k3rt_alloc(b->device, cb, err) : NULL;
    int rc = b->counts ? K3RT_OK : err->code ? err->code : K3RT_ERR_NOMEM;
    if (!rc && b->device == K3RT_DEVICE_CPU) {
        memset(b->bias, 0, bb);
        memset(b->counts, 0, cb);
    }
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (!rc && b->device != K3RT_DEVICE_CPU) {
        void *st = k3rt_stream_native(b->stream);
        rc = bal_cu_enter(b->device, err);
        if (!rc)
            rc = bal_cu_zero(st, b->bias, bb, err);
        if (!rc)
            rc = bal_cu_zero(st, b->counts, cb, err);
    }
#endif
    if (rc) {
        aux_free_destroy(b);
        return rc;
    }
    *self = b;
    return K3RT_OK;
}

static int aux_free_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    (void)batch, (void)seq;
    const aux_free *b = self;
    out->saved_bytes = 0;
    out->workspace_bytes = 0;
    out->state_bytes = b->E * (int64_t)(sizeof(float) + sizeof(int64_t));
    return K3RT_OK;
}

/* The counts are cleared by every update and checkpoints are taken between steps. */
static int aux_free_state(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    aux_free *b = self;
    k3rt_tensor t = k3rt_tensor_view(b->bias, K3RT_F32, b->device, 1, b->E, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "bias", t, K3RT_STAT_LOCAL, err);
}

static int aux_free_bias(void *self, k3rt_tensor *out, k3rt_error *err)
{
    (void)err;
    aux_free *b = self;
    *out = k3rt_tensor_view(b->bias, K3RT_F32, b->device, 1, b->E, 0, 0, 0);
    return K3RT_OK;
}

/* Called at the start of every step: the counts of a skipped step (no update) are dropped. */
static void aux_free_reset(void *self)
{
    aux_free *b = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (b->device != K3RT_DEVICE_CPU) {
        k3rt_error err = {0};
        bal_cu_zero(k3rt_stream_native(b->stream), b->counts,
                    (size_t)b->E * sizeof *b->counts, &err);
        return;
    }
#endif
    memset(b->counts, 0, (size_t)b->E * sizeof *b->counts);
}

static int aux_free_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err)
{
    aux_free *b = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (b->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(bal_cu_enter(b->device, err));
        return aux_free_cu_accumulate(k3rt_stream_native(s), r->counts.data, b->E, b->counts, err);
    }
#endif
    (void)s;
    (void)err;
    const int64_t *c = r->counts.data;
    for (int e = 0; e < b->E; e++)
        b->counts[e] += c[e];
    return K3RT_OK;
}

static int aux_free_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    (void)step;
    aux_free *b = self;
    if (k3rt_comm_size(dp) > 1)
        K3RT_TRY(k3rt_all_reduce(dp, s, b->counts, b->counts, b->E, K3RT_I64, K3RT_REDUCE_SUM,
                                 err));
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (b->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(bal_cu_enter(b->device, err));
        K3RT_TRY(aux_free_cu_update(k3rt_stream_native(s), b->counts, b->E, b->gamma, b->bias, err));
        return k3rt_memset(s, b->counts, b->device, 0, (size_t)b->E * sizeof *b->counts, err);
    }
#endif
    int64_t total = 0;
    for (int e = 0; e < b->E; e++)
        total += b->counts[e];
    if (total > 0) {
        /* sign(mean - c_e) compared in integers: E * c_e against the total */
        for (int e = 0; e < b->E; e++) {
            int64_t diff = total - (int64_t)b->E * b->counts[e];
            int sign = (diff > 0) - (diff < 0);
            b->bias[e] = (float)((double)b->bias[e] + b->gamma * sign);
        }
    }
    memset(b->counts, 0, (size_t)b->E * sizeof *b->counts);
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = aux_free_create,
    .destroy = aux_free_destroy,
    .memory = aux_free_memory,
    .state = aux_free_state,
    .reset_stats = aux_free_reset,
};

static const k3rt_balancer_vtable balancer = {
    .struct_size = sizeof(k3rt_balancer_vtable),
    .bias = aux_free_bias,
    .observe = aux_free_observe,
    .update = aux_free_update,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "aux_free",
    .kind = K3RT_KIND_BALANCER,
    .version = "1.0.0",
    .description = "DeepSeek-V3 auxiliary-loss-free balancing: bias += gamma * sign(mean load "
                   "- load) after every step",
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
