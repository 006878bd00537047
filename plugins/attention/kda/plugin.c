/* Kimi Delta Attention: descriptor, options, parameters (roles and head layout), init, FLOP and
 * memory counts, and the calls into the CPU reference (cpu.c: the layer, the recurrence, the
 * context-parallel summaries) or the CUDA path (cuda.c). Math: spec kda_mla.md §2-§6.
 *
 * Parameter names follow Kimi-Linear's modeling code (q_proj, q_conv1d, f_a_proj, f_b_proj,
 * b_proj, A_log, dt_bias, g_a_proj, g_b_proj / K3's g_proj, o_norm, o_proj); conv filters are
 * stored [channels, width] (torch: [channels, 1, width], the same bytes).
 *
 * Context parallelism: cp_summary gives the affine map (M, B) of a span and cp_compose chains
 * them. The short conv also needs the W-1 layer inputs that precede a span (its halo):
 * context() asks for them, and forward, backward and cp_summary take them as x_prefix (with
 * d_x_prefix in the backward); a span without one starts its sequence.
 *
 * Packed sequences (doc_offsets): the state and the conv window restart at every document; a
 * row's first document continues from the row's state_in and x_prefix, its last one gives
 * state_out (and the row's summary). Saved memory is planned for max_documents per call.
 *
 * Devices: the CPU in f32 and f64 (cpu.c), CUDA in f32 and bf16 (cuda.c) in a build with
 * CUDA; the CUDA path needs the safe gate and dim_k = dim_v in {32, 64, 128}, which create()
 * checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda.h"
#include "cuda/kda_layer_cuda.h"

static const k3rt_option kda_options[] = {
    {"heads", K3RT_OPT_INT, 0, "4", 1, 4096, NULL, "query/key heads H"},
    {"value_heads", K3RT_OPT_INT, K3RT_OPT_NULLABLE, "null", 1, 4096, NULL,
     "value heads HV (GVA: a multiple of heads; gates and beta live on value heads); none "
     "means heads"},
    {"head_dim", K3RT_OPT_INT, 0, "64", 1, 4096, NULL,
     "width of key and value heads unless head_dk / head_dv say otherwise"},
    {"head_dk", K3RT_OPT_INT, K3RT_OPT_NULLABLE, "null", 1, 4096, NULL,
     "key/query head width dk; none means head_dim"},
    {"head_dv", K3RT_OPT_INT, K3RT_OPT_NULLABLE, "null", 1, 4096, NULL,
     "value head width dv; none means head_dim"},
    {"conv_width", K3RT_OPT_INT, 0, "4", 1, 64, NULL,
     "width of the causal depthwise short conv on q, k and v"},
    {"lower_bound", K3RT_OPT_FLOAT, K3RT_OPT_NULLABLE, "-5.0", -5, 0, NULL,
     "safe forget gate g = lower_bound * sigmoid(e^A_log (a + dt_bias)): every step keeps at "
     "least e^lower_bound of each state channel (K3: -5, i.e. 0.67%); none selects "
     "Kimi-Linear's unbounded g = -e^A_log softplus(a + dt_bias)"},
    {"forget_rank", K3RT_OPT_INT, K3RT_OPT_NULLABLE, "null", 0, 1 << 20, NULL,
     "rank of the forget-gate projection x -> rank -> HV*dk; 0 is full rank; none means "
     "head_dv (Kimi)"},
    {"gate_rank", K3RT_OPT_INT, 0, "0", 0, 1 << 20, NULL,
     "rank of the output-gate projection: 0 is K3's full-rank gate, > 0 Kimi-Linear's low-rank "
     "one (head_dv there)"},
    {"algorithm", K3RT_OPT_STRING, 0, "\"chunked\"", K3RT_RANGE_ANY, "chunked|recurrent",
     "chunked: WY/UT form within chunks, matrix products (fast); recurrent: token by token "
     "(the reference)"},
    {"chunk_size", K3RT_OPT_INT, 0, "32", 1, 4096, NULL,
     "tokens per chunk (the recurrent path saves its state at the same interval)"},
    {"norm_eps", K3RT_OPT_FLOAT, 0, "1e-5", 0, 1, NULL, "epsilon of the per-head output RMSNorm"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 100, NULL,
     "std of the normal init of projections and conv filters"},
    {"max_documents", K3RT_OPT_INT, K3RT_OPT_NULLABLE, "null", 1, 1 << 30, NULL,
     "packed sequences (doc_offsets): the most documents in one call that the saved memory is "
     "planned for, each beyond one per batch row costing one chunk of saved state per value "
     "head; a call with more is refused; none means one per batch row"},
};
#define KDA_N_OPTIONS ((uint32_t)(sizeof kda_options / sizeof kda_options[0]))

/* ---- parameters --------------------------------------------------------------------------- */

