/* NoPE MLA as used in Kimi (Kimi-Linear's MLA; K3's gated MLA): descriptor, options,
 * parameters, FLOP and memory counts, statistics, and argument checks before the CPU kernels
 * (cpu.inc.c) or, in a build with CUDA, the CUDA path (cuda.c). Math: spec kda_mla.md §7.
 *
 *   qin  = q_rank > 0 ? RMSNorm(x Wqa^T) : x                       q_a_proj, q_a_layernorm
 *   q_h  = [qin Wqn_h^T ; qin Wqr_h^T]              (dn + dr)       q_nope_proj, q_shared_proj
 *   c    = x Wkva[:dc]^T,  kr = x Wkva[dc:]^T       (dc, dr)        kv_a_proj_with_mqa
 *   ĉ    = RMSNorm(c)                                               kv_a_layernorm
 *   k_h  = [ĉ Wkb_h^T ; kr],  v_h = ĉ Wvb_h^T        kr shared by every head, never rotated
 *   o_h  = softmax_causal(scale q_h k_h^T) v_h,  scale = 1/sqrt(dn + dr)
 *   o_h ⊙= sigmoid(x Wg_h^T)                                         o_gate_proj (output_gate)
 *   y    = concat_h(o_h) Wo^T                                        o_proj
 *
 * Kimi's fused q_b_proj (q_proj when q_rank is 0) and kv_b_proj are stored split, because
 * QK-clip treats the parts differently (nope query and key: sqrt(gamma); the query of the shared
 * key: gamma; values: never) and every parameter carries one rule. From a Kimi checkpoint:
 *   q_b_proj.view(H, dn + dr, in):  [:, :dn] -> q_nope_proj,  [:, dn:] -> q_shared_proj
 *   kv_b_proj.view(H, dn + dv, dc): [:, :dn] -> k_b_proj,     [:, dn:] -> v_b_proj
 * kv_a_proj_with_mqa stays fused as in Kimi: a shared down-projection QK-clip never touches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mla.h"
#include "mla_cuda.h"

static const k3rt_option mla_options[] = {
    {"heads", K3RT_OPT_INT, 0, "4", 1, 4096, NULL, "attention heads"},
    {"q_rank", K3RT_OPT_INT, 0, "0", 0, 1 << 20, NULL,
     "query low-rank width: 0 projects queries straight from x (Kimi-Linear); > 0 is x -> "
     "q_rank -> RMSNorm -> heads (K3: 1536)"},
    {"kv_rank", K3RT_OPT_INT, 0, "64", 1, 1 << 20, NULL,
     "key/value latent width, the cached part (Kimi: 512)"},
    {"qk_nope_dim", K3RT_OPT_INT, 0, "32", 1, 1 << 16, NULL,
     "per-head query/key width of the per-head part (keys decoded from the latent; Kimi: 128)"},
    {"qk_shared_dim", K3RT_OPT_INT, 0, "16", 0, 1 << 16, NULL,
     "width of the unrotated key part shared by all heads (Kimi's NoPE 'rope' dims: 64); 0 "
     "drops it"},
    {"v_dim", K3RT_OPT_INT, 0, "32", 1, 1 << 16, NULL, "per-head value width (Kimi: 128)"},
    {"output_gate", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "K3's gated MLA: o_h *= sigmoid(x Wg_h) before the output projection"},
    {"norm_eps", K3RT_OPT_FLOAT, 0, "1e-6", 0, 1, NULL,
     "epsilon of the latent RMSNorms (kv_a_layernorm, q_a_layernorm)"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 100, NULL,
     "std of the normal init of every projection (norm gains start at 1)"},
    {"softmax_scale", K3RT_OPT_FLOAT, K3RT_OPT_NULLABLE, "null", 0, 1e6, NULL,
     "logit scale; none means 1/sqrt(qk_nope_dim + qk_shared_dim) as in Kimi"},
    {"report_max_logit", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "compute each head's max logit every forward and report it (stats \"max_logit\"), the "
     "input of QK-clip; false lets the CUDA forward run cuDNN, which cannot compute it"},
    {"cuda_kernel", K3RT_OPT_STRING, 0, "\"auto\"", K3RT_RANGE_ANY, "auto|k3rt|cudnn",
     "attention core on CUDA: cudnn = cuDNN's fused attention (bf16, T a multiple of 128, "
     "report_max_logit false for the forward, no packed documents; libcudnn.so.9 loaded at run "
     "time), k3rt = k3rt's own kernels, auto = cuDNN where it runs, else k3rt's. A "
     "deterministic backward always runs k3rt's"},
};
#define MLA_N_OPTIONS ((uint32_t)(sizeof mla_options / sizeof mla_options[0]))

/* ---- parameters --------------------------------------------------------------------------- */

