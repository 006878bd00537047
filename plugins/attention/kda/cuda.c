/* Kimi Delta Attention on CUDA, f32 or bf16: the layer of cpu_layer.inc.c (spec §2.1) in the same
 * order, over device buffers. Projections, the per-head output RMSNorm and the beta sigmoid are
 * the shared ops (k3rt/ops.h: cuBLAS / cuBLASLt and k3rt's kernels), the output gate too (the
 * sigmoid GLU); the short conv with SiLU and the L2 norm and the forget gate are this plugin's
 * kernels (cuda/kda_layer_cuda.h); the recurrence is kda_cuda_fwd / kda_cuda_bwd / kda_cuda_summary
 * (cuda/kda_cuda.h), 64-token chunks whatever chunk_size says (the same function: chunk_size
 * and algorithm only choose how the CPU computes it).
 *
 * Precision: under bf16 every activation, weight and activation gradient is bf16, and the
 * parameter gradients, the output norm's rstd, the recurrent state (state_in / state_out and
 * their gradients) and the context-parallel summaries are f32; arithmetic is fp32 in every
 * kernel. Under f32 everything is f32 (products in full fp32).
 *
 * Documents: B rows of T tokens with doc_offsets are one packed sequence of B*T tokens for the
 * recurrence (its cu_seqlens, with per-row states: row_len = T); the conv kernels read each
 * token's document bounds from two int32 arrays built once per call.
 *
 * What the backward recomputes rather than keeps: the conv outputs and their activations (from
 * the kept conv inputs qp, kp, vp: W multiply-adds per element), the halo projections, the
 * normed core output and the gated o_proj input. */
#include <string.h>

#include "kda.h"
#include "cuda/kda_cuda.h"
#include "cuda/kda_layer_cuda.h"

/* Saved parts (in this order; absent ones are not declared). */
enum {
    P_QP, P_KP, P_VP,  /* [N, Dk | Dk | Dv] projections, the conv inputs */
    P_QN, P_KN, P_V,   /* [N, Dk | Dk | Dv] the recurrence's inputs */
    P_FA,              /* [N, rf] forget gate down-projection (rf > 0) */
    P_ZF,              /* [N, Dg] forget gate projection (before dt_bias) */
    P_G,               /* [N, Dg] log decay */
    P_BL, P_BETA,      /* [N, HV] beta logits, beta */
    P_O,               /* [N, Dv] the recurrence's output */
    P_RSTD,            /* [N, HV] f32: the output RMSNorm's 1/rms */
    P_GA,              /* [N, rg] output gate down-projection (rg > 0) */
    P_GATE,            /* [N, Dv] output gate pre-activation */
    P_CORE,            /* the recurrence's saved bytes (kda_cuda_saved_bytes) */
    P_N
};

static const char *const part_names[P_N] = {
    "q_proj", "k_proj", "v_proj", "q", "k", "v", "f_a", "f_proj", "g", "beta_logits", "beta",
    "o", "o_rstd", "g_a", "gate", "recurrence"};

typedef struct cu_layout {
    int64_t bytes[P_N];
    int dtype[P_N];
    int index[P_N];    /* position among the declared parts, or -1 */
    int n_parts;
    /* workspace, byte offsets */
    int64_t hq, hk, hv, dstart, core, on, yg;
    int64_t dyg, don, dG, dlow, dO, dq, dk, dv, dg, dbeta, dbl, dzf, dp, dhalo, part;
    int64_t workspace;
} cu_layout;

static int64_t up256(int64_t x) { return (x + 255) / 256 * 256; }
static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t take(int64_t *at, int64_t bytes)
{
    int64_t off = *at;
    *at += up256(bytes);
    return off;
}

/* The recurrence's arguments without pointers: the B rows, or (docs) one packed sequence with
 * per-row states. */
static void core_shape(const kda *m, int64_t B, int64_t T, int64_t n_docs, kda_cuda_args *c)
{
    memset(c, 0, sizeof *c);
    c->dtype = m->dtype;
    c->H = m->H, c->HV = m->HV, c->D = m->dim_k;
    c->scale = 0; /* dim_k^-1/2, as the CPU */
    if (n_docs > 0) {
        c->B = 1, c->T = B * T, c->n_docs = n_docs, c->row_len = T;
    } else {
        c->B = B, c->T = T;
    }
}