static k3rt_param_decl decl_of(const kda *m, int slot)
{
    k3rt_param_decl p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.ndim = 2;
    p.init = K3RT_INIT_NORMAL;
    p.init_a = m->init_std;
    p.role = K3RT_ROLE_HEAD_MATRIX; /* rows split by head unless said otherwise */
    int64_t Dk = m->H * m->dim_k, Dv = m->HV * m->dim_v, Dg = m->HV * m->dim_k;
    switch (slot) {
    case KDA_Q:
    case KDA_K:
        p.name = slot == KDA_Q ? "q_proj.weight" : "k_proj.weight";
        p.heads = (int32_t)m->H, p.shape[0] = Dk, p.shape[1] = m->d;
        break;
    case KDA_V:
        p.name = "v_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = Dv, p.shape[1] = m->d;
        break;
    case KDA_QCONV:
    case KDA_KCONV:
    case KDA_VCONV:
        p.name = slot == KDA_QCONV ? "q_conv1d.weight"
                 : slot == KDA_KCONV ? "k_conv1d.weight" : "v_conv1d.weight";
        p.role = K3RT_ROLE_CONV;
        p.shape[0] = slot == KDA_VCONV ? Dv : Dk, p.shape[1] = m->W;
        break;
    case KDA_FA:
        p.name = "f_a_proj.weight", p.role = K3RT_ROLE_MATRIX;
        p.shape[0] = m->rf, p.shape[1] = m->d;
        break;
    case KDA_FB:
        p.name = "f_b_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = Dg, p.shape[1] = m->rf;
        break;
    case KDA_F:
        p.name = "f_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = Dg, p.shape[1] = m->d;
        break;
    case KDA_B: /* one row per value head */
        p.name = "b_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = m->HV, p.shape[1] = m->d;
        break;
    case KDA_ALOG:
    case KDA_DTB:
        p.name = slot == KDA_ALOG ? "A_log" : "dt_bias";
        p.role = K3RT_ROLE_VECTOR, p.ndim = 1, p.shape[0] = slot == KDA_ALOG ? m->HV : Dg;
        p.init = K3RT_INIT_PLUGIN, p.init_a = 0, p.flags = K3RT_PARAM_NO_DECAY;
        break;
    case KDA_GA:
        p.name = "g_a_proj.weight", p.role = K3RT_ROLE_MATRIX;
        p.shape[0] = m->rg, p.shape[1] = m->d;
        break;
    case KDA_GB:
        p.name = "g_b_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = Dv, p.shape[1] = m->rg;
        break;
    case KDA_G:
        p.name = "g_proj.weight", p.heads = (int32_t)m->HV, p.shape[0] = Dv, p.shape[1] = m->d;
        break;
    case KDA_NORM:
        p.name = "o_norm.weight", p.role = K3RT_ROLE_NORM_GAIN, p.ndim = 1, p.shape[0] = m->dim_v;
        p.init = K3RT_INIT_ONES, p.init_a = 0;
        break;
    default: /* KDA_O: columns split by value head */
        p.name = "o_proj.weight", p.heads = (int32_t)m->HV, p.head_axis = 1;
        p.shape[0] = m->d, p.shape[1] = Dv;
        break;
    }
    if (p.role != K3RT_ROLE_HEAD_MATRIX)
        p.heads = 0;
    return p;
}

static int slot_present(const kda *m, int slot)
{
    switch (slot) {
    case KDA_FA:
    case KDA_FB: return m->rf > 0;
    case KDA_F: return m->rf == 0;
    case KDA_GA:
    case KDA_GB: return m->rg > 0;
    case KDA_G: return m->rg == 0;
    default: return 1;
    }
}

