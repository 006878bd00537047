/* Stable LatentMoE on CUDA, f32 or bf16: the layer of moe.c in the same order over device
 * buffers. Products, the GLUs, the latent RMSNorm and the sigmoid are the shared ops (k3rt/ops.h);
 * routing, the counting-sort dispatch, the gather, the combine and the router's backward are this
 * plugin's kernels (cuda/lmoe_cuda.h).
 *
 * Precision: under bf16 the activations, weights and activation gradients are bf16 and the
 * parameter gradients f32 (the run's bf16 mode); the router's product writes f32 scores from
 * the bf16 x and W_r (k3rt_linear_fwd_f32: exact products, fp32 sums on tensor cores, as an
 * fp32 GEMM of the widened values would give up to the order of the sums), so scores, the
 * selection, the gates and their gradients are f32 on every run. The router's backward product
 * takes dz rounded to bf16 (its weight gradient accumulates in fp32).
 *
 * Host reads: under bf16 with latent and expert widths multiples of 8 (<= 1024 experts) none:
 * the expert GEMMs take the offsets where the dispatch wrote them (k3rt_grouped_linear_*_dev,
 * i64 on the device), which ops.h promises reads nothing back there (the CUTLASS grouped
 * GEMM on sm_90), so routing, counts and offsets stay on the device and the engine reads the
 * counts once per step. Otherwise (f32: the tests and CPU comparisons) the core's grouped
 * GEMM is a loop over host offsets whatever form is called, so the layer copies the offsets
 * to the host once per call (one wait) for its three products instead of the core copying
 * them in each.
 *
 * Streams (overlap_shared, with shared experts): the shared experts read only x (forward) and
 * x, dy and their saved parts (backward), so they run on a second stream of the instance while
 * the routed path runs on the call's stream. `fork`, recorded on the call's stream at entry,
 * orders the side stream after everything before the call; `join`, recorded on the side
 * stream after its last piece, is waited for by the call's stream before the first product
 * that needs the shared result (forward: y += sa Wsd^T; backward: dx += dsg Wsg + dsu Wsu),
 * so every later user of the call's stream is ordered after both. Each buffer has one writer
 * and the same order of sums with or without the overlap: the same bits either way. */
#include <stdlib.h>
#include <string.h>

#include <k3rt/host.h>

#include "latent_moe.h"
#include "cuda/lmoe_cuda.h"

#define P(i) (a->params[f->slot[(i)]].data)
#define G(i) (a->grads[f->slot[(i)]].data)

typedef struct cu_layout {
    /* saved: one raw part */
    int64_t s, sel, pos, p, counts, offsets, bias, xe, g, u, act, ye, U, rstd, nrm, sg, su, sa;
    int64_t saved;
    /* forward scratch */
    int64_t sort, src, c, fwd;
    /* backward scratch */
    int64_t dn, dU, dp, dye, da, dg, du, dc, dz, dz16, dsa, dsg, dsu, bwd;
    int64_t workspace;
} cu_layout;

static int64_t take(int64_t *at, int64_t bytes)
{
    int64_t off = *at;
    *at += (bytes + 255) / 256 * 256;
    return off;
}

