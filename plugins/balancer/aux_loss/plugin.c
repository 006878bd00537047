/* aux_loss: DeepSeek-V3's complementary sequence-wise balance loss (spec
 * moe_balance_attnres.md §3). It keeps a zero selection bias and acts through the gradient.
 *
 * For each sequence of T tokens (B of them in the micro-batch), with the routed selection:
 *   f_i = E / (k T) * #{t : i chosen for t}          (a constant: no gradient)
 *   P_i = (1/T) sum_t s_it / S_t,   S_t = sum_j s_jt
 *   L   = alpha * sum_i f_i P_i ;   the micro-batch's loss is the mean of L over sequences
 * and, with F_t = sum_i f_i s_it / S_t,
 *   dL/ds_jt = alpha / (T S_t) * (f_j - F_t)         (reaches all E scores of every token)
 *
 * On CUDA the loads, the gradient and the loss are computed on the device (bal_cuda.h).
 * aux_loss hands the loss back as a host double, so that call waits for the one number;
 * aux_loss_add (what the engine calls) adds it into a device sum and waits for nothing. */
#include <stdlib.h>
#include <string.h>

#include <k3rt/k3rt.h>

#ifdef K3RT_PLUGIN_HAVE_CUDA
#include "bal_cuda.h"
#endif

static const k3rt_option options[] = {
    {"alpha", K3RT_OPT_FLOAT, 0, "0.0001", 0, 1e3, NULL,
     "weight of the sequence-wise balance loss (DeepSeek-V3: 1e-4)"},
};

typedef struct aux_loss {
    int E, k, device;
    double alpha;
    float *bias;   /* [E] zeros: this balancer never biases the selection */
    double *f;     /* [E] scratch (CPU) */
    void *scratch; /* CUDA: loads and per-token sums of aux_loss_cu_loss, then the loss (doubles) */
    int64_t scratch_bytes;
} aux_loss;

static void aux_loss_destroy(void *self)
{
    aux_loss *b = self;
    if (!b)
        return;
    k3rt_free(b->device, b->bias);
    k3rt_free(b->device, b->scratch);
    free(b->f);
    free(b);
}

static int aux_loss_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    aux_loss *b = calloc(1, sizeof *b);
    if (!b)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "aux_loss: out of memory");
    b->E = a->n_experts;
    b->k = a->top_k;
    b->alpha = k3rt_cfg_float(a->config, "alpha");
    b->device = a->device;
    size_t bb = (size_t)b->E * sizeof *b->bias;
    b->bias = k3rt_alloc(b->device, bb, err);
    b->f = calloc((size_t)b->E, sizeof *b->f);
    int rc = b->bias && b->f ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "aux_loss: out of memory");
    if (!rc && b->device == K3RT_DEVICE_CPU)
        memset(b->bias, 0, bb);
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (!rc && b->device != K3RT_DEVICE_CPU) {
        rc = bal_cu_enter(b->device, err);
        if (!rc)
            rc = bal_cu_zero(k3rt_stream_native(a->stream), b->bias, bb, err);
    }
#endif
    if (rc) {
        aux_loss_destroy(b);
        return rc;
    }
    *self = b;
    return K3RT_OK;
}

static int al_bias(void *self, k3rt_tensor *out, k3rt_error *err)
{
    (void)err;
    aux_loss *b = self;
    *out = k3rt_tensor_view(b->bias, K3RT_F32, b->device, 1, b->E, 0, 0, 0);
    return K3RT_OK;
}

#ifdef K3RT_PLUGIN_HAVE_CUDA
/* The loss into loss_dev (one device double): added to it (accumulate) or written. */
static int loss_gpu(aux_loss *b, k3rt_stream *st, const k3rt_routing *r, double scale,
                    double *loss_dev, int accumulate, k3rt_tensor d_scores, k3rt_error *err)
{
    K3RT_TRY(bal_cu_enter(b->device, err));
    return aux_loss_cu_loss(k3rt_stream_native(st), r->scores.data, r->selected.data, r->batch,
                            r->seq, b->E, b->k, b->alpha, scale, b->scratch, d_scores.data,
                            loss_dev, accumulate, err);
}

/* Grows the device scratch to this micro-batch's loads and per-token sums, plus one double
 * at its end for aux_loss's host read. */