static int kda_declare_params(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const kda *m = self;
    for (int s = 0; s < KDA_N_SLOTS; s++)
        if (m->slot[s] >= 0) {
            k3rt_param_decl p = decl_of(m, s);
            K3RT_TRY(k3rt_param_sink_add(sink, &p, err));
        }
    return K3RT_OK;
}

/* As fla's KimiDeltaAttention: A_log = 0 under the lower bound (e^A_log = 1), log U[1, 16]
 * without it; dt_bias = softplus^-1(dt), dt = exp(U[log 1e-3, log 1e-1]) clamped >= 1e-4. */
static int kda_init_param(void *self, const k3rt_param_decl *decl, k3rt_tensor t, k3rt_rng *rng,
                          k3rt_error *err)
{
    const kda *m = self;
    int64_t n = k3rt_tensor_numel(&t);
    if (t.dtype != K3RT_F32 && t.dtype != K3RT_F64)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda: init of %s: expected f32 or f64, got %s",
                         decl->name, k3rt_dtype_name(t.dtype));
    /* the host may pass the full name ("layers.3.mixer.A_log") */
    const char *dot = strrchr(decl->name, '.'), *name = dot ? dot + 1 : decl->name;
    int alog = !strcmp(name, "A_log");
    if (!alog && strcmp(name, "dt_bias"))
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda: no plugin init for parameter %s",
                         decl->name);
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (alog) {
            v = m->has_lb ? 0.0 : log(1.0 + 15.0 * k3rt_rng_uniform(rng));
        } else {
            double lo = log(1e-3), hi = log(1e-1);
            double dt = exp(lo + (hi - lo) * k3rt_rng_uniform(rng));
            dt = dt < 1e-4 ? 1e-4 : dt;
            v = dt + log(-expm1(-dt));
        }
        if (t.dtype == K3RT_F32)
            ((float *)t.data)[i] = (float)v;
        else
            ((double *)t.data)[i] = v;
    }
    return K3RT_OK;
}

/* ---- instance ----------------------------------------------------------------------------- */

static int64_t cfg_int_or(const k3rt_config *c, const char *key, int64_t dflt)
{
    return k3rt_cfg_is_null(c, key) ? dflt : k3rt_cfg_int(c, key);
}

static int kda_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    const k3rt_config *c = a->config;
    kda k;
    memset(&k, 0, sizeof k);
    k.d = a->d_model;
    k.H = k3rt_cfg_int(c, "heads");
    k.HV = cfg_int_or(c, "value_heads", k.H);
    int64_t hd = k3rt_cfg_int(c, "head_dim");
    k.dim_k = cfg_int_or(c, "head_dk", hd);
    k.dim_v = cfg_int_or(c, "head_dv", hd);
    k.W = k3rt_cfg_int(c, "conv_width");
    k.has_lb = !k3rt_cfg_is_null(c, "lower_bound");
    k.lb = k.has_lb ? k3rt_cfg_float(c, "lower_bound") : 0;
    k.rf = cfg_int_or(c, "forget_rank", k.dim_v);
    k.rg = k3rt_cfg_int(c, "gate_rank");
    k.algorithm = strcmp(k3rt_cfg_string(c, "algorithm"), "recurrent") ? KDA_CHUNKED
                                                                       : KDA_RECURRENT;
    k.C = k3rt_cfg_int(c, "chunk_size");
    k.norm_eps = k3rt_cfg_float(c, "norm_eps");
    k.init_std = k3rt_cfg_float(c, "init_std");
    k.max_docs = cfg_int_or(c, "max_documents", 0);
    k.dtype = a->dtype;
    k.device = a->device;
    k.stream = a->stream;
    k.slots = a->stream ? k3rt_stream_threads(a->stream) : 1;
    if (k.HV % k.H)
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "kda: value_heads (%lld) must be a multiple of heads (%lld): each "
                         "value head reads one query/key head",
                         (long long)k.HV, (long long)k.H);
    if (k.has_lb && !(k.lb < 0))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "kda: lower_bound must be < 0 (a log retention), got %g; use none "
                         "for the unbounded softplus gate", k.lb);
    if (k.device != K3RT_DEVICE_CPU) {
        /* what the CUDA kernels take (cuda/kda_cuda.h): the chunk products factor the decay
         * inside 16-token sub-chunks, bounded only under the safe gate */
        if (!k.has_lb)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                             "kda: lower_bound = none (the unbounded softplus gate) has no CUDA "
                             "path: on CUDA lower_bound must be in [-5, 0)");
        if (k.dim_k != k.dim_v)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                             "kda: head_dk = %lld and head_dv = %lld: on CUDA the key and "
                             "value head widths must be equal (32, 64 or 128)",
                             (long long)k.dim_k, (long long)k.dim_v);
        if (k.W > KDA_CU_MAX_CONV)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                             "kda: conv_width = %lld has no CUDA path: on CUDA conv_width must "
                             "be 1 to %d", (long long)k.W, KDA_CU_MAX_CONV);
        if (k.dim_k != 32 && k.dim_k != 64 && k.dim_k != 128)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                             "kda: head_dim = %lld has no CUDA path: on CUDA head_dim (dk = dv) "
                             "must be 32, 64 or 128", (long long)k.dim_k);
    }
    kda *m = malloc(sizeof *m);
    if (!m)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "kda: out of memory");
    *m = k;
    for (int s = 0; s < KDA_N_SLOTS; s++)
        m->slot[s] = slot_present(m, s) ? m->n_params++ : -1;
    *self = m;
    return K3RT_OK;
}

