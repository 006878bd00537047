/* sliding_window: descriptor, options, parameters, FLOP and memory counts, and the forward and
 * backward around the attention core (core.inc.c). See swa.h for the math.
 *
 * A third-party plugin: it includes only the SDK (<k3rt/k3rt.h>) and links libk3rt. The four
 * projections use the SDK's linear op (dtype-generic); the core is written once over a real
 * type and built for float (training) and double (finite-difference checks). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "swa.h"

static const k3rt_option options[] = {
    {"heads", K3RT_OPT_INT, 0, "4", 1, 4096, NULL, "attention heads H"},
    {"head_dim", K3RT_OPT_INT, 0, "0", 0, 4096, NULL,
     "per-head width D; 0 means d_model / heads"},
    {"window", K3RT_OPT_INT, 0, "128", 1, 1 << 24, NULL,
     "keys a query sees: itself and the window - 1 tokens before it"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 100, NULL,
     "std of the normal init of the four projections"},
    {"softmax_scale", K3RT_OPT_FLOAT, K3RT_OPT_NULLABLE, "null", 0, 1e6, NULL,
     "logit scale; none means 1/sqrt(head_dim)"},
};

enum { SWA_Q, SWA_K, SWA_V, SWA_O, SWA_N_PARAMS };
static const char *const param_names[SWA_N_PARAMS] = {"q_proj.weight", "k_proj.weight",
                                                      "v_proj.weight", "o_proj.weight"};

static int swa_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    if (a->device != K3RT_DEVICE_CPU)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "sliding_window runs on the CPU only");
    if (a->dtype != K3RT_F32 && a->dtype != K3RT_F64)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "sliding_window computes in f32 or f64, "
                         "not %s", k3rt_dtype_name(a->dtype));
    int64_t H = k3rt_cfg_int(a->config, "heads"), D = k3rt_cfg_int(a->config, "head_dim");
    if (D == 0) {
        if (a->d_model % H != 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "sliding_window: heads (%lld) must divide "
                             "d_model (%lld) when head_dim is 0", (long long)H,
                             (long long)a->d_model);
        D = a->d_model / H;
    }
    swa *m = calloc(1, sizeof *m);
    if (!m)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "sliding_window: out of memory");
    m->d = a->d_model, m->H = H, m->D = D;
    m->window = k3rt_cfg_int(a->config, "window");
    m->init_std = k3rt_cfg_float(a->config, "init_std");
    m->scale = k3rt_cfg_is_null(a->config, "softmax_scale")
                   ? 1.0 / sqrt((double)D) : k3rt_cfg_float(a->config, "softmax_scale");
    m->dtype = a->dtype;
    *self = m;
    return K3RT_OK;
}

static void swa_destroy(void *self) { free(self); }

/* q, k, v: [H*D, d], heads split the rows; o: [d, H*D], heads split the columns. */
static int swa_declare(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const swa *m = self;
    for (int i = 0; i < SWA_N_PARAMS; i++) {
        k3rt_param_decl p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.role = K3RT_ROLE_HEAD_MATRIX;
        p.name = param_names[i];
        p.ndim = 2;
        p.shape[0] = i == SWA_O ? m->d : m->H * m->D;
        p.shape[1] = i == SWA_O ? m->H * m->D : m->d;
        p.heads = (int32_t)m->H;
        p.head_axis = i == SWA_O;
        p.init = K3RT_INIT_NORMAL;
        p.init_a = m->init_std;
        p.layer = -1;
        K3RT_TRY(k3rt_param_sink_add(sink, &p, err));
    }
    return K3RT_OK;
}

/* Keys attended over the whole sequence: sum over t of min(t + 1, window). */
static double keys_seen(int64_t T, int64_t window)
{
    int64_t full = T < window ? T : window;  /* tokens 0 .. full-1 see t + 1 keys */
    return (double)full * (double)(full + 1) / 2 + (double)(T - full) * (double)window;
}