static void layout_make(const latent_moe *f, int64_t N, cu_layout *L)
{
    const int64_t es = (int64_t)k3rt_dtype_size(f->dtype), R = N * f->k, E = f->E;
    const int64_t l = f->l, m = f->m, bf = f->dtype == K3RT_BF16;
    const int64_t sh = f->Hs > 0 ? N * f->Hs * es : 0, nb = f->latent_norm ? N * l * es : 0;
    int64_t at = 0;
    L->s = take(&at, N * E * 4);
    L->sel = take(&at, R * 4);
    L->pos = take(&at, R * 4);
    L->p = take(&at, R * 4);
    L->counts = take(&at, E * 8);
    L->offsets = take(&at, (E + 1) * 8);
    L->bias = take(&at, E * 4);
    /* the gathered latent rows, not the latent itself: k times the bytes (7 N l more, 235 MB
     * a K3-mini layer), and the backward's weight gradients read them without a second gather
     * (130 us a layer on the H200) */
    L->xe = take(&at, R * l * es);
    L->g = take(&at, R * m * es);
    L->u = take(&at, R * m * es);
    L->act = take(&at, R * m * es);
    L->ye = take(&at, R * l * es);
    L->U = take(&at, N * l * es);
    L->rstd = take(&at, f->latent_norm ? N * 4 : 0);
    L->nrm = take(&at, nb);
    L->sg = take(&at, sh);
    L->su = take(&at, sh);
    L->sa = take(&at, sh);
    L->saved = at;

    at = 0;
    L->sort = take(&at, lmoe_cu_dispatch_scratch(R, E));
    L->src = take(&at, R * 4);
    L->c = take(&at, N * l * es);
    L->fwd = at;

    at = 0;
    L->dn = take(&at, N * l * es);
    L->dU = f->latent_norm ? take(&at, nb) : L->dn;
    L->dp = take(&at, R * 4);
    L->dye = take(&at, R * l * es);
    L->da = take(&at, R * m * es);
    L->dg = take(&at, R * m * es);
    L->du = take(&at, R * m * es);
    L->dc = take(&at, N * l * es);
    L->dz = take(&at, N * E * 4);
    L->dz16 = take(&at, bf ? N * E * es : 0);
    L->dsa = take(&at, sh);
    L->dsg = take(&at, sh);
    L->dsu = take(&at, sh);
    L->bwd = at;
    L->workspace = L->bwd > L->fwd ? L->bwd : L->fwd;
}

int lmoe_gpu_check(const latent_moe *f, k3rt_error *err)
{
    if (f->E > LMOE_CU_MAX_EXPERTS || f->k > LMOE_CU_MAX_TOPK)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "latent_moe: on CUDA experts must be <= %d "
                         "and top_k <= %d, got %lld experts top-%lld", LMOE_CU_MAX_EXPERTS,
                         LMOE_CU_MAX_TOPK, (long long)f->E, (long long)f->k);
    if (f->dtype != K3RT_F32 && f->dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "latent_moe: on CUDA the compute dtype is f32 "
                         "or bf16, got %s", k3rt_dtype_name(f->dtype));
    return K3RT_OK;
}

int lmoe_gpu_create(latent_moe *f, int overlap_shared, k3rt_error *err)
{
    if (!(f->host_offsets = malloc((size_t)(f->E + 1) * sizeof(int64_t))))
        return k3rt_fail(err, K3RT_ERR_NOMEM, "latent_moe: out of memory");
    if (!overlap_shared || f->Hs == 0)
        return K3RT_OK;
    K3RT_TRY(k3rt_stream_create(f->device, K3RT_STREAM_COMPUTE, &f->side, err));
    K3RT_TRY(k3rt_event_create(f->device, &f->fork, err));
    return k3rt_event_create(f->device, &f->join, err);
}

void lmoe_gpu_destroy(latent_moe *f)
{
    k3rt_event_destroy(f->join);
    k3rt_event_destroy(f->fork);
    k3rt_stream_destroy(f->side);
    free(f->host_offsets);
    f->side = NULL, f->fork = f->join = NULL, f->host_offsets = NULL;
}

/* The stream the shared experts run on: the side stream, ordered after the call's work so
 * far (fork), or the call's stream itself. */
static int shared_begin(latent_moe *f, k3rt_stream *st, k3rt_stream **sh, k3rt_error *err)
{
    *sh = st;
    if (!f->side || f->Hs == 0)
        return K3RT_OK;
    K3RT_TRY(k3rt_event_record(f->fork, st, err));
    K3RT_TRY(k3rt_stream_wait(f->side, f->fork, err));
    *sh = f->side;
    return K3RT_OK;
}

/* The side stream's work so far, ordered before the call's stream's next work (join). */
static int shared_end(latent_moe *f, k3rt_stream *st, k3rt_stream *sh, k3rt_error *err)
{
    if (sh == st)
        return K3RT_OK;
    K3RT_TRY(k3rt_event_record(f->join, sh, err));
    return k3rt_stream_wait(st, f->join, err);
}