static void kda_destroy(void *self)
{
    kda *m = self;
    if (m && m->compose_ws)
        k3rt_free(m->device, m->compose_ws);
    free(m);
}

/* Matrix products (multiply-add = 2): projections, convs and the recurrence (kda_core_flops);
 * norms, gates and activations are not counted. A backward product costs twice its forward
 * (input and weight gradients). */
static int kda_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const kda *m = self;
    if (batch < 0 || seq < 0)
        return K3RT_ERR_INVALID;
    double N = (double)batch * (double)seq, d = (double)m->d, HV = (double)m->HV;
    double Dk = (double)(m->H * m->dim_k), Dv = HV * (double)m->dim_v, Dg = HV * (double)m->dim_k;
    double rf = (double)m->rf, rg = (double)m->rg;
    double proj = d * (2 * Dk + Dv) + (m->rf ? d * rf + rf * Dg : d * Dg) + d * HV +
                  (m->rg ? d * rg + rg * Dv : d * Dv) + Dv * d;
    double conv = (double)m->W * (2 * Dk + Dv);
    kda_dims cd = {batch, seq, m->H, m->HV, m->dim_k, m->dim_v, m->C, 0};
    double cf, cb;
    kda_core_flops(&cd, m->algorithm, &cf, &cb);
    out->forward = 2 * N * (proj + conv) + cf;
    out->backward = 4 * N * (proj + conv) + cb;
    return K3RT_OK;
}

static int kda_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    const kda *m = self;
    if (batch < 0 || seq < 0)
        return K3RT_ERR_INVALID;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU) {
        k3rt_error e;
        return kda_gpu_memory(m, batch, seq, out, &e);
    }
#endif
    kda_layout l;
    kda_layout_make(m, batch, seq, m->slots, &l);
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    out->saved_bytes = l.saved * es;
    out->workspace_bytes = l.workspace * es;
    out->state_bytes = 0;
    return K3RT_OK;
}

/* The saved activations: on the CPU the layout's run in parts (kda.h), on CUDA one part per
 * tensor. */
