/* proportional: a load balancer whose bias step is proportional to each expert's load error.
 * A third-party plugin built out of tree against the installed k3rt SDK.
 *
 * After every optimizer step, with c_e the tokens routed to expert e over the step's global
 * batch (summed across data-parallel ranks) and m = sum_e c_e / E their mean:
 *     b_e <- b_e - step * (c_e / m - 1)        then   b <- b - mean(b)
 * An expert with twice the mean load loses `step` of selection bias, an idle one gains `step`;
 * at balance nothing moves (aux_free's sign rule instead moves every expert by +-gamma each
 * step, dithering around balance). Centring keeps the bias from drifting as a whole: only
 * differences between experts change the top-k selection.
 *
 * The bias is state (checkpointed). The routing counts arrive on the run's device; they are
 * copied to the host (a synchronisation per micro-batch on a GPU: a fast balancer would keep
 * them on the device), the update runs on the host and the bias is copied back to the run's
 * device, so the plugin serves CPU and CUDA runs alike. */
#include <stdlib.h>
#include <string.h>

#include <k3rt/k3rt.h>

static const k3rt_option options[] = {
    {"step", K3RT_OPT_FLOAT, 0, "0.01", 0, 10, NULL,
     "bias change per unit of relative load error (c_e / mean - 1) and step"},
};

typedef struct proportional {
    int E, device;
    double step;
    k3rt_stream *stream;  /* the run's stream, for copies after a state load */
    float *bias;          /* [E] host: the state */
    float *bias_dev;      /* [E] on the run's device (== bias on the CPU) */
    int64_t *counts;      /* [E] tokens per expert since the last update */
    int64_t *host_counts; /* [E] one micro-batch's counts copied from the device */
} proportional;

static void pb_destroy(void *self)
{
    proportional *b = self;
    if (!b)
        return;
    if (b->bias_dev && b->bias_dev != b->bias)
        k3rt_free(b->device, b->bias_dev);
    free(b->bias);
    free(b->counts);
    free(b->host_counts);
    free(b);
}

/* The device copy follows the host bias. */
static int push_bias(proportional *b, k3rt_stream *s, k3rt_error *err)
{
    if (b->bias_dev == b->bias)
        return K3RT_OK;
    return k3rt_memcpy(s, b->bias_dev, b->device, b->bias, K3RT_DEVICE_CPU,
                       (size_t)b->E * sizeof *b->bias, err);
}

static int pb_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    if (a->n_experts < 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "proportional: needs a routed MoE layer of at "
                         "least 2 experts, got %d", a->n_experts);
    proportional *b = calloc(1, sizeof *b);
    if (!b)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "proportional: out of memory");
    b->E = a->n_experts;
    b->device = a->device;
    b->step = k3rt_cfg_float(a->config, "step");
    b->stream = a->stream;
    b->bias = calloc((size_t)b->E, sizeof *b->bias);
    b->counts = calloc((size_t)b->E, sizeof *b->counts);
    b->host_counts = calloc((size_t)b->E, sizeof *b->host_counts);
    if (!b->bias || !b->counts || !b->host_counts) {
        pb_destroy(b);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "proportional: out of memory");
    }
    b->bias_dev = b->bias;
    if (b->device != K3RT_DEVICE_CPU) {
        b->bias_dev = k3rt_alloc(b->device, (size_t)b->E * sizeof *b->bias, err);
        int rc = b->bias_dev ? push_bias(b, a->stream, err) : err->code;
        if (rc) {
            pb_destroy(b);
            return rc;
        }
    }
    *self = b;
    return K3RT_OK;
}

static int pb_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    (void)batch, (void)seq;
    const proportional *b = self;
    out->saved_bytes = 0;
    out->workspace_bytes = 0;
    out->state_bytes = b->E * (int64_t)(sizeof(float) + sizeof(int64_t));
    return K3RT_OK;
}

/* Only the bias persists: the counts are cleared by every update, and checkpoints are taken
 * between steps. */
static int pb_state(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    proportional *b = self;
    k3rt_tensor t = k3rt_tensor_view(b->bias, K3RT_F32, K3RT_DEVICE_CPU, 1, b->E, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "bias", t, K3RT_STAT_LOCAL, err);
}

static int pb_state_loaded(void *self, k3rt_error *err)
{
    proportional *b = self;
    K3RT_TRY(push_bias(b, b->stream, err));
    return k3rt_stream_sync(b->stream, err);
}

/* Called at the start of every step: counts of a skipped step (no update) are dropped. */
static void pb_reset(void *self)
{
    proportional *b = self;
    memset(b->counts, 0, (size_t)b->E * sizeof *b->counts);
}

static int pb_bias(void *self, k3rt_tensor *out, k3rt_error *err)
{
    (void)err;
    proportional *b = self;
    *out = k3rt_tensor_view(b->bias_dev, K3RT_F32, b->device, 1, b->E, 0, 0, 0);
    return K3RT_OK;
}

static int pb_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err)
{
    proportional *b = self;
    const int64_t *c = r->counts.data;
    if (b->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(k3rt_memcpy(s, b->host_counts, K3RT_DEVICE_CPU, c, b->device,
                             (size_t)b->E * sizeof *b->host_counts, err));
        K3RT_TRY(k3rt_stream_sync(s, err));
        c = b->host_counts;
    }
    for (int e = 0; e < b->E; e++)
        b->counts[e] += c[e];
    return K3RT_OK;
}

static int pb_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    (void)step;
    proportional *b = self;
    if (k3rt_comm_size(dp) > 1)
        K3RT_TRY(k3rt_all_reduce(dp, s, b->counts, b->counts, b->E, K3RT_I64, K3RT_REDUCE_SUM,
                                 err));
    int64_t total = 0;
    for (int e = 0; e < b->E; e++)
        total += b->counts[e];
    if (total > 0) {
        double mean = (double)total / b->E, centre = 0;
        for (int e = 0; e < b->E; e++)
            centre += (double)b->bias[e] - b->step * ((double)b->counts[e] / mean - 1.0);
        centre /= b->E;
        for (int e = 0; e < b->E; e++)
            b->bias[e] = (float)((double)b->bias[e] -
                                 b->step * ((double)b->counts[e] / mean - 1.0) - centre);
    }
    memset(b->counts, 0, (size_t)b->E * sizeof *b->counts);
    return push_bias(b, s, err);
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = pb_create,
    .destroy = pb_destroy,
    .memory = pb_memory,
    .state = pb_state,
    .state_loaded = pb_state_loaded,
    .reset_stats = pb_reset,
};

static const k3rt_balancer_vtable balancer = {
    .struct_size = sizeof(k3rt_balancer_vtable),
    .bias = pb_bias,
    .observe = pb_observe,
    .update = pb_update,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "proportional",
    .kind = K3RT_KIND_BALANCER,
    .version = "1.0.0",
    .description = "bias -= step * (load / mean load - 1) after every step, mean-centred",
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &balancer,
};

K3RT_PLUGIN_EXPORT(descriptor)
