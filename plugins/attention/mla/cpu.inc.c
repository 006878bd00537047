/* NoPE MLA on the CPU, written once over REAL and included by cpu.c (float, double) with REAL,
 * DTYPE (its k3rt dtype), EXP and SUF(name) defined. Forward and backward side by side;
 * shapes use N = B*T tokens, H heads, dn/dr the per-head nope/shared query-key widths
 * (dqk = dn + dr), dv the value width, dc the latent width, rq the query rank. Buffers are the
 * engine's: `saved` (kept to the backward) and `workspace`, carved by mla_layout (mla.h).
 *
 * Attention runs per (batch, head) over blocks of MLA_BLOCK query rows; a block multiplies only
 * the keys up to its last row. The forward keeps the softmax log-sum-exp of every row; the
 * backward recomputes the probabilities from it (no T x T matrix is kept). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "mla.h"

/* A saved tensor by its layout offset, in whichever CPU part holds it (mla_layout.part_end). */
#ifndef MLA_CPU_SV
#define MLA_CPU_SV
#define SV(off) ((REAL *)k3rt_saved_at(a->saved, L.part_end, MLA_SAVED_N, (off), sizeof(REAL)))
#endif

/* Branch-free (gate signs are random: a branch mispredicts half the time). x is held >= -80 so
 * EXP(-x) stays finite and 1/(1 + EXP(-x)) never goes denormal; sigmoid(-80) = 1.8e-35 stands
 * for anything below. */
static inline REAL SUF(sigmoid)(REAL x)
{
    x = x < (REAL)-80 ? (REAL)-80 : x;
    return (REAL)1 / ((REAL)1 + EXP(-x));
}

/* max that keeps a NaN: a broken logit must reach QK-clip's finiteness check. */
static inline double SUF(nan_max)(double a, double b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    return a > b ? a : b;
}

/* Row reductions over 8 fixed lanes, combined in order: vectorisable and independent of the
 * thread count. */
static inline REAL SUF(row_max)(const REAL *x, int64_t n)
{
    REAL lane[8];
    for (int l = 0; l < 8; l++)
        lane[l] = x[0];
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
    for (; j < n; j++)
        lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    REAL mx = lane[0];
    for (int l = 1; l < 8; l++)
        mx = lane[l] > mx ? lane[l] : mx;
    return mx;
}

