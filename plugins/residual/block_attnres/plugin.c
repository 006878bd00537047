/* block_attnres: descriptor, options, parameters, counts and the depth-weight statistics. */
#include "attnres.h"

#include <stdlib.h>
#include <string.h>

static const k3rt_option options[] = {
    {"block_layers", K3RT_OPT_INT, 0, "2", 1, 1000000, NULL,
     "decoder layers per block (each layer is two sublayers: attention and FFN); K3 uses 12 "
     "(93 layers make 8 blocks), small models 2"},
    {"full", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "Full AttnRes: every sublayer's output is its own source (block_layers is ignored)"},
    {"norm_eps", K3RT_OPT_FLOAT, 0, "1e-5", 0, 1, NULL,
     "epsilon of the RMSNorm on the keys (K3: 1e-5); must be > 0"},
};

static void attnres_destroy(void *self)
{
    attnres *r = self;
    if (!r)
        return;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    attnres_cuda_destroy(r);
#endif
    free(r->alpha_sum);
    free(r->alpha_tokens);
    free(r->depth_weights);
    free(r->v);
    free(r->dv);
    free(r);
}

static int attnres_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    double eps = k3rt_cfg_float(a->config, "norm_eps");
    if (!(eps > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres: key 'norm_eps' must be > 0, "
                         "got %g", eps);
    attnres *r = calloc(1, sizeof *r);
    if (!r)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "block_attnres: out of memory");
    r->dtype = a->dtype;
    r->device = a->device;
    r->acc = a->device == K3RT_DEVICE_CPU ? a->dtype : K3RT_F32;
    r->stream = a->stream;
    r->d = a->d_model;
    r->n_layers = a->n_layers;
    r->S = 2 * a->n_layers;
    r->block_layers = (int)k3rt_cfg_int(a->config, "block_layers");
    r->full = k3rt_cfg_bool(a->config, "full");
    r->kb = r->full ? 1 : 2 * r->block_layers;
    r->eps = eps;
    r->nb = attnres_closed(r, r->S);
    size_t cells = (size_t)(r->S + 1) * (size_t)(r->nb + 1);
    r->alpha_sum = calloc(cells, sizeof *r->alpha_sum);
    r->alpha_tokens = calloc((size_t)r->S + 1, sizeof *r->alpha_tokens);
    r->depth_weights = calloc(cells, sizeof *r->depth_weights);
    r->v = calloc((size_t)r->nb + 1, sizeof *r->v);
    r->dv = calloc((size_t)r->nb + 1, sizeof *r->dv);
    if (!r->alpha_sum || !r->alpha_tokens || !r->depth_weights || !r->v || !r->dv) {
        attnres_destroy(r);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "block_attnres: out of memory");
    }
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (r->device != K3RT_DEVICE_CPU) {
        int rc = attnres_cuda_create(r, err);
        if (rc) {
            attnres_destroy(r);
            return rc;
        }
    }
#endif
    *self = r;
    return K3RT_OK;
}

/* Per sublayer (declaration order, so sublayer s owns parameters 2s and 2s + 1) a pseudo-query
 * and a key-norm gain; the output aggregation's pair comes last. Layer 0's attention pair is
 * declared but unused (its input is the embedding alone): K3's 187 sets for 186 ops. */
static int attnres_declare(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const attnres *r = self;
    static const char *const names[3][2] = {{"attn.query", "attn.key_norm"},
                                            {"ffn.query", "ffn.key_norm"},
                                            {"out.query", "out.key_norm"}};
    for (int s = 0; s <= r->S; s++) {
        int which = s == r->S ? 2 : s % 2;
        for (int k = 0; k < 2; k++) {
            k3rt_param_decl d;
            memset(&d, 0, sizeof d);
            d.struct_size = sizeof d;
            d.role = k ? K3RT_ROLE_NORM_GAIN : K3RT_ROLE_VECTOR;
            d.name = names[which][k];
            d.ndim = 1;
            d.shape[0] = r->d;
            /* Zero queries: every op starts as the plain average of its sources (paper §5). */
            d.init = k ? K3RT_INIT_ONES : K3RT_INIT_ZEROS;
            d.layer = s == r->S ? -1 : s / 2;
            K3RT_TRY(k3rt_param_sink_add(sink, &d, err));
        }
    }
    return K3RT_OK;
}

/* Per token and source of an op: forward key norm, logit and weighted sum (6d); backward the
 * value dot, key recompute, source gradient and the query gradient's product (14d), plus 2d to
 * reconstruct a within-block partial. Pushes add one [N, d] each way. */