static k3rt_param_decl decl_of(const mla *m, int slot)
{
    k3rt_param_decl p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.ndim = 2;
    p.init = K3RT_INIT_NORMAL;
    p.init_a = m->init_std;
    int64_t qin = m->rq ? m->rq : m->d, H = m->H;
    /* Per-head matrices: rows split by head (head_axis 0) except o_proj's columns. */
    p.role = K3RT_ROLE_HEAD_MATRIX;
    p.heads = (int32_t)H;
    switch (slot) {
    case MLA_Q_A:
        p.name = "q_a_proj.weight", p.role = K3RT_ROLE_MATRIX, p.heads = 0;
        p.shape[0] = m->rq, p.shape[1] = m->d;
        break;
    case MLA_Q_A_NORM:
        p.name = "q_a_layernorm.weight", p.role = K3RT_ROLE_NORM_GAIN, p.heads = 0;
        p.ndim = 1, p.shape[0] = m->rq, p.init = K3RT_INIT_ONES, p.init_a = 0;
        break;
    case MLA_Q_NOPE:
        p.name = "q_nope_proj.weight", p.qk_clip = K3RT_QK_SQRT;
        p.shape[0] = H * m->dn, p.shape[1] = qin;
        break;
    case MLA_Q_SHARED:
        p.name = "q_shared_proj.weight", p.qk_clip = K3RT_QK_FULL;
        p.shape[0] = H * m->dr, p.shape[1] = qin;
        break;
    case MLA_KV_A:
        p.name = "kv_a_proj_with_mqa.weight", p.role = K3RT_ROLE_MATRIX, p.heads = 0;
        p.shape[0] = m->dc + m->dr, p.shape[1] = m->d;
        break;
    case MLA_KV_A_NORM:
        p.name = "kv_a_layernorm.weight", p.role = K3RT_ROLE_NORM_GAIN, p.heads = 0;
        p.ndim = 1, p.shape[0] = m->dc, p.init = K3RT_INIT_ONES, p.init_a = 0;
        break;
    case MLA_K_B:
        p.name = "k_b_proj.weight", p.qk_clip = K3RT_QK_SQRT;
        p.shape[0] = H * m->dn, p.shape[1] = m->dc;
        break;
    case MLA_V_B:
        p.name = "v_b_proj.weight";
        p.shape[0] = H * m->dv, p.shape[1] = m->dc;
        break;
    case MLA_GATE:
        p.name = "o_gate_proj.weight";
        p.shape[0] = H * m->dv, p.shape[1] = m->d;
        break;
    default: /* MLA_O */
        p.name = "o_proj.weight", p.head_axis = 1;
        p.shape[0] = m->d, p.shape[1] = H * m->dv;
        break;
    }
    return p;
}

static int slot_present(const mla *m, int slot)
{
    switch (slot) {
    case MLA_Q_A:
    case MLA_Q_A_NORM: return m->rq > 0;
    case MLA_Q_SHARED: return m->dr > 0;
    case MLA_GATE: return m->gate;
    default: return 1;
    }
}

static int mla_declare_params(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const mla *m = self;
    for (int s = 0; s < MLA_N_SLOTS; s++)
        if (m->slot[s] >= 0) {
            k3rt_param_decl p = decl_of(m, s);
            K3RT_TRY(k3rt_param_sink_add(sink, &p, err));
        }
    return K3RT_OK;
}

/* ---- instance ----------------------------------------------------------------------------- */

static void mla_destroy(void *self);