static int layout_make(const kda *m, int64_t B, int64_t T, cu_layout *L, k3rt_error *err)
{
    memset(L, 0, sizeof *L);
    const int64_t N = B * T, H = m->H, HV = m->HV, Dk = H * m->dim_k, Dv = HV * m->dim_v;
    const int64_t Dg = HV * m->dim_k, nh = B * (m->W - 1), Dm = max2(Dk, Dv);
    const int64_t es = (int64_t)k3rt_dtype_size(m->dtype);
    /* the recurrence: the larger of the rows layout and the packed one at the document cap */
    kda_cuda_args rows, packed;
    core_shape(m, B, T, 0, &rows);
    core_shape(m, B, T, kda_doc_cap(m, B), &packed);
    size_t s1, s2, w1, w2;
    K3RT_TRY(kda_cuda_saved_bytes(&rows, &s1, err));
    K3RT_TRY(kda_cuda_saved_bytes(&packed, &s2, err));
    K3RT_TRY(kda_cuda_workspace_bytes(&rows, 1, &w1, err));
    K3RT_TRY(kda_cuda_workspace_bytes(&packed, 1, &w2, err));
    const int64_t n[P_N] = {N * Dk, N * Dk, N * Dv, N * Dk, N * Dk, N * Dv, N * m->rf, N * Dg,
                            N * Dg, N * HV, N * HV, N * Dv, N * HV, N * m->rg, N * Dv, 0};
    for (int p = 0; p < P_N; p++) {
        L->dtype[p] = p == P_RSTD ? K3RT_F32 : p == P_CORE ? K3RT_DTYPE_INVALID : m->dtype;
        L->bytes[p] = p == P_CORE ? (int64_t)(s1 > s2 ? s1 : s2)
                                  : n[p] * (int64_t)k3rt_dtype_size(L->dtype[p]);
        L->index[p] = L->bytes[p] > 0 ? L->n_parts++ : -1;
    }
    const int64_t nb = (N + KDA_CU_SUM_ROWS - 1) / KDA_CU_SUM_ROWS;
    int64_t at = 0;
    L->hq = take(&at, nh * Dk * es);
    L->hk = take(&at, nh * Dk * es);
    L->hv = take(&at, nh * Dv * es);
    L->dstart = take(&at, N * 4);
    L->core = take(&at, (int64_t)(w1 > w2 ? w1 : w2));
    L->on = take(&at, N * Dv * es);
    L->yg = take(&at, N * Dv * es);
    L->dyg = take(&at, N * Dv * es);
    L->don = take(&at, N * Dv * es);
    L->dG = take(&at, N * Dv * es);
    L->dlow = take(&at, N * max2(m->rf, m->rg) * es);
    L->dO = take(&at, N * Dv * es);
    L->dq = take(&at, N * Dk * es);
    L->dk = take(&at, N * Dk * es);
    L->dv = take(&at, N * Dv * es);
    L->dg = take(&at, N * Dg * es);
    L->dbeta = take(&at, N * HV * es);
    L->dbl = take(&at, N * HV * es);
    L->dzf = take(&at, N * Dg * es);
    L->dp = take(&at, N * Dm * es);
    L->dhalo = take(&at, nh * Dm * es);
    L->part = take(&at, max2(nb * Dm * m->W, 2 * nb * Dg) * 4);
    L->workspace = at;
    return K3RT_OK;
}

int kda_gpu_memory(const kda *m, int64_t B, int64_t T, k3rt_memory *out, k3rt_error *err)
{
    cu_layout L;
    K3RT_TRY(layout_make(m, B, T, &L, err));
    out->saved_bytes = 0;
    for (int p = 0; p < P_N; p++)
        out->saved_bytes += up256(L.bytes[p]);
    out->workspace_bytes = L.workspace;
    out->state_bytes = 0;
    return K3RT_OK;
}