static int attnres_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const attnres *r = self;
    double N = (double)(batch * seq), d = (double)r->d, fwd = 0, bwd = 0;
    for (int s = 1; s <= r->S; s++) {
        double n = attnres_sources(r, s);
        fwd += 6 * d * n;
        bwd += 14 * d * n + (s < r->S && !attnres_opens(r, s) ? 2 * d * n : 0);
    }
    out->forward = N * (fwd + r->S * d);
    out->backward = N * (bwd + r->S * d);
    return K3RT_OK;
}

static int attnres_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    attnres_layout l;
    attnres_layout_make(self, batch * seq, &l);
    out->saved_bytes = l.saved_bytes;
    out->workspace_bytes = l.workspace_bytes;
    out->state_bytes = 0;
    return K3RT_OK;
}

int attnres_note_alpha(attnres *r, k3rt_stream *st, int s, const void *alpha, int64_t N, int n,
                       k3rt_error *err)
{
    if (s < 0 || s > r->S || n > r->nb + 1)
        return K3RT_OK;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (r->device != K3RT_DEVICE_CPU)
        return attnres_cuda_stats(r, st, s, alpha, N, n, err);
#endif
    (void)st, (void)err;
    double *row = r->alpha_sum + (int64_t)s * (r->nb + 1);
    if (!alpha)
        row[0] += (double)N;
    for (int64_t t = 0; alpha && t < N; t++)
        for (int i = 0; i < n; i++)
            row[i] += r->dtype == K3RT_F32 ? ((const float *)alpha)[t * n + i]
                                           : ((const double *)alpha)[t * n + i];
    r->alpha_tokens[s] += N;
    return K3RT_OK;
}

/* "depth_weights" [S + 1, nb + 1]: row s is the mean weight sublayer s gave each source (0 the
 * embedding, j >= 1 block j, complete or in progress) over the tokens of the forwards since
 * reset_stats; the output aggregation is the last row; slots a row does not read are 0. */
static int attnres_stats(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    attnres *r = self;
    int cols = r->nb + 1;
    if (r->device != K3RT_DEVICE_CPU) {
        /* the means are kept current by every forward; rows none has touched since
         * reset_stats still hold older numbers */
        for (int s = 0; s <= r->S; s++)
            if (!r->alpha_tokens[s])
                K3RT_TRY(k3rt_fill(r->stream, K3RT_F32, r->dev_mean + (int64_t)s * cols, cols,
                                   0.0, err));
        k3rt_tensor t = k3rt_tensor_view(r->dev_mean, K3RT_F32, r->device, 2, r->S + 1, cols,
                                         0, 0);
        return k3rt_tensor_sink_add(sink, "depth_weights", t, K3RT_REDUCE_AVG, err);
    }
    for (int s = 0; s <= r->S; s++)
        for (int i = 0; i < cols; i++) {
            int64_t k = (int64_t)s * cols + i;
            r->depth_weights[k] = r->alpha_tokens[s]
                                      ? (float)(r->alpha_sum[k] / (double)r->alpha_tokens[s])
                                      : 0.0f;
        }
    k3rt_tensor t = k3rt_tensor_view(r->depth_weights, K3RT_F32, K3RT_DEVICE_CPU, 2, r->S + 1,
                                     cols, 0, 0);
    return k3rt_tensor_sink_add(sink, "depth_weights", t, K3RT_REDUCE_AVG, err);
}

static void attnres_reset_stats(void *self)
{
    attnres *r = self;
    size_t cells = (size_t)(r->S + 1) * (size_t)(r->nb + 1);
    memset(r->alpha_sum, 0, cells * sizeof *r->alpha_sum);
    memset(r->alpha_tokens, 0, ((size_t)r->S + 1) * sizeof *r->alpha_tokens);
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = attnres_create,
    .destroy = attnres_destroy,
    .declare_params = attnres_declare,
    .flops = attnres_flops,
    .memory = attnres_memory,
    .stats = attnres_stats,
    .reset_stats = attnres_reset_stats,
};

static const k3rt_residual_vtable residual = {
    .struct_size = sizeof(k3rt_residual_vtable),
    .begin = attnres_begin,
    .mix = attnres_mix,
    .push = attnres_push,
    .finish = attnres_finish,
    .finish_backward = attnres_finish_backward,
    .push_backward = attnres_push_backward,
    .mix_backward = attnres_mix_backward,
    .begin_backward = attnres_begin_backward,
    .op_forward = attnres_op_forward,
    .op_backward = attnres_op_backward,
    .mix_norm = attnres_mix_norm,
    .mix_norm_backward = attnres_mix_norm_backward,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "block_attnres",
    .kind = K3RT_KIND_RESIDUAL,
    .version = "1.0.0",
    .description = "Block Attention Residuals (K3): each sublayer reads a softmax mix of the "
                   "block sums over depth; full = true gives Full AttnRes",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &residual,
};

K3RT_PLUGIN_EXPORT(descriptor)