static inline REAL SUF(row_sum)(const REAL *x, int64_t n)
{
    REAL lane[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += x[j + l];
    for (; j < n; j++)
        lane[0] += x[j];
    REAL sum = 0;
    for (int l = 0; l < 8; l++)
        sum += lane[l];
    return sum;
}

/* ---- attention core, one (batch, head) at a time -------------------------------------------- */

typedef struct SUF(attn) {
    const mla *m;
    k3rt_stream *s;
    int64_t B, T;
    int slots;
    const REAL *q, *k, *v, *o;  /* [B, T, H, dqk] x2, [B, T, H, dv] x2 */
    REAL *out;                  /* forward: o */
    REAL *lse;                  /* [B, H, T] */
    REAL *item_max;             /* forward: [B*H] max scaled logit */
    const REAL *dout;           /* backward: dO [B, T, H, dv] */
    const int32_t *docs;        /* packed documents: offsets [n_docs + 1] over B * T, or NULL */
    int64_t n_docs;
    REAL *dq, *dk, *dv;         /* backward outputs, same layouts as q, k, v */
    REAL *scratch;              /* [slots, ...] */
    int64_t scratch_per_slot;
    atomic_int failed;
    k3rt_error err;             /* the first failure, written once by the thread that set failed */
} SUF(attn);

static void SUF(attn_fail)(SUF(attn) *c, const k3rt_error *e)
{
    if (atomic_exchange(&c->failed, 1) == 0)
        c->err = *e;
}

/* The first key token t of row b may see: its document's first token (row-relative), *k
 * the document index, advanced as t grows (rows are walked in order). 0 without documents. */
static int64_t SUF(doc_first)(const SUF(attn) *c, int64_t b, int64_t t, int64_t *k)
{
    if (!c->docs)
        return 0;
    int64_t g = b * c->T + t;
    while (*k + 1 < c->n_docs && c->docs[*k + 1] <= g)
        (*k)++;
    return c->docs[*k] - b * c->T;
}

/* Forward of one (b, h):  S = scale Q K^T (causal),  P = softmax_row(S),  O = P V,
 * lse_t = log sum_j exp(S_tj). S holds one row block: [MLA_BLOCK, keys]. */
static int SUF(attn_fwd_item)(SUF(attn) *c, int64_t item, REAL *S, k3rt_error *e)
{
    const mla *m = c->m;
    int64_t T = c->T, H = m->H, b = item / H, h = item % H;
    int64_t ldq = H * m->dqk, ldv = H * m->dv;
    const REAL *Q = c->q + b * T * ldq + h * m->dqk, *K = c->k + b * T * ldq + h * m->dqk;
    const REAL *V = c->v + b * T * ldv + h * m->dv;
    REAL *O = c->out + b * T * ldv + h * m->dv, *lse = c->lse + item * T;
    double top = -INFINITY;
    int64_t doc = 0;
    for (int64_t r0 = 0; r0 < T; r0 += MLA_BLOCK) {
        int64_t rows = T - r0 < MLA_BLOCK ? T - r0 : MLA_BLOCK, keys = r0 + rows;
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 0, 1, rows, keys, m->dqk, m->scale, Q + r0 * ldq, ldq,
                           K, ldq, 0.0, S, keys, e));
        REAL inv[MLA_BLOCK]; /* 1/row sum: P V is formed unnormalised, O rows scaled after */
        for (int64_t i = 0; i < rows; i++) {
            REAL *si = S + i * keys;
            /* token t = r0 + i sees keys f..t: f = 0, or its document's first token */
            int64_t n = r0 + i + 1, f = SUF(doc_first)(c, b, r0 + i, &doc);
            REAL mx = SUF(row_max)(si + f, n - f);
            memset(si, 0, (size_t)f * sizeof(REAL));
            for (int64_t j = f; j < n; j++)
                si[j] = EXP(si[j] - mx);
            memset(si + n, 0, (size_t)(keys - n) * sizeof(REAL));
            REAL sum = SUF(row_sum)(si + f, n - f);
            inv[i] = (REAL)1 / sum;
            lse[r0 + i] = mx + (REAL)log((double)sum);
            /* A NaN anywhere in the row shows up in sum (and so in lse). */
            top = SUF(nan_max)(top, isnan(sum) ? NAN : (double)mx);
        }
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 0, 0, rows, m->dv, keys, 1.0, S, keys, V, ldv, 0.0,
                           O + r0 * ldv, ldv, e));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < m->dv; j++)
                O[(r0 + i) * ldv + j] *= inv[i];
    }
    c->item_max[item] = (REAL)top;
    return K3RT_OK;
}

/* Backward of one (b, h), per row block (P recomputed from lse):
 *   dV += P^T dO ;  dP = dO V^T ;  D_t = dO_t . O_t ;  dS = P (dP - D)
 *   dQ = scale dS K ;  dK += scale dS^T Q
 * Scratch: P and dP (becoming dS), [MLA_BLOCK, keys] each. */