static int mla_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    mla *m = calloc(1, sizeof *m);
    if (!m)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "mla: out of memory");
    const k3rt_config *c = a->config;
    m->d = a->d_model;
    m->H = k3rt_cfg_int(c, "heads");
    m->rq = k3rt_cfg_int(c, "q_rank");
    m->dc = k3rt_cfg_int(c, "kv_rank");
    m->dn = k3rt_cfg_int(c, "qk_nope_dim");
    m->dr = k3rt_cfg_int(c, "qk_shared_dim");
    m->dv = k3rt_cfg_int(c, "v_dim");
    m->dqk = m->dn + m->dr;
    m->gate = k3rt_cfg_bool(c, "output_gate");
    m->eps = k3rt_cfg_float(c, "norm_eps");
    m->init_std = k3rt_cfg_float(c, "init_std");
    m->scale = k3rt_cfg_is_null(c, "softmax_scale") ? 1.0 / sqrt((double)m->dqk)
                                                    : k3rt_cfg_float(c, "softmax_scale");
    m->dtype = a->dtype;
    m->device = a->device;
    m->stream = a->stream;
    m->report_max = k3rt_cfg_bool(c, "report_max_logit");
    const char *kernel = k3rt_cfg_string(c, "cuda_kernel");
    m->kernel = !strcmp(kernel, "cudnn") ? MLA_KERNEL_CUDNN
                : !strcmp(kernel, "k3rt") ? MLA_KERNEL_K3RT : MLA_KERNEL_AUTO;
    if (m->kernel == MLA_KERNEL_CUDNN && m->report_max) {
        free(m);
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla: cuda_kernel \"cudnn\" needs "
                         "report_max_logit = false: cuDNN's forward cannot compute the max "
                         "logits (cuda_kernel \"auto\" runs k3rt's forward for them and "
                         "cuDNN's backward)");
    }
    /* CPU attention runs one scratch slot per thread; CUDA needs none. */
    m->slots = m->device == K3RT_DEVICE_CPU ? k3rt_stream_threads(a->stream) : 0;
    m->max_logit = malloc((size_t)m->H * sizeof(float));
    if (!m->max_logit) {
        free(m);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "mla: out of memory");
    }
    m->dev_fresh = 1;
    if (m->device != K3RT_DEVICE_CPU) {
        m->dev_max = k3rt_alloc(m->device, (size_t)m->H * sizeof(float), err);
        if (!m->dev_max) {
            int dev = m->device;
            mla_destroy(m);
            return k3rt_error_prefix(err, "mla: the per-head max logits on device %d: ", dev);
        }
    }
    for (int64_t h = 0; h < m->H; h++)
        m->max_logit[h] = -INFINITY;
    for (int s = 0; s < MLA_N_SLOTS; s++)
        m->slot[s] = slot_present(m, s) ? m->n_params++ : -1;
    *self = m;
    return K3RT_OK;
}

static void mla_destroy(void *self)
{
    mla *m = self;
    if (m) {
        if (m->dev_max)
            k3rt_free(m->device, m->dev_max);
        free(m->max_logit);
        free(m);
    }
}

/* Matrix products only (multiply-add = 2); norms, softmax and the gate are not counted.
 * Causal attention counts T^2/2 score/value pairs per (batch, head). The backward counts twice
 * the forward (input and weight gradients; dQ, dK, dP, dV) and leaves out recomputing the
 * scores from the saved log-sum-exp, as model FLOPs do. */
static double mla_fwd_flops(const mla *m, int64_t B, int64_t T)
{
    double N = (double)B * (double)T, d = (double)m->d, H = (double)m->H;
    double dn = (double)m->dn, dr = (double)m->dr, dv = (double)m->dv, dc = (double)m->dc;
    double rq = (double)m->rq, qin = m->rq ? rq : d;
    double per_token = (m->rq ? d * rq : 0) + qin * H * (dn + dr) /* queries */
                       + d * (dc + dr) + dc * H * (dn + dv)      /* latent, k/v up */
                       + (m->gate ? d * H * dv : 0) + H * dv * d; /* gate, output */
    double attn = (double)B * H * ((double)T * (double)T / 2) * ((dn + dr) + dv);
    return 2 * (N * per_token + attn);
}

static int mla_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const mla *m = self;
    if (batch < 0 || seq < 0)
        return K3RT_ERR_INVALID;
    out->forward = mla_fwd_flops(m, batch, seq);
    out->backward = 2 * out->forward;
    return K3RT_OK;
}

static void mla_bytes(const mla *m, int64_t batch, int64_t seq, int64_t *saved, int64_t *ws)
{
    mla_layout l;
    mla_layout_make(m, batch, seq, m->slots, &l);
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    *saved = l.saved * es;
    *ws = l.workspace * es;
}