static int swa_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const swa *m = self;
    double N = (double)batch * (double)seq, HD = (double)(m->H * m->D);
    double proj = 2 * N * (double)m->d * HD * 4;                       /* q, k, v, o */
    double core = 4 * (double)batch * (double)m->H * (double)m->D * keys_seen(seq, m->window);
    out->forward = proj + core;   /* scores and the weighted sum: 2 D each per key */
    out->backward = 2 * proj + 2 * core;  /* dx and dW; dp, dv, dq, dk */
    return K3RT_OK;
}

static int64_t align64(int64_t n) { return (n + 63) & ~(int64_t)63; }

swa_layout swa_layout_of(const swa *m, int64_t B, int64_t T)
{
    swa_layout l;
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    int64_t act = align64(B * T * m->H * m->D * es);
    l.L = m->window < T ? m->window : T;
    int64_t probs = align64(B * m->H * T * l.L * es);
    l.q = 0, l.k = act, l.v = 2 * act, l.o = 3 * act, l.p = 4 * act, l.saved = 4 * act + probs;
    l.dO = 0, l.dq = act, l.dk = 2 * act, l.dv = 3 * act, l.dp = 4 * act;
    l.workspace = 4 * act + probs;
    return l;
}

static int swa_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    swa_layout l = swa_layout_of(self, batch, seq);
    out->saved_bytes = l.saved;        /* the forward needs it even when not training */
    out->workspace_bytes = l.workspace;
    out->state_bytes = 0;
    return K3RT_OK;
}

/* Shapes, dtypes and buffer sizes of a call; every failure names what is wrong. */
static int check_call(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const k3rt_tensor *x,
                      const k3rt_tensor *out, const char *out_name, const k3rt_tensor *params,
                      int32_t n_params, int64_t saved_bytes, int64_t ws_bytes, k3rt_error *err)
{
    if (!s || k3rt_stream_device(s) != K3RT_DEVICE_CPU)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "sliding_window: needs a CPU stream");
    const int64_t act[3] = {B, T, m->d};
    K3RT_TRY(k3rt_tensor_expect(x, "sliding_window: x", m->dtype, 3, act, err));
    K3RT_TRY(k3rt_tensor_expect(out, out_name, m->dtype, 3, act, err));
    if (n_params != SWA_N_PARAMS || !params)
        return k3rt_fail(err, K3RT_ERR_INVALID, "sliding_window: expects %d parameters, got %d",
                         SWA_N_PARAMS, n_params);
    for (int i = 0; i < SWA_N_PARAMS; i++) {
        const int64_t w[2] = {i == SWA_O ? m->d : m->H * m->D, i == SWA_O ? m->H * m->D : m->d};
        K3RT_TRY(k3rt_tensor_expect(&params[i], param_names[i], m->dtype, 2, w, err));
    }
    swa_layout l = swa_layout_of(m, B, T);
    if (saved_bytes < l.saved || ws_bytes < l.workspace)
        return k3rt_fail(err, K3RT_ERR_INVALID, "sliding_window: B=%lld T=%lld needs %lld saved "
                         "and %lld workspace bytes, got %lld and %lld", (long long)B,
                         (long long)T, (long long)l.saved, (long long)l.workspace,
                         (long long)saved_bytes, (long long)ws_bytes);
    return K3RT_OK;
}