static int kda_saved(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                     k3rt_error *err)
{
    const kda *m = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return kda_gpu_saved(m, batch, seq, sink, err);
#endif
    static const char *const names[KDA_SAVED_N] = {
        "proj", "conv", "core_in", "qk_rstd", "forget_low", "gates", "core_out", "out_rstd",
        "ogate_low", "ogate", "out_in", "states"};
    kda_layout l;
    kda_layout_make(m, batch, seq, m->slots, &l);
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    k3rt_flops fl;
    kda_flops(self, batch, seq, &fl);
    for (int i = 0; i < KDA_SAVED_N; i++) {
        int gemm = i == KDA_SAVED_FORGET_LOW || i == KDA_SAVED_OGATE_LOW ||
                   i == KDA_SAVED_OUT_IN;
        k3rt_saved_decl d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.name = names[i];
        d.bytes = (l.part_end[i] - (i ? l.part_end[i - 1] : 0)) * es;
        d.dtype = m->dtype;
        d.flags = K3RT_SAVED_RECOMPUTE | (gemm ? K3RT_SAVED_GEMM_ONLY : 0);
        d.recompute_flops = fl.forward;
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

/* ---- attention calls ---------------------------------------------------------------------- */

static int kda_state_layout(void *self, int64_t batch, k3rt_state_layout *out, k3rt_error *err)
{
    (void)err;
    const kda *m = self;
    int dt = m->device == K3RT_DEVICE_CPU ? m->dtype : K3RT_F32; /* CUDA: f32 state */
    out->state = k3rt_tensor_view(NULL, dt, K3RT_DEVICE_CPU, 4, batch, m->HV, m->dim_k, m->dim_v);
    out->summary_m = k3rt_tensor_view(NULL, dt, K3RT_DEVICE_CPU, 4, batch, m->HV, m->dim_k,
                                      m->dim_k);
    out->summary_b = k3rt_tensor_view(NULL, dt, K3RT_DEVICE_CPU, 4, batch, m->HV, m->dim_k,
                                      m->dim_v);
    return K3RT_OK;
}

/* The short conv reads the W - 1 layer inputs before a span. */
static int kda_context(void *self, k3rt_context_needs *out)
{
    const kda *m = self;
    out->prefix_rows = m->W - 1;
    out->kv_width = 0;
    return K3RT_OK;
}

/* The parameters by slot (KDA_*), NULL where a slot is absent. */
static void by_slot(const kda *m, const k3rt_tensor *t, const void **out)
{
    for (int s = 0; s < KDA_N_SLOTS; s++)
        out[s] = m->slot[s] >= 0 ? t[m->slot[s]].data : NULL;
}

static const void *opt_data(const k3rt_tensor *t) { return t->ndim ? t->data : NULL; }

/* doc_offsets within what the saved memory was planned for. */
static int docs_fit(const kda *m, const k3rt_tensor *docs, int64_t B, k3rt_error *err)
{
    if (!docs->ndim || docs->shape[0] - 1 <= kda_doc_cap(m, B))
        return K3RT_OK;
    return k3rt_fail(err, K3RT_ERR_INVALID,
                     "kda: %lld documents in one call, but the saved memory was planned for at "
                     "most %lld (max_documents, at least one per batch row): raise "
                     "max_documents", (long long)(docs->shape[0] - 1),
                     (long long)kda_doc_cap(m, B));
}

/* The kda_io shared by forward and cp_summary. */
static void fwd_io(const kda *m, const k3rt_fwd_args *a, kda_io *io)
{
    memset(io, 0, sizeof *io);
    by_slot(m, a->params, io->params);
    io->B = a->batch, io->T = a->seq;
    io->x = a->x.data, io->y = a->y.data;
    io->x_halo = opt_data(&a->x_prefix);
    io->saved = a->saved, io->ws = a->workspace;
    io->docs = opt_data(&a->doc_offsets);
    io->n_docs = a->doc_offsets.ndim ? a->doc_offsets.shape[0] - 1 : 0;
}

static int kda_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const kda *m = self;
    K3RT_TRY(docs_fit(m, &a->doc_offsets, a->batch, err));
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return kda_gpu_forward(m, a, err);
#endif
    kda_io io;
    fwd_io(m, a, &io);
    io.s_in = opt_data(&a->state_in);
    io.s_out = (void *)opt_data(&a->state_out);
    return m->dtype == K3RT_F32 ? kda_layer_fwd_f32(m, a->stream, &io, err)
                                : kda_layer_fwd_f64(m, a->stream, &io, err);
}

static int kda_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    const kda *m = self;
    K3RT_TRY(docs_fit(m, &a->doc_offsets, a->batch, err));
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return kda_gpu_backward(m, a, err);
#endif
    kda_io io;
    memset(&io, 0, sizeof io);
    by_slot(m, a->params, io.params);
    const void *g[KDA_N_SLOTS];
    by_slot(m, a->grads, g);
    for (int s = 0; s < KDA_N_SLOTS; s++)
        io.grads[s] = (void *)g[s];
    io.ds_out = opt_data(&a->d_state_out);
    io.ds_in = (void *)opt_data(&a->d_state_in);
    io.B = a->batch, io.T = a->seq;
    io.x = a->x.data, io.dy = a->dy.data, io.dx = a->dx.data;
    io.x_halo = opt_data(&a->x_prefix);
    io.dx_halo = (void *)opt_data(&a->d_x_prefix);
    io.saved = a->saved, io.ws = a->workspace;
    io.docs = opt_data(&a->doc_offsets);
    io.n_docs = a->doc_offsets.ndim ? a->doc_offsets.shape[0] - 1 : 0;
    return m->dtype == K3RT_F32 ? kda_layer_bwd_f32(m, a->stream, &io, err)
                                : kda_layer_bwd_f64(m, a->stream, &io, err);
}

