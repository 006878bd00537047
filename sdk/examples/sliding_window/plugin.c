/* sliding_window: descriptor, options, parameters, FLOP and memory counts, its saved parts by
 * class, and the forward and backward around the attention core (core.inc.c). See swa.h for
 * the math.
 *
 * A third-party plugin: it includes only the SDK (<k3rt/k3rt.h>) and links libk3rt. The host
 * checks every call's arguments against what the plugin declared, so the calls start with their
 * math. The four projections use the SDK's linear op (dtype-generic); the core is written once
 * over a real type and built for float (training) and double (finite-difference checks). */
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

/* The host checked device and dtype against the caps (CPU, f32 or f64) and the options;
 * what is left is the rule between options and d_model. */
static int swa_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
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
    l.act = act, l.probs = probs;
    l.dO = 0, l.dq = act, l.dk = 2 * act, l.dv = 3 * act, l.dp = 4 * act;
    l.workspace = 4 * act + probs;
    return l;
}

static int swa_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    swa_layout l = swa_layout_of(self, batch, seq);
    out->workspace_bytes = l.workspace;  /* the saved parts come from swa_saved */
    out->state_bytes = 0;
    return K3RT_OK;
}

/* The saved parts by class: every one is rebuilt by running the forward again on the same x,
 * and o is read back only by a matrix product (dWo += dy^T o), so it may be stored in fp8. */
static int swa_saved(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                     k3rt_error *err)
{
    const swa *m = self;
    swa_layout l = swa_layout_of(m, batch, seq);
    double N = (double)batch * (double)seq, proj = 2 * N * (double)m->d * (double)(m->H * m->D);
    double core = 4 * (double)batch * (double)m->H * (double)m->D * keys_seen(seq, m->window);
    static const char *const names[SWA_N_SAVED] = {"q", "k", "v", "o", "probs"};
    for (int i = 0; i < SWA_N_SAVED; i++) {
        k3rt_saved_decl d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.name = names[i];
        d.bytes = i == SWA_SAVED_P ? l.probs : l.act;
        d.dtype = m->dtype;
        d.flags = K3RT_SAVED_RECOMPUTE | (i == SWA_SAVED_O ? K3RT_SAVED_GEMM_ONLY : 0);
        d.recompute_flops = i < SWA_SAVED_O ? proj : proj * 3 + core;
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

static int swa_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const swa *m = self;
    void *const *sv = a->saved;
    int64_t N = a->batch * a->seq, HD = m->H * m->D;
    const k3rt_tensor *P = a->params;
    for (int i = SWA_Q; i <= SWA_V; i++)  /* q, k, v = x W^T */
        K3RT_TRY(k3rt_linear_fwd(a->stream, m->dtype, a->x.data, P[i].data, NULL,
                                 sv[SWA_SAVED_Q + i], N, m->d, HD, err));
    if (m->dtype == K3RT_F32)
        K3RT_TRY(swa_core_fwd_f32(m, a->stream, a->batch, a->seq, sv[SWA_SAVED_Q],
                                  sv[SWA_SAVED_K], sv[SWA_SAVED_V], sv[SWA_SAVED_O],
                                  sv[SWA_SAVED_P], err));
    else
        K3RT_TRY(swa_core_fwd_f64(m, a->stream, a->batch, a->seq, sv[SWA_SAVED_Q],
                                  sv[SWA_SAVED_K], sv[SWA_SAVED_V], sv[SWA_SAVED_O],
                                  sv[SWA_SAVED_P], err));
    return k3rt_linear_fwd(a->stream, m->dtype, sv[SWA_SAVED_O], P[SWA_O].data, NULL, a->y.data,
                           N, HD, m->d, err);
}

static int swa_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    const swa *m = self;
    swa_layout l = swa_layout_of(m, a->batch, a->seq);
    void *const *sv = a->saved;
    char *ws = a->workspace;
    int64_t N = a->batch * a->seq, HD = m->H * m->D;
    const k3rt_tensor *P = a->params, *G = a->grads;
    /* do = dy Wo ; dWo += dy^T o */
    K3RT_TRY(k3rt_linear_bwd(a->stream, m->dtype, sv[SWA_SAVED_O], P[SWA_O].data, a->dy.data,
                             ws + l.dO, G[SWA_O].data, NULL, N, HD, m->d, 0, err));
    if (m->dtype == K3RT_F32)
        K3RT_TRY(swa_core_bwd_f32(m, a->stream, a->batch, a->seq, sv[SWA_SAVED_Q],
                                  sv[SWA_SAVED_K], sv[SWA_SAVED_V], sv[SWA_SAVED_P],
                                  (float *)(ws + l.dO), (float *)(ws + l.dq),
                                  (float *)(ws + l.dk), (float *)(ws + l.dv),
                                  (float *)(ws + l.dp), err));
    else
        K3RT_TRY(swa_core_bwd_f64(m, a->stream, a->batch, a->seq, sv[SWA_SAVED_Q],
                                  sv[SWA_SAVED_K], sv[SWA_SAVED_V], sv[SWA_SAVED_P],
                                  (double *)(ws + l.dO), (double *)(ws + l.dq),
                                  (double *)(ws + l.dk), (double *)(ws + l.dv),
                                  (double *)(ws + l.dp), err));
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
    .saved = swa_saved,
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