static int SUF(attn_bwd_item)(SUF(attn) *c, int64_t item, REAL *P, k3rt_error *e)
{
    const mla *m = c->m;
    int64_t T = c->T, H = m->H, b = item / H, h = item % H;
    int64_t ldq = H * m->dqk, ldv = H * m->dv;
    int64_t qoff = b * T * ldq + h * m->dqk, voff = b * T * ldv + h * m->dv;
    const REAL *Q = c->q + qoff, *K = c->k + qoff, *V = c->v + voff, *O = c->o + voff;
    const REAL *dO = c->dout + voff, *lse = c->lse + item * T;
    REAL *dQ = c->dq + qoff, *dK = c->dk + qoff, *dV = c->dv + voff;
    REAL *dP = P + (int64_t)MLA_BLOCK * T;
    for (int64_t t = 0; t < T; t++) {
        memset(dK + t * ldq, 0, (size_t)m->dqk * sizeof(REAL));
        memset(dV + t * ldv, 0, (size_t)m->dv * sizeof(REAL));
    }
    int64_t doc = 0, doc2 = 0;
    for (int64_t r0 = 0; r0 < T; r0 += MLA_BLOCK) {
        int64_t rows = T - r0 < MLA_BLOCK ? T - r0 : MLA_BLOCK, keys = r0 + rows;
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 0, 1, rows, keys, m->dqk, m->scale, Q + r0 * ldq, ldq,
                           K, ldq, 0.0, P, keys, e));
        for (int64_t i = 0; i < rows; i++) {
            REAL *pi = P + i * keys, l = lse[r0 + i];
            int64_t n = r0 + i + 1, f = SUF(doc_first)(c, b, r0 + i, &doc);
            memset(pi, 0, (size_t)f * sizeof(REAL));
            for (int64_t j = f; j < n; j++)
                pi[j] = EXP(pi[j] - l);
            memset(pi + n, 0, (size_t)(keys - n) * sizeof(REAL));
        }
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 1, 0, keys, m->dv, rows, 1.0, P, keys, dO + r0 * ldv, ldv,
                           1.0, dV, ldv, e));
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 0, 1, rows, keys, m->dv, 1.0, dO + r0 * ldv, ldv, V, ldv,
                           0.0, dP, keys, e));
        for (int64_t i = 0; i < rows; i++) {
            const REAL *oi = O + (r0 + i) * ldv, *doi = dO + (r0 + i) * ldv, *pi = P + i * keys;
            REAL *di = dP + i * keys;
            double D = 0;
            for (int64_t j = 0; j < m->dv; j++)
                D += (double)doi[j] * (double)oi[j];
            int64_t n = r0 + i + 1, f = SUF(doc_first)(c, b, r0 + i, &doc2);
            REAL Dr = (REAL)D;
            memset(di, 0, (size_t)f * sizeof(REAL));
            for (int64_t j = f; j < n; j++)
                di[j] = pi[j] * (di[j] - Dr);
            memset(di + n, 0, (size_t)(keys - n) * sizeof(REAL));
        }
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 0, 0, rows, m->dqk, keys, m->scale, dP, keys, K, ldq, 0.0,
                           dQ + r0 * ldq, ldq, e));
        K3RT_TRY(k3rt_gemm(c->s, DTYPE, 1, 0, keys, m->dqk, rows, m->scale, dP, keys,
                           Q + r0 * ldq, ldq, 1.0, dK, ldq, e));
    }
    return K3RT_OK;
}

/* Slot `slot` owns items slot, slot + slots, ... and scratch slot `slot`; k3rt_parallel_for
 * over the slots gives each thread its own scratch. */
static void SUF(attn_fwd_range)(void *ctx, int64_t begin, int64_t end)
{
    SUF(attn) *c = ctx;
    k3rt_error e;
    for (int64_t slot = begin; slot < end; slot++) {
        REAL *S = c->scratch + slot * c->scratch_per_slot;
        for (int64_t it = slot; it < c->B * c->m->H && !atomic_load(&c->failed); it += c->slots)
            if (SUF(attn_fwd_item)(c, it, S, &e))
                SUF(attn_fail)(c, &e);
    }
}

static void SUF(attn_bwd_range)(void *ctx, int64_t begin, int64_t end)
{
    SUF(attn) *c = ctx;
    k3rt_error e;
    for (int64_t slot = begin; slot < end; slot++) {
        REAL *P = c->scratch + slot * c->scratch_per_slot;
        for (int64_t it = slot; it < c->B * c->m->H && !atomic_load(&c->failed); it += c->slots)
            if (SUF(attn_bwd_item)(c, it, P, &e))
                SUF(attn_fail)(c, &e);
    }
}

static int SUF(attn_run)(SUF(attn) *c, k3rt_range_fn fn, k3rt_error *err)
{
    int64_t items = c->B * c->m->H;
    int threads = k3rt_stream_threads(c->s);
    c->slots = c->m->slots < threads ? c->m->slots : threads;
    if (c->slots > items)
        c->slots = (int)items;
    atomic_init(&c->failed, 0);
    k3rt_parallel_for(c->s, c->slots, 1, fn, c);
    if (atomic_load(&c->failed)) {
        *err = c->err;
        return k3rt_error_prefix(err, "mla attention: ");
    }
    return K3RT_OK;
}

/* ---- layout helpers ------------------------------------------------------------------------ */