void lmoe_gpu_memory(const latent_moe *f, int64_t tokens, k3rt_memory *out)
{
    cu_layout L;
    layout_make(f, tokens, &L);
    out->saved_bytes = L.saved;
    out->workspace_bytes = L.workspace;
    out->state_bytes = 0;
}

/* Where the three expert products of a call find the offsets: on the device (host NULL), or
 * in the instance's host copy, read once for the call. */
typedef struct expert_offsets {
    const void *dev;
    const int64_t *host;
} expert_offsets;

static int offsets_for_call(latent_moe *f, k3rt_stream *st, const void *dev, expert_offsets *o,
                            k3rt_error *err)
{
    o->dev = dev, o->host = NULL;
    if (f->dtype == K3RT_BF16 && f->l % 8 == 0 && f->m % 8 == 0)
        return K3RT_OK;
    K3RT_TRY(k3rt_memcpy(st, f->host_offsets, K3RT_DEVICE_CPU, dev, f->device,
                         (size_t)(f->E + 1) * sizeof(int64_t), err));
    K3RT_TRY(k3rt_stream_sync(st, err));
    o->host = f->host_offsets;
    return K3RT_OK;
}

/* y = x_e W_e^T over the R expert-ordered rows. */
static int experts_fwd(const latent_moe *f, k3rt_stream *st, const expert_offsets *o,
                       const void *x, const void *w, void *y, int64_t R, int64_t in, int64_t out,
                       k3rt_error *err)
{
    if (o->host)
        return k3rt_grouped_linear_fwd(st, f->dtype, x, w, y, o->host, f->E, in, out, err);
    return k3rt_grouped_linear_fwd_dev(st, f->dtype, x, w, y, o->dev, K3RT_I64, f->E, R, in, out,
                                       err);
}

/* dx (=|+=) dy_e W_e ; dW_e += dy_e^T x_e. */
static int experts_bwd(const latent_moe *f, k3rt_stream *st, const expert_offsets *o,
                       const void *x, const void *w, const void *dy, void *dx, void *dw,
                       int64_t R, int64_t in, int64_t out, int acc, k3rt_error *err)
{
    if (o->host)
        return k3rt_grouped_linear_bwd(st, f->dtype, x, w, dy, dx, dw, o->host, f->E, in, out,
                                       acc, err);
    return k3rt_grouped_linear_bwd_dev(st, f->dtype, x, w, dy, dx, dw, o->dev, K3RT_I64, f->E, R,
                                       in, out, acc, err);
}

/* s = sigmoid(x W_r^T) in f32 from inputs of the compute dtype. */
static int router_fwd(const latent_moe *f, const k3rt_fwd_args *a, float *s, k3rt_error *err)
{
    k3rt_stream *st = a->stream;
    int64_t N = a->batch * a->seq;
    K3RT_TRY(k3rt_linear_fwd_f32(st, f->dtype, a->x.data, P(LMOE_ROUTER), s, N, f->d, f->E, err));
    return k3rt_act_fwd(st, K3RT_F32, K3RT_ACT_SIGMOID, s, s, N * f->E, err);
}