static int scratch_gpu(aux_loss *b, const k3rt_routing *r, k3rt_error *err)
{
    int64_t need = aux_loss_cu_scratch(r->batch, r->seq, b->E) + (int64_t)sizeof(double);
    if (need <= b->scratch_bytes)
        return K3RT_OK;
    K3RT_TRY(bal_cu_enter(b->device, err));
    k3rt_free(b->device, b->scratch); /* earlier work on it is ordered before the next */
    b->scratch_bytes = 0;
    if (!(b->scratch = k3rt_alloc(b->device, (size_t)need, err)))
        return err->code ? err->code : K3RT_ERR_NOMEM;
    b->scratch_bytes = need;
    return K3RT_OK;
}
#endif

/* The CPU loop: writes d_scores and returns the loss. */
static double loss_cpu(aux_loss *b, const k3rt_routing *r, double scale, k3rt_tensor d_scores)
{
    const float *s = r->scores.data;
    const int32_t *sel = r->selected.data;
    float *ds = d_scores.data;
    int64_t B = r->batch, T = r->seq, E = b->E, k = b->k;
    double total = 0, *f = b->f;
    for (int64_t q = 0; q < B; q++) {
        const float *sq = s + q * T * E;
        memset(f, 0, (size_t)E * sizeof *f);
        for (int64_t i = 0; i < T * k; i++)
            f[sel[q * T * k + i]] += 1;
        for (int64_t e = 0; e < E; e++)
            f[e] *= (double)E / (double)(k * T);
        double lq = 0;
        for (int64_t t = 0; t < T; t++) {
            const float *st_ = sq + t * E;
            float *dst = ds + (q * T + t) * E;
            double S = 0, F = 0;
            for (int64_t e = 0; e < E; e++)
                S += st_[e];
            if (!(S > 0)) {
                memset(dst, 0, (size_t)E * sizeof *dst);
                continue;
            }
            for (int64_t e = 0; e < E; e++)
                F += f[e] * st_[e] / S;
            lq += F;  /* sum_i f_i P_i = (1/T) sum_t F_t */
            double c = scale * b->alpha / ((double)B * (double)T * S);
            for (int64_t e = 0; e < E; e++)
                dst[e] = (float)(c * (f[e] - F));
        }
        total += b->alpha * lq / (double)T;
    }
    return total / (double)B;
}

static int aux_loss_loss(void *self, k3rt_stream *st, const k3rt_routing *r, double scale,
                         double *loss, k3rt_tensor d_scores, k3rt_error *err)
{
    aux_loss *b = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (b->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(scratch_gpu(b, r, err));
        double *dev = (double *)((char *)b->scratch + b->scratch_bytes - (int64_t)sizeof(double));
        K3RT_TRY(loss_gpu(b, st, r, scale, dev, 0, d_scores, err));
        K3RT_TRY(k3rt_memcpy(st, loss, K3RT_DEVICE_CPU, dev, b->device, sizeof *loss, err));
        return k3rt_stream_sync(st, err);
    }
#endif
    (void)st, (void)err;
    *loss = loss_cpu(b, r, scale, d_scores);
    return K3RT_OK;
}

static int aux_loss_add(void *self, k3rt_stream *st, const k3rt_routing *r, double scale,
                        k3rt_tensor loss_sum, k3rt_tensor d_scores, k3rt_error *err)
{
    aux_loss *b = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (b->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(scratch_gpu(b, r, err));
        return loss_gpu(b, st, r, scale, loss_sum.data, 1, d_scores, err);
    }
#endif
    (void)st, (void)err;
    *(double *)loss_sum.data += loss_cpu(b, r, scale, d_scores);
    return K3RT_OK;
}

/* The loss acts through the gradient; there is no statistic to fold in between steps. */
static int aux_loss_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    (void)self, (void)s, (void)dp, (void)step, (void)err;
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = aux_loss_create,
    .destroy = aux_loss_destroy,
};

static const k3rt_balancer_vtable balancer = {
    .struct_size = sizeof(k3rt_balancer_vtable),
    .bias = al_bias,
    .aux_loss = aux_loss_loss,
    .update = aux_loss_update,
    .aux_loss_add = aux_loss_add,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "aux_loss",
    .kind = K3RT_KIND_BALANCER,
    .version = "1.0.0",
    .description = "DeepSeek-V3 sequence-wise auxiliary balance loss with weight alpha",
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