int kda_gpu_saved(const kda *m, int64_t B, int64_t T, k3rt_saved_sink *sink, k3rt_error *err)
{
    cu_layout L;
    K3RT_TRY(layout_make(m, B, T, &L, err));
    for (int p = 0; p < P_N; p++) {
        if (L.index[p] < 0)
            continue;
        k3rt_saved_decl d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.name = part_names[p];
        d.bytes = L.bytes[p];
        d.dtype = L.dtype[p];
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

/* ---- one call -------------------------------------------------------------------------------- */

typedef struct cu_call {
    const kda *m;
    k3rt_stream *s;
    void *st;        /* cudaStream_t */
    int dt;
    int64_t B, T, N, nh, n_docs;
    cu_layout L;
    void *sv[P_N];   /* the saved parts */
    char *ws;
    const void *P[KDA_N_SLOTS];
    const void *x, *xh;       /* x and x_prefix (or NULL) */
    const int32_t *docs;
    const int32_t *ds;        /* per-token document starts (docs) or NULL */
    const void *hq, *hk, *hv; /* halo projections (xh) or NULL */
} cu_call;

static int call_open(cu_call *c, const kda *m, k3rt_stream *s, int64_t B, int64_t T,
                     void *const *saved, void *ws, const k3rt_tensor *params,
                     const k3rt_tensor *docs, const k3rt_tensor *x, const k3rt_tensor *xh,
                     k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    c->m = m, c->s = s, c->st = k3rt_stream_native(s), c->dt = m->dtype;
    c->B = B, c->T = T, c->N = B * T, c->nh = B * (m->W - 1);
    K3RT_TRY(layout_make(m, B, T, &c->L, err));
    for (int p = 0; p < P_N; p++)
        c->sv[p] = c->L.index[p] >= 0 ? saved[c->L.index[p]] : NULL;
    c->ws = ws;
    for (int i = 0; i < KDA_N_SLOTS; i++)
        c->P[i] = m->slot[i] >= 0 ? params[m->slot[i]].data : NULL;
    c->x = x->data;
    c->xh = xh->ndim && m->W > 1 ? xh->data : NULL;
    K3RT_TRY(kda_cu_enter(m->device, err));
    if (docs->ndim) {
        c->docs = docs->data, c->n_docs = docs->shape[0] - 1;
        int32_t *ds = (int32_t *)(c->ws + c->L.dstart);
        K3RT_TRY(kda_cu_doc_bounds(c->st, c->N, c->docs, c->n_docs, ds, err));
        c->ds = ds;
    }
    if (c->xh) {
        const int64_t Dk = m->H * m->dim_k, Dv = m->HV * m->dim_v;
        void *hq = c->ws + c->L.hq, *hk = c->ws + c->L.hk, *hv = c->ws + c->L.hv;
        K3RT_TRY(k3rt_linear_fwd(s, c->dt, c->xh, c->P[KDA_Q], NULL, hq, c->nh, m->d, Dk, err));
        K3RT_TRY(k3rt_linear_fwd(s, c->dt, c->xh, c->P[KDA_K], NULL, hk, c->nh, m->d, Dk, err));
        K3RT_TRY(k3rt_linear_fwd(s, c->dt, c->xh, c->P[KDA_V], NULL, hv, c->nh, m->d, Dv, err));
        c->hq = hq, c->hk = hk, c->hv = hv;
    }
    return K3RT_OK;
}

static void *W_(const cu_call *c, int64_t off) { return c->ws + off; }

static void core_of(const cu_call *c, kda_cuda_args *a)
{
    core_shape(c->m, c->B, c->T, c->n_docs, a);
    a->cu_seqlens = c->docs;
    a->q = c->sv[P_QN], a->k = c->sv[P_KN], a->v = c->sv[P_V];
    a->g = c->sv[P_G], a->beta = c->sv[P_BETA];
    a->o = c->sv[P_O];
    a->saved = c->sv[P_CORE];
    a->workspace = W_(c, c->L.core);
}

/* Everything before the recurrence (cpu_layer.inc.c's layer_prep): qp .. beta. */
static int prep(const cu_call *c, k3rt_error *err)
{
    const kda *m = c->m;
    k3rt_stream *s = c->s;
    const int dt = c->dt;
    const int64_t N = c->N, d = m->d, H = m->H, HV = m->HV, Dk = H * m->dim_k, Dv = HV * m->dim_v;
    const int64_t Dg = HV * m->dim_k;
    void *const *sv = c->sv;
    K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_Q], NULL, sv[P_QP], N, d, Dk, err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_K], NULL, sv[P_KP], N, d, Dk, err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_V], NULL, sv[P_VP], N, d, Dv, err));
    K3RT_TRY(kda_cu_conv_fwd(c->st, dt, c->B, c->T, H, m->dim_k, m->W, sv[P_QP], c->hq,
                             c->P[KDA_QCONV], c->ds, 1, sv[P_QN], err));
    K3RT_TRY(kda_cu_conv_fwd(c->st, dt, c->B, c->T, H, m->dim_k, m->W, sv[P_KP], c->hk,
                             c->P[KDA_KCONV], c->ds, 1, sv[P_KN], err));
    K3RT_TRY(kda_cu_conv_fwd(c->st, dt, c->B, c->T, HV, m->dim_v, m->W, sv[P_VP], c->hv,
                             c->P[KDA_VCONV], c->ds, 0, sv[P_V], err));
    if (m->rf) {
        K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_FA], NULL, sv[P_FA], N, d, m->rf, err));
        K3RT_TRY(k3rt_linear_fwd(s, dt, sv[P_FA], c->P[KDA_FB], NULL, sv[P_ZF], N, m->rf, Dg,
                                 err));
    } else {
        K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_F], NULL, sv[P_ZF], N, d, Dg, err));
    }
    K3RT_TRY(kda_cu_gate_fwd(c->st, dt, N, HV, m->dim_k, m->lb, sv[P_ZF], c->P[KDA_ALOG],
                             c->P[KDA_DTB], sv[P_G], err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, c->x, c->P[KDA_B], NULL, sv[P_BL], N, d, HV, err));
    return k3rt_act_fwd(s, dt, K3RT_ACT_SIGMOID, sv[P_BL], sv[P_BETA], N * HV, err);
}