int lmoe_gpu_forward(latent_moe *f, const k3rt_fwd_args *a, k3rt_error *err)
{
    int64_t N = a->batch * a->seq, E = f->E, k = f->k, R = N * k, l = f->l, m = f->m, d = f->d;
    if (R > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "latent_moe: %lld tokens x top-%lld routed rows "
                         "exceed the i32 row index; use a smaller micro-batch", (long long)N,
                         (long long)k);
    K3RT_TRY(lmoe_cu_enter(f->device, err));
    cu_layout L;
    layout_make(f, N, &L);
    char *sv = a->saved[0], *ws = a->workspace;
    k3rt_stream *st = a->stream;
    void *cs = k3rt_stream_native(st);
    int dt = f->dtype;
    float *s = (float *)(sv + L.s), *p = (float *)(sv + L.p), *bias = (float *)(sv + L.bias);
    int32_t *sel = (int32_t *)(sv + L.sel), *pos = (int32_t *)(sv + L.pos);
    int32_t *src = (int32_t *)(ws + L.src);
    int64_t *counts = (int64_t *)(sv + L.counts), *offsets = (int64_t *)(sv + L.offsets);
    void *xe = sv + L.xe, *g = sv + L.g, *u = sv + L.u, *act = sv + L.act, *ye = sv + L.ye;
    void *U = sv + L.U, *c = ws + L.c;

    /* the shared experts' gate, up and GLU, beside everything up to the routed W-up */
    k3rt_stream *sh = st;
    if (f->Hs > 0) {
        K3RT_TRY(shared_begin(f, st, &sh, err));
        K3RT_TRY(lmoe_shared_in(f, sh, a, sv + L.sg, sv + L.su, sv + L.sa, err));
    }

    /* route and dispatch */
    if (a->bias.ndim)
        K3RT_TRY(k3rt_memcpy(st, bias, f->device, a->bias.data, a->bias.device,
                             (size_t)E * sizeof(float), err));
    else
        K3RT_TRY(k3rt_memset(st, bias, f->device, 0, (size_t)E * sizeof(float), err));
    K3RT_TRY(router_fwd(f, a, s, err));
    K3RT_TRY(lmoe_cu_route(cs, s, bias, N, E, k, f->renormalize, f->rscale, sel, p, err));
    K3RT_TRY(lmoe_cu_dispatch(cs, sel, R, E, ws + L.sort, counts, offsets, pos, src, err));

    /* routed experts in the latent space: R rows in expert order, offsets[E] = R (dropless) */
    expert_offsets o;
    K3RT_TRY(offsets_for_call(f, st, offsets, &o, err));
    K3RT_TRY(k3rt_linear_fwd(st, dt, a->x.data, P(LMOE_DOWN), NULL, c, N, d, l, err));
    K3RT_TRY(lmoe_cu_gather(cs, dt, c, src, R, k, l, xe, err));
    K3RT_TRY(experts_fwd(f, st, &o, xe, P(LMOE_EX_GATE), g, R, l, m, err));
    K3RT_TRY(experts_fwd(f, st, &o, xe, P(LMOE_EX_UP), u, R, l, m, err));
    K3RT_TRY(k3rt_glu_fwd(st, dt, f->glu, g, u, act, R * m, f->beta1, f->beta2, err));
    K3RT_TRY(experts_fwd(f, st, &o, act, P(LMOE_EX_DOWN), ye, R, m, l, err));
    K3RT_TRY(lmoe_cu_combine(cs, dt, ye, pos, p, N, k, l, U, err));
    K3RT_TRY(lmoe_routed_out(f, st, a, U, sv + L.nrm, sv + L.rstd, err));
    if (f->Hs > 0) {
        K3RT_TRY(shared_end(f, st, sh, err));
        K3RT_TRY(lmoe_shared_out(f, st, a, sv + L.sa, err));
    }

    if (a->routing) {
        k3rt_routing *r = a->routing;
        r->scores = k3rt_tensor_view(s, K3RT_F32, f->device, 2, N, E, 0, 0);
        r->selected = k3rt_tensor_view(sel, K3RT_I32, f->device, 2, N, k, 0, 0);
        r->counts = k3rt_tensor_view(counts, K3RT_I64, f->device, 1, E, 0, 0, 0);
        r->offsets = k3rt_tensor_view(offsets, K3RT_I64, f->device, 1, E + 1, 0, 0, 0);
    }
    return K3RT_OK;
}

/* dx += dz W_r ; dW_r += dz^T x. Under bf16 the product takes dz rounded to bf16. */
static int router_bwd(const latent_moe *f, const k3rt_bwd_args *a, const cu_layout *L,
                      char *ws, const float *dz, k3rt_error *err)
{
    k3rt_stream *st = a->stream;
    int64_t N = a->batch * a->seq, d = f->d, E = f->E;
    const void *g = dz;
    if (f->dtype == K3RT_BF16) {
        K3RT_TRY(k3rt_cast(st, dz, K3RT_F32, ws + L->dz16, K3RT_BF16, N * E, err));
        g = ws + L->dz16;
    }
    return k3rt_linear_bwd(st, f->dtype, a->x.data, P(LMOE_ROUTER), g, a->dx.data, G(LMOE_ROUTER),
                           NULL, N, d, E, 1, err);
}