static int swa_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const swa *m = self;
    K3RT_TRY(check_call(m, a->stream, a->batch, a->seq, &a->x, &a->y, "sliding_window: y",
                        a->params, a->n_params, a->saved_bytes, a->workspace_bytes, err));
    swa_layout l = swa_layout_of(m, a->batch, a->seq);
    char *sv = a->saved;
    int64_t N = a->batch * a->seq, HD = m->H * m->D;
    const k3rt_tensor *P = a->params;
    for (int i = SWA_Q; i <= SWA_V; i++)  /* q, k, v = x W^T */
        K3RT_TRY(k3rt_linear_fwd(a->stream, m->dtype, a->x.data, P[i].data, NULL,
                                 sv + (i == SWA_Q ? l.q : i == SWA_K ? l.k : l.v), N, m->d, HD,
                                 err));
    if (m->dtype == K3RT_F32)
        K3RT_TRY(swa_core_fwd_f32(m, a->stream, a->batch, a->seq, (float *)(sv + l.q),
                                  (float *)(sv + l.k), (float *)(sv + l.v), (float *)(sv + l.o),
                                  (float *)(sv + l.p), err));
    else
        K3RT_TRY(swa_core_fwd_f64(m, a->stream, a->batch, a->seq, (double *)(sv + l.q),
                                  (double *)(sv + l.k), (double *)(sv + l.v),
                                  (double *)(sv + l.o), (double *)(sv + l.p), err));
    return k3rt_linear_fwd(a->stream, m->dtype, sv + l.o, P[SWA_O].data, NULL, a->y.data, N, HD,
                           m->d, err);
}

static int swa_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    const swa *m = self;
    K3RT_TRY(check_call(m, a->stream, a->batch, a->seq, &a->x, &a->dy, "sliding_window: dy",
                        a->params, a->n_params, a->saved_bytes, a->workspace_bytes, err));
    const int64_t act[3] = {a->batch, a->seq, m->d};
    K3RT_TRY(k3rt_tensor_expect(&a->dx, "sliding_window: dx", m->dtype, 3, act, err));
    if (!a->grads)
        return k3rt_fail(err, K3RT_ERR_INVALID, "sliding_window: no gradients given");
    swa_layout l = swa_layout_of(m, a->batch, a->seq);
    char *sv = a->saved, *ws = a->workspace;
    int64_t N = a->batch * a->seq, HD = m->H * m->D;
    const k3rt_tensor *P = a->params, *G = a->grads;
    /* do = dy Wo ; dWo += dy^T o */
    K3RT_TRY(k3rt_linear_bwd(a->stream, m->dtype, sv + l.o, P[SWA_O].data, a->dy.data,
                             ws + l.dO, G[SWA_O].data, NULL, N, HD, m->d, 0, err));
    if (m->dtype == K3RT_F32)
        K3RT_TRY(swa_core_bwd_f32(m, a->stream, a->batch, a->seq, (float *)(sv + l.q),
                                  (float *)(sv + l.k), (float *)(sv + l.v), (float *)(sv + l.p),
                                  (float *)(ws + l.dO), (float *)(ws + l.dq),
                                  (float *)(ws + l.dk), (float *)(ws + l.dv),
                                  (float *)(ws + l.dp), err));
    else
        K3RT_TRY(swa_core_bwd_f64(m, a->stream, a->batch, a->seq, (double *)(sv + l.q),
                                  (double *)(sv + l.k), (double *)(sv + l.v),
                                  (double *)(sv + l.p), (double *)(ws + l.dO),
                                  (double *)(ws + l.dq), (double *)(ws + l.dk),
                                  (double *)(ws + l.dv), (double *)(ws + l.dp), err));
    /* dx = dq Wq + dk Wk + dv Wv ; dW_i += d_i^T x */
    const int64_t d_of[3] = {l.dq, l.dk, l.dv};
    for (int i = SWA_Q; i <= SWA_V; i++)
        K3RT_TRY(k3rt_linear_bwd(a->stream, m->dtype, a->x.data, P[i].data, ws + d_of[i],
                                 a->dx.data, G[i].data, NULL, N, m->d, HD, i != SWA_Q, err));
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = swa_create,
    .destroy = swa_destroy,
    .declare_params = swa_declare,
    .flops = swa_flops,
    .memory = swa_memory,
};

static const k3rt_attention_vtable attention = {
    .struct_size = sizeof(k3rt_attention_vtable),
    .forward = swa_forward,
    .backward = swa_backward,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "sliding_window",
    .kind = K3RT_KIND_ATTENTION,
    .version = "1.0.0",
    .description = "causal softmax attention over a sliding window of keys (local attention)",
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &attention,
};

K3RT_PLUGIN_EXPORT(descriptor)