static const void *opt(const k3rt_tensor *t) { return t->ndim ? t->data : NULL; }

int kda_gpu_forward(const kda *m, const k3rt_fwd_args *a, k3rt_error *err)
{
    cu_call c;
    K3RT_TRY(call_open(&c, m, a->stream, a->batch, a->seq, a->saved, a->workspace, a->params,
                       &a->doc_offsets, &a->x, &a->x_prefix, err));
    K3RT_TRY(prep(&c, err));
    k3rt_stream *s = c.s;
    const int dt = c.dt;
    const int64_t N = c.N, d = m->d, HV = m->HV, Dv = HV * m->dim_v;
    kda_cuda_args core;
    core_of(&c, &core);
    core.s0 = opt(&a->state_in);
    core.s_final = (float *)opt(&a->state_out);
    K3RT_TRY(kda_cuda_fwd(c.st, &core, err));
    void *on = W_(&c, c.L.on), *yg = W_(&c, c.L.yg);
    K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, c.sv[P_O], c.P[KDA_NORM], on, c.sv[P_RSTD], N * HV, m->dim_v,
                              m->norm_eps, err));
    if (m->rg) {
        K3RT_TRY(k3rt_linear_fwd(s, dt, c.x, c.P[KDA_GA], NULL, c.sv[P_GA], N, d, m->rg, err));
        K3RT_TRY(k3rt_linear_fwd(s, dt, c.sv[P_GA], c.P[KDA_GB], NULL, c.sv[P_GATE], N, m->rg,
                                 Dv, err));
    } else {
        K3RT_TRY(k3rt_linear_fwd(s, dt, c.x, c.P[KDA_G], NULL, c.sv[P_GATE], N, d, Dv, err));
    }
    K3RT_TRY(k3rt_glu_fwd(s, dt, K3RT_GLU_SIGMOID, c.sv[P_GATE], on, yg, N * Dv, 0, 0, err));
    return k3rt_linear_fwd(s, dt, yg, c.P[KDA_O], NULL, a->y.data, N, Dv, d, err);
}

int kda_gpu_summary(const kda *m, const k3rt_fwd_args *a, float *sm, float *sb,
                     k3rt_error *err)
{
    cu_call c;
    K3RT_TRY(call_open(&c, m, a->stream, a->batch, a->seq, a->saved, a->workspace, a->params,
                       &a->doc_offsets, &a->x, &a->x_prefix, err));
    K3RT_TRY(prep(&c, err));
    kda_cuda_args core;
    core_of(&c, &core);
    return kda_cuda_summary(c.st, &core, sm, sb, err);
}

/* One of q, k, v from the gradient of its activation's output (dout): activation and conv
 * backward (one pass), then its projection's: dx (accumulated), d_x_prefix (first:
 * overwritten) and the weight gradients, the halo rows' included. */