static int kda_cp_summary(void *self, const k3rt_fwd_args *a, k3rt_tensor sm, k3rt_tensor sb,
                          k3rt_error *err)
{
    const kda *m = self;
    K3RT_TRY(docs_fit(m, &a->doc_offsets, a->batch, err));
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return kda_gpu_summary(m, a, sm.data, sb.data, err);
#endif
    kda_io io;
    fwd_io(m, a, &io);
    io.y = NULL;
    return m->dtype == K3RT_F32 ? kda_layer_summary_f32(m, a->stream, &io, sm.data, sb.data, err)
                                : kda_layer_summary_f64(m, a->stream, &io, sm.data, sb.data, err);
}

static int kda_cp_compose(void *self, k3rt_stream *s, k3rt_tensor m1, k3rt_tensor b1,
                          k3rt_tensor m2, k3rt_tensor b2, k3rt_tensor mo, k3rt_tensor bo,
                          k3rt_error *err)
{
    kda *m = self;
    int64_t n = m1.shape[0] * m->HV;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return kda_gpu_compose(m, s, n, m1.data, b1.data, m2.data, b2.data, mo.data, bo.data,
                               err);
#endif
    return m->dtype == K3RT_F32
               ? kda_compose_f32(s, n, m->dim_k, m->dim_v, m1.data, b1.data, m2.data, b2.data,
                                 mo.data, bo.data, err)
               : kda_compose_f64(s, n, m->dim_k, m->dim_v, m1.data, b1.data, m2.data, b2.data,
                                 mo.data, bo.data, err);
}

/* ---- descriptor --------------------------------------------------------------------------- */

static const k3rt_instance_vtable kda_instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = kda_create,
    .destroy = kda_destroy,
    .declare_params = kda_declare_params,
    .init_param = kda_init_param,
    .flops = kda_flops,
    .memory = kda_memory,
    .saved = kda_saved,
};

static const k3rt_attention_vtable kda_vtable = {
    .struct_size = sizeof(k3rt_attention_vtable),
    .forward = kda_forward,
    .backward = kda_backward,
    .state_layout = kda_state_layout,
    .cp_summary = kda_cp_summary,
    .cp_compose = kda_cp_compose,
    .context = kda_context,
    .cache_create = kda_cache_create,
    .decode_step = kda_decode_step,
    .cache_destroy = kda_cache_destroy,
};

static const k3rt_plugin_descriptor kda_descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "kda",
    .kind = K3RT_KIND_ATTENTION,
    .version = "1.0.0",
    .description = "Kimi Delta Attention: gated delta rule with channel-wise forget gate (safe "
                   "lower-bound or softplus), short conv, GVA; chunked and recurrent CPU paths, "
                   "CUDA (f32, bf16), state in/out, packed documents, context-parallel "
                   "summaries, cached decoding",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC |
            K3RT_CAP_DOCUMENTS,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC | K3RT_CAP_DOCUMENTS,
#endif
    .options = kda_options,
    .n_options = KDA_N_OPTIONS,
    .option_size = sizeof(k3rt_option),
    .instance = &kda_instance,
    .vtable = &kda_vtable,
};

K3RT_PLUGIN_EXPORT(kda_descriptor)