/* dst[n, h, off : off+w] = src[n, h*w : (h+1)*w] for every token n and head h (row pitch dp). */
static void SUF(scatter_heads)(REAL *dst, int64_t dp, int64_t off, const REAL *src, int64_t N,
                               int64_t H, int64_t w)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++)
            memcpy(dst + (n * H + h) * dp + off, src + (n * H + h) * w, (size_t)w * sizeof(REAL));
}

static void SUF(gather_heads)(REAL *dst, const REAL *src, int64_t dp, int64_t off, int64_t N,
                              int64_t H, int64_t w)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < H; h++)
            memcpy(dst + (n * H + h) * w, src + (n * H + h) * dp + off, (size_t)w * sizeof(REAL));
}

/* Parameter (or gradient) tensors by slot; NULL for slots this configuration lacks. */
static void SUF(by_slot)(const mla *m, const k3rt_tensor *t, REAL *out[MLA_N_SLOTS])
{
    for (int s = 0; s < MLA_N_SLOTS; s++)
        out[s] = m->slot[s] >= 0 ? (REAL *)t[m->slot[s]].data : NULL;
}

/* ---- forward ------------------------------------------------------------------------------- */

int SUF(mla_forward)(mla *m, const k3rt_fwd_args *a, k3rt_error *err)
{
    k3rt_stream *s = a->stream;
    int64_t B = a->batch, T = a->seq, N = B * T, H = m->H, d = m->d;
    int64_t dn = m->dn, dr = m->dr, dv = m->dv, dc = m->dc, rq = m->rq, dqk = m->dqk;
    mla_layout L;
    mla_layout_make(m, B, T, m->slots, &L);
    REAL *ws = a->workspace, *W[MLA_N_SLOTS];
    SUF(by_slot)(m, a->params, W);
    const REAL *x = a->x.data;

    /* Queries: qin = RMSNorm(x Wqa^T) (rq > 0; keeps qa, its rstd and qan) or x. */
    const REAL *qin = x;
    int64_t din = d;
    if (rq) {
        K3RT_TRY(k3rt_linear_fwd(s, DTYPE, x, W[MLA_Q_A], NULL, SV(L.qa), N, d, rq, err));
        K3RT_TRY(k3rt_rmsnorm_fwd(s, DTYPE, SV(L.qa), W[MLA_Q_A_NORM], SV(L.qan),
                                  SV(L.q_rstd), N, rq, m->eps, err));
        qin = SV(L.qan), din = rq;
    }
    K3RT_TRY(k3rt_linear_fwd(s, DTYPE, qin, W[MLA_Q_NOPE], NULL, ws + L.f_qn, N, din, H * dn,
                             err));
    if (dr)
        K3RT_TRY(k3rt_linear_fwd(s, DTYPE, qin, W[MLA_Q_SHARED], NULL, ws + L.f_qr, N, din,
                                 H * dr, err));

    /* Latent c (kept with its rstd and ĉ) and the shared key kr: the two row blocks of Wkva. */
    K3RT_TRY(k3rt_linear_fwd(s, DTYPE, x, W[MLA_KV_A], NULL, SV(L.c), N, d, dc, err));
    if (dr)
        K3RT_TRY(k3rt_linear_fwd(s, DTYPE, x, W[MLA_KV_A] + dc * d, NULL, ws + L.f_kr, N, d, dr,
                                 err));
    K3RT_TRY(k3rt_rmsnorm_fwd(s, DTYPE, SV(L.c), W[MLA_KV_A_NORM], SV(L.chat), SV(L.kv_rstd),
                              N, dc, m->eps, err));
    K3RT_TRY(k3rt_linear_fwd(s, DTYPE, SV(L.chat), W[MLA_K_B], NULL, ws + L.f_kn, N, dc, H * dn,
                             err));
    K3RT_TRY(k3rt_linear_fwd(s, DTYPE, SV(L.chat), W[MLA_V_B], NULL, SV(L.v), N, dc, H * dv,
                             err));

    /* Q, K as [B, T, H, dn | dr]; every head's key gets the same kr (kept). */
    SUF(scatter_heads)(SV(L.q), dqk, 0, ws + L.f_qn, N, H, dn);
    SUF(scatter_heads)(SV(L.k), dqk, 0, ws + L.f_kn, N, H, dn);
    if (dr) {
        SUF(scatter_heads)(SV(L.q), dqk, dn, ws + L.f_qr, N, H, dr);
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < H; h++)
                memcpy(SV(L.k) + (n * H + h) * dqk + dn, ws + L.f_kr + n * dr,
                       (size_t)dr * sizeof(REAL));
    }

    /* O = causal softmax attention per (b, h); lse kept; per-head max logit into the stats. */
    SUF(attn) c;
    memset(&c, 0, sizeof c);
    c.m = m, c.s = s, c.B = B, c.T = T;
    c.q = SV(L.q), c.k = SV(L.k), c.v = SV(L.v), c.out = SV(L.o), c.lse = SV(L.lse);
    c.item_max = ws + L.f_max;
    c.docs = a->doc_offsets.ndim ? a->doc_offsets.data : NULL;
    c.n_docs = a->doc_offsets.ndim ? a->doc_offsets.shape[0] - 1 : 0;
    c.scratch = ws + L.f_scratch, c.scratch_per_slot = (int64_t)MLA_BLOCK * T;
    K3RT_TRY(SUF(attn_run)(&c, SUF(attn_fwd_range), err));
    for (int64_t h = 0; h < H; h++) {
        double top = m->max_logit[h];
        for (int64_t b = 0; b < B; b++)
            top = SUF(nan_max)(top, (double)c.item_max[b * H + h]);
        m->max_logit[h] = (float)top;
    }

    /* Output gate (z = x Wg^T kept): og = O ⊙ sigmoid(z); y = og Wo^T. */
    const REAL *og = SV(L.o);
    if (m->gate) {
        REAL *z = SV(L.z), *g = ws + L.f_og;
        const REAL *o = SV(L.o);
        K3RT_TRY(k3rt_linear_fwd(s, DTYPE, x, W[MLA_GATE], NULL, z, N, d, H * dv, err));
        for (int64_t i = 0; i < N * H * dv; i++)
            g[i] = o[i] * SUF(sigmoid)(z[i]);
        og = g;
    }
    return k3rt_linear_fwd(s, DTYPE, og, W[MLA_O], NULL, a->y.data, N, H * dv, d, err);
}