static int qkv_bwd(const cu_call *c, const k3rt_bwd_args *a, int wslot, int cslot, int part,
                   const void *halo, int64_t heads, int64_t hd, int l2, const void *dout,
                   int first, void *const *G, k3rt_error *err)
{
    const kda *m = c->m;
    const int64_t Dw = heads * hd;
    float *pt = W_(c, c->L.part);
    void *dp = W_(c, c->L.dp), *dh = halo ? W_(c, c->L.dhalo) : NULL;
    K3RT_TRY(kda_cu_conv_bwd(c->st, c->dt, c->B, c->T, heads, hd, m->W, c->sv[part], halo,
                             c->P[cslot], c->ds, l2, dout, dp, dh, pt, G[cslot], err));
    K3RT_TRY(k3rt_linear_bwd(c->s, c->dt, c->x, c->P[wslot], dp, a->dx.data, G[wslot], NULL,
                             c->N, m->d, Dw, 1, err));
    if (halo)
        K3RT_TRY(k3rt_linear_bwd(c->s, c->dt, c->xh, c->P[wslot], dh,
                                 (void *)opt(&a->d_x_prefix), G[wslot], NULL, c->nh, m->d, Dw,
                                 !first, err));
    return K3RT_OK;
}

int kda_gpu_backward(const kda *m, const k3rt_bwd_args *a, k3rt_error *err)
{
    cu_call c;
    K3RT_TRY(call_open(&c, m, a->stream, a->batch, a->seq, a->saved, a->workspace, a->params,
                       &a->doc_offsets, &a->x, &a->x_prefix, err));
    void *G[KDA_N_SLOTS];
    for (int i = 0; i < KDA_N_SLOTS; i++)
        G[i] = m->slot[i] >= 0 ? a->grads[m->slot[i]].data : NULL;
    k3rt_stream *s = c.s;
    const int dt = c.dt;
    const int64_t N = c.N, d = m->d, H = m->H, HV = m->HV, Dv = HV * m->dim_v, Dg = HV * m->dim_k;
    void *const *sv = c.sv;
    void *on = W_(&c, c.L.on), *yg = W_(&c, c.L.yg), *dyg = W_(&c, c.L.dyg);
    void *don = W_(&c, c.L.don), *dG = W_(&c, c.L.dG), *dlow = W_(&c, c.L.dlow);
    void *dx = a->dx.data;
    /* y = yg Wo^T, yg = RMSNorm(o) ⊙ sigmoid(G) (both recomputed) */
    K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, sv[P_O], c.P[KDA_NORM], on, NULL, N * HV, m->dim_v,
                              m->norm_eps, err));
    K3RT_TRY(k3rt_glu_fwd(s, dt, K3RT_GLU_SIGMOID, sv[P_GATE], on, yg, N * Dv, 0, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, dt, yg, c.P[KDA_O], a->dy.data, dyg, G[KDA_O], NULL, N, Dv, d, 0,
                             err));
    K3RT_TRY(k3rt_glu_bwd(s, dt, K3RT_GLU_SIGMOID, sv[P_GATE], on, dyg, dG, don, N * Dv, 0, 0,
                          err));
    if (m->rg) {
        K3RT_TRY(k3rt_linear_bwd(s, dt, sv[P_GA], c.P[KDA_GB], dG, dlow, G[KDA_GB], NULL, N,
                                 m->rg, Dv, 0, err));
        K3RT_TRY(k3rt_linear_bwd(s, dt, c.x, c.P[KDA_GA], dlow, dx, G[KDA_GA], NULL, N, d, m->rg,
                                 0, err));
    } else {
        K3RT_TRY(k3rt_linear_bwd(s, dt, c.x, c.P[KDA_G], dG, dx, G[KDA_G], NULL, N, d, Dv, 0,
                                 err));
    }
    void *dO = W_(&c, c.L.dO);
    K3RT_TRY(k3rt_rmsnorm_bwd(s, dt, sv[P_O], c.P[KDA_NORM], sv[P_RSTD], don, dO, G[KDA_NORM],
                              N * HV, m->dim_v, 0, err));
    /* the recurrence */
    void *dq = W_(&c, c.L.dq), *dk = W_(&c, c.L.dk), *dv = W_(&c, c.L.dv);
    void *dg = W_(&c, c.L.dg), *dbeta = W_(&c, c.L.dbeta);
    kda_cuda_args core;
    core_of(&c, &core);
    core.s0 = opt(&a->state_in);
    core.d_o = dO;
    core.d_s_final = opt(&a->d_state_out);
    core.d_q = dq, core.d_k = dk, core.d_v = dv, core.d_g = dg, core.d_beta = dbeta;
    core.d_s0 = (float *)opt(&a->d_state_in);
    K3RT_TRY(kda_cuda_bwd(c.st, &core, err));
    /* forget gate: dg -> dzf, dA_log, ddt_bias; then its projections */
    void *dzf = W_(&c, c.L.dzf);
    K3RT_TRY(kda_cu_gate_bwd(c.st, dt, N, HV, m->dim_k, m->lb, sv[P_ZF], c.P[KDA_ALOG],
                             c.P[KDA_DTB], dg, dzf, W_(&c, c.L.part), G[KDA_DTB], G[KDA_ALOG],
                             err));
    if (m->rf) {
        K3RT_TRY(k3rt_linear_bwd(s, dt, sv[P_FA], c.P[KDA_FB], dzf, dlow, G[KDA_FB], NULL, N,
                                 m->rf, Dg, 0, err));
        K3RT_TRY(k3rt_linear_bwd(s, dt, c.x, c.P[KDA_FA], dlow, dx, G[KDA_FA], NULL, N, d, m->rf,
                                 1, err));
    } else {
        K3RT_TRY(k3rt_linear_bwd(s, dt, c.x, c.P[KDA_F], dzf, dx, G[KDA_F], NULL, N, d, Dg, 1,
                                 err));
    }
    /* beta = sigmoid(x Wb^T) */
    void *dbl = W_(&c, c.L.dbl);
    K3RT_TRY(k3rt_act_bwd(s, dt, K3RT_ACT_SIGMOID, sv[P_BL], dbeta, dbl, N * HV, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, dt, c.x, c.P[KDA_B], dbl, dx, G[KDA_B], NULL, N, d, HV, 1, err));
    /* q, k: L2 norm and SiLU, v: SiLU; then conv and projections */
    K3RT_TRY(qkv_bwd(&c, a, KDA_Q, KDA_QCONV, P_QP, c.hq, H, m->dim_k, 1, dq, 1, G, err));
    K3RT_TRY(qkv_bwd(&c, a, KDA_K, KDA_KCONV, P_KP, c.hk, H, m->dim_k, 1, dk, 0, G, err));
    return qkv_bwd(&c, a, KDA_V, KDA_VCONV, P_VP, c.hv, HV, m->dim_v, 0, dv, 0, G, err);
}