static int mla_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    if (batch < 0 || seq < 0)
        return K3RT_ERR_INVALID;
    mla_bytes(self, batch, seq, &out->saved_bytes, &out->workspace_bytes);
    out->state_bytes = 0;
    return K3RT_OK;
}

/* The saved parts (mla.h): on the CPU the layout's run in seven parts, the normed KV latent
 * (read only by the up-projections' products) GEMM-only; on CUDA one part. */
static int mla_saved(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                     k3rt_error *err)
{
    const mla *m = self;
    static const char *const names[MLA_SAVED_N] = {"q_latent", "kv_latent", "kv_normed", "qkv",
                                                   "out", "lse", "gate"};
    mla_layout l;
    mla_layout_make(m, batch, seq, m->slots, &l);
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    int cpu = m->device == K3RT_DEVICE_CPU;
    k3rt_saved_decl d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.recompute_flops = mla_fwd_flops(m, batch, seq);
    d.flags = K3RT_SAVED_RECOMPUTE;
    if (!cpu) {
        d.name = "saved";
        d.bytes = l.saved * es;
        return k3rt_saved_sink_add(sink, &d, err);
    }
    d.dtype = m->dtype;
    for (int i = 0; i < MLA_SAVED_N; i++) {
        d.name = names[i];
        d.bytes = (l.part_end[i] - (i ? l.part_end[i - 1] : 0)) * es;
        d.flags = K3RT_SAVED_RECOMPUTE | (i == MLA_SAVED_KV_NORMED ? K3RT_SAVED_GEMM_ONLY : 0);
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

/* Per-head max of the scaled pre-softmax logit (masked entries excluded), for QK-clip, on the
 * instance's device; nothing under report_max_logit = false. */
static int mla_stats(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    mla *m = self;
    if (!m->report_max)
        return K3RT_OK;
    float *max = m->max_logit;
    if (m->device != K3RT_DEVICE_CPU) {
        max = m->dev_max;
        if (m->dev_fresh)  /* nothing forwarded since reset_stats */
            K3RT_TRY(k3rt_fill(m->stream, K3RT_F32, max, m->H, -INFINITY, err));
    }
    k3rt_tensor t = k3rt_tensor_view(max, K3RT_F32, m->device, 1, m->H, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "max_logit", t, K3RT_REDUCE_MAX, err);
}

static void mla_reset_stats(void *self)
{
    mla *m = self;
    for (int64_t h = 0; h < m->H; h++)
        m->max_logit[h] = -INFINITY;
    m->dev_fresh = 1;
}

/* ---- calls -------------------------------------------------------------------------------- */

static int mla_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    mla *m = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return mla_forward_cuda(m, a, err);
#endif
    return m->dtype == K3RT_F32 ? mla_forward_f32(m, a, err) : mla_forward_f64(m, a, err);
}

static int mla_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    mla *m = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return mla_backward_cuda(m, a, err);
#endif
    return m->dtype == K3RT_F32 ? mla_backward_f32(m, a, err) : mla_backward_f64(m, a, err);
}

/* ---- descriptor --------------------------------------------------------------------------- */

static const k3rt_instance_vtable mla_instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = mla_create,
    .destroy = mla_destroy,
    .declare_params = mla_declare_params,
    .flops = mla_flops,
    .memory = mla_memory,
    .saved = mla_saved,
    .stats = mla_stats,
    .reset_stats = mla_reset_stats,
};

static const k3rt_attention_vtable mla_vtable = {
    .struct_size = sizeof(k3rt_attention_vtable),
    .forward = mla_forward,
    .backward = mla_backward,
    .cache_create = mla_cache_create,
    .decode_step = mla_decode_step,
    .cache_destroy = mla_cache_destroy,
};

static const k3rt_plugin_descriptor mla_descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "mla",
    .kind = K3RT_KIND_ATTENTION,
    .version = "1.0.0",
    .description = "NoPE multi-head latent attention (Kimi), optional q low-rank and K3's "
                   "sigmoid output gate; reports per-head max logits for QK-clip; cached decoding "
                   "over the latent KV",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC |
            K3RT_CAP_DOCUMENTS,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC | K3RT_CAP_DOCUMENTS,
#endif
    .options = mla_options,
    .n_options = MLA_N_OPTIONS,
    .option_size = sizeof(k3rt_option),
    .instance = &mla_instance,
    .vtable = &mla_vtable,
};

K3RT_PLUGIN_EXPORT(mla_descriptor)