/* ---- backward ------------------------------------------------------------------------------ */

int SUF(mla_backward)(mla *m, const k3rt_bwd_args *a, k3rt_error *err)
{
    k3rt_stream *s = a->stream;
    int64_t B = a->batch, T = a->seq, N = B * T, H = m->H, d = m->d;
    int64_t dn = m->dn, dr = m->dr, dv = m->dv, dc = m->dc, rq = m->rq, dqk = m->dqk;
    mla_layout L;
    mla_layout_make(m, B, T, m->slots, &L);
    REAL *ws = a->workspace, *W[MLA_N_SLOTS], *G[MLA_N_SLOTS];
    SUF(by_slot)(m, a->params, W);
    SUF(by_slot)(m, a->grads, G);
    const REAL *x = a->x.data, *dy = a->dy.data, *o = SV(L.o);
    REAL *dx = a->dx.data;
    int acc = 0; /* dx is overwritten by its first contribution, then accumulated */

    /* Output projection and gate: dog = dy Wo; dWo += dy^T og;
     * dz = dog ⊙ O ⊙ σ'(z) -> dWg, dx;  dO = dog ⊙ σ(z). */
    REAL *dO = ws + L.b_g2;
    if (m->gate) {
        const REAL *z = SV(L.z);
        REAL *g1 = ws + L.b_g1;
        for (int64_t i = 0; i < N * H * dv; i++)
            g1[i] = o[i] * SUF(sigmoid)(z[i]);
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, g1, W[MLA_O], dy, dO, G[MLA_O], NULL, N, H * dv, d, 0,
                                 err));
        for (int64_t i = 0; i < N * H * dv; i++) {
            REAL sg = SUF(sigmoid)(z[i]);
            g1[i] = dO[i] * o[i] * sg * ((REAL)1 - sg);
            dO[i] *= sg;
        }
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, x, W[MLA_GATE], g1, dx, G[MLA_GATE], NULL, N, d,
                                 H * dv, 0, err));
        acc = 1;
    } else {
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, o, W[MLA_O], dy, dO, G[MLA_O], NULL, N, H * dv, d, 0,
                                 err));
    }

    /* Attention: dQ, dK, dV per (b, h). */
    SUF(attn) c;
    memset(&c, 0, sizeof c);
    c.m = m, c.s = s, c.B = B, c.T = T;
    c.q = SV(L.q), c.k = SV(L.k), c.v = SV(L.v), c.o = o, c.lse = SV(L.lse);
    c.dout = dO, c.dq = ws + L.b_dq, c.dk = ws + L.b_dk, c.dv = ws + L.b_dv;
    c.docs = a->doc_offsets.ndim ? a->doc_offsets.data : NULL;
    c.n_docs = a->doc_offsets.ndim ? a->doc_offsets.shape[0] - 1 : 0;
    c.scratch = ws + L.b_scratch, c.scratch_per_slot = 2 * (int64_t)MLA_BLOCK * T;
    K3RT_TRY(SUF(attn_run)(&c, SUF(attn_bwd_range), err));

    /* Split dQ, dK into their nope and shared parts; the shared key's gradient sums the heads
     * in order (deterministic). */
    REAL *dqn = ws + L.b_dqn, *dqr = ws + L.b_dqr, *dkn = ws + L.b_dkn, *dkr = ws + L.b_dkr;
    SUF(gather_heads)(dqn, c.dq, dqk, 0, N, H, dn);
    SUF(gather_heads)(dkn, c.dk, dqk, 0, N, H, dn);
    if (dr) {
        SUF(gather_heads)(dqr, c.dq, dqk, dn, N, H, dr);
        for (int64_t n = 0; n < N; n++) {
            REAL *g = dkr + n * dr;
            memset(g, 0, (size_t)dr * sizeof(REAL));
            for (int64_t h = 0; h < H; h++) {
                const REAL *src = c.dk + (n * H + h) * dqk + dn;
                for (int64_t j = 0; j < dr; j++)
                    g[j] += src[j];
            }
        }
    }

    /* Latent side: dĉ = dkn Wkb + dV Wvb; RMSNorm backward; dx += dc Wkva[:dc] + dkr Wkva[dc:]. */
    REAL *dchat = ws + L.b_dchat, *dcl = ws + L.b_dc;
    K3RT_TRY(k3rt_linear_bwd(s, DTYPE, SV(L.chat), W[MLA_K_B], dkn, dchat, G[MLA_K_B], NULL, N,
                             dc, H * dn, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, DTYPE, SV(L.chat), W[MLA_V_B], c.dv, dchat, G[MLA_V_B], NULL, N,
                             dc, H * dv, 1, err));
    K3RT_TRY(k3rt_rmsnorm_bwd(s, DTYPE, SV(L.c), W[MLA_KV_A_NORM], SV(L.kv_rstd), dchat, dcl,
                              G[MLA_KV_A_NORM], N, dc, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, DTYPE, x, W[MLA_KV_A], dcl, dx, G[MLA_KV_A], NULL, N, d, dc, acc,
                             err));
    acc = 1;
    if (dr)
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, x, W[MLA_KV_A] + dc * d, dkr, dx,
                                 G[MLA_KV_A] + dc * d, NULL, N, d, dr, 1, err));

    /* Query side: dqin = dqn Wqn + dqr Wqr, through the query RMSNorm and Wqa when rq > 0. */
    const REAL *qin = rq ? SV(L.qan) : x;
    int64_t din = rq ? rq : d;
    REAL *dqin = rq ? ws + L.b_dqin : dx;
    K3RT_TRY(k3rt_linear_bwd(s, DTYPE, qin, W[MLA_Q_NOPE], dqn, dqin, G[MLA_Q_NOPE], NULL, N, din,
                             H * dn, rq ? 0 : 1, err));
    if (dr)
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, qin, W[MLA_Q_SHARED], dqr, dqin, G[MLA_Q_SHARED], NULL,
                                 N, din, H * dr, 1, err));
    if (rq) {
        REAL *dqa = ws + L.b_dqa;
        K3RT_TRY(k3rt_rmsnorm_bwd(s, DTYPE, SV(L.qa), W[MLA_Q_A_NORM], SV(L.q_rstd), dqin, dqa,
                                  G[MLA_Q_A_NORM], N, rq, 0, err));
        K3RT_TRY(k3rt_linear_bwd(s, DTYPE, x, W[MLA_Q_A], dqa, dx, G[MLA_Q_A], NULL, N, d, rq, 1,
                                 err));
    }
    return K3RT_OK;
}