/* (m, b) = (m2 m1, m2 b1 + b2) over n heads in f32, through the instance's scratch (outputs
 * may alias inputs). */
int kda_gpu_compose(kda *m, k3rt_stream *s, int64_t n, const float *m1, const float *b1,
                     const float *m2, const float *b2, float *mo, float *bo, k3rt_error *err)
{
    const int64_t dim_k = m->dim_k, dim_v = m->dim_v, nm = n * dim_k * dim_k,
        nb = n * dim_k * dim_v;
    const size_t need = (size_t)(nm + nb) * sizeof(float);
    K3RT_TRY(kda_cu_enter(m->device, err));
    if (m->compose_bytes < need) {
        if (m->compose_ws) { /* the old block may still be read by queued work */
            K3RT_TRY(k3rt_stream_sync(s, err));
            k3rt_free(m->device, m->compose_ws);
            m->compose_ws = NULL, m->compose_bytes = 0;
        }
        m->compose_ws = k3rt_alloc(m->device, need, err);
        if (!m->compose_ws)
            return err->code ? err->code : K3RT_ERR_NOMEM;
        m->compose_bytes = need;
    }
    float *tm = m->compose_ws, *tb = tm + nm;
    K3RT_TRY(k3rt_memcpy(s, tb, m->device, b2, m->device, (size_t)nb * sizeof(float), err));
    const int64_t kk = dim_k * dim_k, kv = dim_k * dim_v;
    K3RT_TRY(k3rt_gemm_strided_batched(s, K3RT_F32, 0, 0, dim_k, dim_k, dim_k, 1.0, m2, dim_k, kk,
                                       m1, dim_k, kk, 0.0, tm, dim_k, kk, n, err));
    K3RT_TRY(k3rt_gemm_strided_batched(s, K3RT_F32, 0, 0, dim_k, dim_v, dim_k, 1.0, m2, dim_k, kk,
                                       b1, dim_v, kv, 1.0, tb, dim_v, kv, n, err));
    K3RT_TRY(k3rt_memcpy(s, mo, m->device, tm, m->device, (size_t)nm * sizeof(float), err));
    return k3rt_memcpy(s, bo, m->device, tb, m->device, (size_t)nb * sizeof(float), err);
}