int lmoe_gpu_backward(latent_moe *f, const k3rt_bwd_args *a, k3rt_error *err)
{
    int64_t N = a->batch * a->seq, E = f->E, k = f->k, R = N * k, l = f->l, m = f->m, d = f->d;
    K3RT_TRY(lmoe_cu_enter(f->device, err));
    cu_layout L;
    layout_make(f, N, &L);
    const char *sv = a->saved[0];
    char *ws = a->workspace;
    k3rt_stream *st = a->stream;
    void *cs = k3rt_stream_native(st);
    int dt = f->dtype;
    const float *d_scores = a->d_scores.ndim ? a->d_scores.data : NULL;
    const int32_t *sel = (const int32_t *)(sv + L.sel), *pos = (const int32_t *)(sv + L.pos);
    const float *s = (const float *)(sv + L.s), *p = (const float *)(sv + L.p);
    const void *x = a->x.data;
    void *dx = a->dx.data;

    /* the shared experts' weight gradients and dsg, dsu, beside the routed backward; their
     * input gradient is added last, after the routed path has written dx */
    k3rt_stream *sh = st;
    if (f->Hs > 0) {
        K3RT_TRY(shared_begin(f, st, &sh, err));
        K3RT_TRY(lmoe_shared_bwd_w(f, sh, a, sv + L.sg, sv + L.su, sv + L.sa, ws + L.dsa,
                                   ws + L.dsg, ws + L.dsu, err));
    }
    void *dU = ws + L.dU;
    K3RT_TRY(lmoe_routed_out_bwd(f, st, a, sv + L.U, sv + L.nrm, sv + L.rstd, ws + L.dn, dU, err));

    /* combine, experts, dispatch */
    float *dp = (float *)(ws + L.dp), *dz = (float *)(ws + L.dz);
    void *dye = ws + L.dye, *da = ws + L.da, *dg = ws + L.dg, *du = ws + L.du;
    const void *xe = sv + L.xe;
    void *dc = ws + L.dc;
    K3RT_TRY(lmoe_cu_combine_bwd(cs, dt, dU, sv + L.ye, pos, p, N, k, l, dp, dye, err));
    expert_offsets o;  /* the forward's, still on the device */
    K3RT_TRY(offsets_for_call(f, st, sv + L.offsets, &o, err));
    K3RT_TRY(experts_bwd(f, st, &o, sv + L.act, P(LMOE_EX_DOWN), dye, da, G(LMOE_EX_DOWN), R, m, l,
                         0, err));
    K3RT_TRY(k3rt_glu_bwd(st, dt, f->glu, sv + L.g, sv + L.u, da, dg, du, R * m, f->beta1,
                          f->beta2, err));
    void *dxe = dye; /* dye is spent */
    K3RT_TRY(experts_bwd(f, st, &o, xe, P(LMOE_EX_GATE), dg, dxe, G(LMOE_EX_GATE), R, l, m, 0,
                         err));
    K3RT_TRY(experts_bwd(f, st, &o, xe, P(LMOE_EX_UP), du, dxe, G(LMOE_EX_UP), R, l, m, 1, err));
    K3RT_TRY(lmoe_cu_combine(cs, dt, dxe, pos, NULL, N, k, l, dc, err));
    K3RT_TRY(k3rt_linear_bwd(st, dt, x, P(LMOE_DOWN), dc, dx, G(LMOE_DOWN), NULL, N, d, l, 0,
                             err));

    /* router */
    K3RT_TRY(lmoe_cu_router_bwd(cs, s, sel, dp, d_scores, N, E, k, f->renormalize, f->rscale, dz,
                              err));
    K3RT_TRY(router_bwd(f, a, &L, ws, dz, err));
    if (f->Hs == 0)
        return K3RT_OK;
    K3RT_TRY(shared_end(f, st, sh, err));
    return lmoe_shared_bwd_dx(f, st, a, ws + L.dsg, ws + L.dsu, 1, err);
}
