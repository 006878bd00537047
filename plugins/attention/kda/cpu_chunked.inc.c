/* Chunkwise-parallel KDA for one (sequence, value head): spec §4.1 (forward) and §5.1
 * (backward), in the form
 *
 *   within a chunk of n tokens (rows r), S = state at the chunk start, G_r = sum_{t<=r} g_t:
 *   Aqk[r,i] = scale sum_d q[r,d] k[i,d] e^{G[r,d]-G[i,d]}   i <= r
 *   Lk[r,i]  =       sum_d k[r,d] k[i,d] e^{G[r,d]-G[i,d]}   i <  r   (L = Diag(beta) Lk)
 *   Δ  = (I + L)^{-1} (beta ⊙ (V - (k ⊙ Γ) S))                       Γ_r = e^{G_r}
 *   O  = (scale q ⊙ Γ) S + Aqk Δ
 *   S' = Diag(Γ_last) S + (k ⊙ Γ̄)^T Δ                                Γ̄_r = e^{G_last - G_r}
 *
 * (FlashKDA's one-product form of Δ; (I+L)^{-1} is never formed: triangular solves instead.)
 * Every product with S, Δ and the pairwise matrices goes through k3rt_gemm; the rank-1 updates
 * of the recurrent form become [n x dim_k] x [dim_k x dim_v] products.
 *
 * The pairwise matrices need e^{G_r - G_i} without overflow (spec §4.2). They are built block
 * row by block row (KDA_SUB rows): rows r of the block and all columns i up to the block's end
 * meet through the block's first token n0,
 *   e^{G_r - G_i} = e^{G_r - G_n0} e^{G_n0 - G_i},
 * so one product per block row does them all. Before the block every factor is <= 1; inside
 * it, the block's decay must stay below KDA_THETA (80 nats: always so with a lower bound of -5;
 * an unbounded gate may exceed it): otherwise the diagonal block is summed exactly, pair by
 * pair. The decays e^{±g} are multiplied up rather than exponentiated per pair, so a chunk
 * costs one exponential and one reciprocal per key channel and token.
 *
 * Saved: nothing but the chunk-start states; the backward recomputes the chunk. */

/* Scratch of one head, carved from its slot. */
typedef struct SUF(chunk) {
    int64_t n, t0;           /* rows in this chunk, first token */
    REAL *a, *ai, *G;        /* [C, dim_k] e^g, e^-g, cumulative g within the chunk */
    REAL *gam, *gbar;        /* [C, dim_k] e^{G_r}, e^{G_last - G_r} */
    REAL *Qg, *Kg, *Kb;      /* [C, dim_k] scale q ⊙ Γ, k ⊙ Γ, k ⊙ Γ̄ */
    REAL *bt;                /* [C] beta */
    REAL *A, *L;             /* [C, C] Aqk, Lk (row stride C) */
    REAL *Qs, *Ks, *er, *ek; /* block row: [2 SUB, dim_k] sides, [C, dim_k], factors
                                [SUB, dim_k], [C, dim_k] */
    REAL *X, *Et, *S;        /* [C, w] Δ, [C, w] rows before beta, [dim_k, w] state
                                (w <= dim_k + dim_v) */
    /* backward */
    REAL *dA, *dL;           /* [C, C] */
    REAL *R, *Rt;            /* [C, dim_v] (I+L)^-T dΔ, beta ⊙ R */
    REAL *dS, *dSn;          /* [dim_k, dim_v] gradient at the chunk end, then at its start */
    REAL *dgam;              /* [dim_k] */
    REAL *dQg, *dKg, *dKb;   /* [C, dim_k] */
    REAL *dQ, *dK, *dG;      /* [C, dim_k] */
    REAL *dQs, *dKs;         /* [2 SUB, dim_k], [C, dim_k] */
} SUF(chunk);

/* Lays the buffers out from base (sizes only when base is NULL); returns the elements used. */
static int64_t SUF(chunk_carve)(const kda_dims *d, REAL *base, SUF(chunk) *c)
{
    int64_t C = d->C, dim_k = d->dim_k, dim_v = d->dim_v, w = dim_k + dim_v, at = 0;
    REAL **order[] = {&c->a,  &c->ai, &c->G,  &c->gam, &c->gbar, &c->Qg,  &c->Kg,  &c->Kb,
                      &c->bt, &c->A,  &c->L,  &c->Qs,  &c->Ks,   &c->er,  &c->ek,  &c->X,
                      &c->Et, &c->S,  &c->dA, &c->dL,  &c->R,    &c->Rt,  &c->dS,  &c->dSn,
                      &c->dgam, &c->dQg, &c->dKg, &c->dKb, &c->dQ, &c->dK, &c->dG, &c->dQs,
                      &c->dKs};
    /* the sizes of order[], row by row */
    int64_t size[] = {C * dim_k,  C * dim_k,  C * dim_k,      C * dim_k,
                      C * dim_k,  C * dim_k,  C * dim_k,      C * dim_k,
                      C,          C * C,      C * C,          2 * KDA_SUB * dim_k,
                      C * dim_k,  KDA_SUB * dim_k, C * dim_k, C * w,
                      C * w,      dim_k * w,  C * C,          C * C,
                      C * dim_v,  C * dim_v,  dim_k * dim_v,  dim_k * dim_v,
                      dim_k,      C * dim_k,  C * dim_k,      C * dim_k,
                      C * dim_k,  C * dim_k,  C * dim_k,      2 * KDA_SUB * dim_k,
                      C * dim_k};
    for (size_t i = 0; i < sizeof size / sizeof size[0]; i++) {
        if (base)
            *order[i] = base + at;
        at += KDA_ROUND(size[i]);
    }
    return at;
}

static int64_t SUF(chunk_scratch)(const kda_dims *d)
{
    SUF(chunk) c;
    return SUF(chunk_carve)(d, NULL, &c);
}

/* Block row [n0, e]: columns [0, *nc) covered by the product Qs Ks^T, and *fb = 1 when the
 * diagonal block must be summed exactly. The reference is the block's first token n0:
 * Qs = [scale q_r ; k_r] ⊙ e^{G_r - G_n0} (2 bl rows), er = e^{G_r - G_n0} <= 1;
 * Ks = k_i ⊙ e^{G_n0 - G_i}, ek = e^{G_n0 - G_i}: <= 1 before the block, <= e^KDA_THETA in it.
 * Nothing here depends on tokens after a row except entries above the diagonal, which are
 * masked: outputs stay exactly causal. */
static void SUF(block_sides)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c, int64_t n0,
                             int64_t e, int64_t *nc, int *fb)
{
    int64_t dim_k = d->dim_k, bl = e - n0 + 1;
    const REAL *G = c->G;
    int f = 0;
    for (int64_t r = n0 + 1; r <= e; r++)
        for (int64_t j = 0; j < dim_k; j++)
            if (fabs((double)(G[n0 * dim_k + j] - G[r * dim_k + j])) > KDA_THETA)
                f = 1;
    *fb = f;
    *nc = f ? n0 : e + 1;
    REAL *er = c->er, *ek = c->ek;
    for (int64_t j = 0; j < dim_k; j++)
        er[j] = 1;
    for (int64_t r = n0 + 1; r <= e; r++)
        for (int64_t j = 0; j < dim_k; j++)
            er[(r - n0) * dim_k + j] = er[(r - 1 - n0) * dim_k + j] * c->a[r * dim_k + j];
    REAL s = (REAL)d->scale;
    for (int64_t r = n0; r <= e; r++) {
        const REAL *q = h->q + (c->t0 + r) * h->sq, *k = h->k + (c->t0 + r) * h->sq;
        const REAL *f_ = er + (r - n0) * dim_k;
        REAL *qs = c->Qs + (r - n0) * dim_k, *ks = c->Qs + (bl + r - n0) * dim_k;
        for (int64_t j = 0; j < dim_k; j++) {
            qs[j] = s * q[j] * f_[j];
            ks[j] = k[j] * f_[j];
        }
    }
    if (*nc == 0)
        return;
    for (int64_t j = 0; j < dim_k; j++)
        ek[n0 * dim_k + j] = 1;
    for (int64_t i = n0 + 1; i < *nc; i++)
        for (int64_t j = 0; j < dim_k; j++)
            ek[i * dim_k + j] = ek[(i - 1) * dim_k + j] * c->ai[i * dim_k + j];
    for (int64_t i = n0 - 1; i >= 0; i--)
        for (int64_t j = 0; j < dim_k; j++)
            ek[i * dim_k + j] = ek[(i + 1) * dim_k + j] * c->a[(i + 1) * dim_k + j];
    for (int64_t i = 0; i < *nc; i++) {
        const REAL *k = h->k + (c->t0 + i) * h->sq;
        for (int64_t j = 0; j < dim_k; j++)
            c->Ks[i * dim_k + j] = k[j] * ek[i * dim_k + j];
    }
}

/* The diagonal block of a block row, pair by pair with e^{G_r - G_i} taken directly. */
static void SUF(diag_exact)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c, int64_t n0,
                            int64_t e)
{
    int64_t dim_k = d->dim_k, C = d->C;
    for (int64_t r = n0; r <= e; r++) {
        const REAL *q = h->q + (c->t0 + r) * h->sq, *kr = h->k + (c->t0 + r) * h->sq;
        for (int64_t i = n0; i <= r; i++) {
            const REAL *ki = h->k + (c->t0 + i) * h->sq;
            REAL sq = 0, sk = 0;
            for (int64_t j = 0; j < dim_k; j++) {
                REAL x = EXP(c->G[r * dim_k + j] - c->G[i * dim_k + j]) * ki[j];
                sq += q[j] * x;
                sk += kr[j] * x;
            }
            c->A[r * C + i] = (REAL)d->scale * sq;
            if (i < r)
                c->L[r * C + i] = sk;
        }
    }
}

static void SUF(diag_exact_bwd)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c,
                                int64_t n0, int64_t e)
{
    int64_t dim_k = d->dim_k, C = d->C;
    REAL s = (REAL)d->scale;
    for (int64_t r = n0; r <= e; r++) {
        const REAL *q = h->q + (c->t0 + r) * h->sq, *kr = h->k + (c->t0 + r) * h->sq;
        for (int64_t i = n0; i <= r; i++) {
            const REAL *ki = h->k + (c->t0 + i) * h->sq;
            REAL ca = s * c->dA[r * C + i], cl = i < r ? c->dL[r * C + i] : 0;
            for (int64_t j = 0; j < dim_k; j++) {
                REAL x = EXP(c->G[r * dim_k + j] - c->G[i * dim_k + j]);
                REAL t = (ca * q[j] + cl * kr[j]) * ki[j] * x;
                c->dQ[r * dim_k + j] += ca * ki[j] * x;
                c->dK[r * dim_k + j] += cl * ki[j] * x;
                c->dK[i * dim_k + j] += (ca * q[j] + cl * kr[j]) * x;
                if (i < r) { /* e^{G_r - G_r} = 1 has no gate gradient */
                    c->dG[r * dim_k + j] += t;
                    c->dG[i * dim_k + j] -= t;
                }
            }
        }
    }
}

/* Aqk and Lk of the chunk (zero above their diagonals). */
static void SUF(chunk_pairs)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c,
                             SUF(kda_mm) *mm)
{
    int64_t n = c->n, C = d->C, dim_k = d->dim_k;
    for (int64_t r = 0; r < n; r++) {
        memset(c->A + r * C, 0, (size_t)n * sizeof(REAL));
        memset(c->L + r * C, 0, (size_t)n * sizeof(REAL));
    }
    for (int64_t n0 = 0; n0 < n; n0 += KDA_SUB) {
        int64_t e = KDA_MIN(n0 + KDA_SUB, n) - 1, bl = e - n0 + 1, nc;
        int fb;
        SUF(block_sides)(d, h, c, n0, e, &nc, &fb);
        SUF(mm)(mm, 0, 1, bl, nc, dim_k, 1, c->Qs, dim_k, c->Ks, dim_k, 0, c->A + n0 * C, C);
        SUF(mm)(mm, 0, 1, bl, nc, dim_k, 1, c->Qs + bl * dim_k, dim_k, c->Ks, dim_k, 0,
                c->L + n0 * C, C);
        if (fb)
            SUF(diag_exact)(d, h, c, n0, e);
        else
            for (int64_t r = n0; r <= e; r++)
                for (int64_t i = r; i <= e; i++) {
                    if (i > r)
                        c->A[r * C + i] = 0;
                    c->L[r * C + i] = 0;
                }
    }
}

/* Backward of the pairwise matrices: dA = dL/dAqk, dL = dL/dLk (zero outside their
 * triangles) into dQ, dK, dG. The reference token's own terms cancel (the products do not
 * depend on G_n0) and are left out. */
static void SUF(chunk_pairs_bwd)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c,
                                 SUF(kda_mm) *mm)
{
    int64_t n = c->n, C = d->C, dim_k = d->dim_k;
    REAL s = (REAL)d->scale;
    /* Aqk[r,r] = scale q_r . k_r carries no decay: taken here, so the gate gradient is not
     * the difference of two sums that both hold it (exact in theory, rounding noise far
     * above the true gradient under strong decay). */
    for (int64_t r = 0; r < n; r++) {
        const REAL *q = h->q + (c->t0 + r) * h->sq, *k = h->k + (c->t0 + r) * h->sq;
        REAL a = s * c->dA[r * C + r];
        SUF(axpy)(a, k, c->dQ + r * dim_k, dim_k);
        SUF(axpy)(a, q, c->dK + r * dim_k, dim_k);
        c->dA[r * C + r] = 0;
    }
    for (int64_t n0 = 0; n0 < n; n0 += KDA_SUB) {
        int64_t e = KDA_MIN(n0 + KDA_SUB, n) - 1, bl = e - n0 + 1, nc;
        int fb;
        SUF(block_sides)(d, h, c, n0, e, &nc, &fb);
        if (nc > 0) {
            const REAL *dA = c->dA + n0 * C, *dL = c->dL + n0 * C;
            SUF(mm)(mm, 0, 0, bl, dim_k, nc, 1, dA, C, c->Ks, dim_k, 0, c->dQs, dim_k);
            SUF(mm)(mm, 0, 0, bl, dim_k, nc, 1, dL, C, c->Ks, dim_k, 0, c->dQs + bl * dim_k, dim_k);
            SUF(mm)(mm, 1, 0, nc, dim_k, bl, 1, dA, C, c->Qs, dim_k, 0, c->dKs, dim_k);
            SUF(mm)(mm, 1, 0, nc, dim_k, bl, 1, dL, C, c->Qs + bl * dim_k, dim_k, 1, c->dKs, dim_k);
            for (int64_t r = n0; r <= e; r++) {
                int64_t rr = r - n0;
                const REAL *f = c->er + rr * dim_k, *qs = c->Qs + rr * dim_k,
                    *ks = c->Qs + (bl + rr) * dim_k;
                const REAL *dqs = c->dQs + rr * dim_k, *dks = c->dQs + (bl + rr) * dim_k;
                for (int64_t j = 0; j < dim_k; j++) {
                    c->dQ[r * dim_k + j] += s * f[j] * dqs[j];
                    c->dK[r * dim_k + j] += f[j] * dks[j];
                    c->dG[r * dim_k + j] += dqs[j] * qs[j] + dks[j] * ks[j];
                }
            }
            for (int64_t i = 0; i < nc; i++)
                for (int64_t j = 0; j < dim_k; j++) {
                    c->dK[i * dim_k + j] += c->ek[i * dim_k + j] * c->dKs[i * dim_k + j];
                    c->dG[i * dim_k + j] -= c->dKs[i * dim_k + j] * c->Ks[i * dim_k + j];
                }
        }
        if (fb)
            SUF(diag_exact_bwd)(d, h, c, n0, e);
    }
}

/* Stage A of the chunk starting at t0: decays, Γ, Γ̄, the scaled q/k rows and the pairwise
 * matrices. */
static void SUF(chunk_prep)(const kda_dims *d, const SUF(kda_head) *h, int64_t t0, SUF(chunk) *c,
                            SUF(kda_mm) *mm)
{
    int64_t dim_k = d->dim_k, n = KDA_MIN(d->C, d->T - t0);
    REAL s = (REAL)d->scale;
    c->n = n;
    c->t0 = t0;
    for (int64_t r = 0; r < n; r++) {
        const REAL *g = h->g + (t0 + r) * h->sg;
        for (int64_t j = 0; j < dim_k; j++) {
            int64_t x = r * dim_k + j;
            c->a[x] = EXP(g[j]);
            /* only read inside blocks that decay < KDA_THETA, where a >= e^-80 */
            c->ai[x] = 1 / c->a[x];
            c->G[x] = (r ? c->G[x - dim_k] : 0) + g[j];
            c->gam[x] = (r ? c->gam[x - dim_k] : 1) * c->a[x];
        }
        c->bt[r] = h->beta[(t0 + r) * h->sb];
    }
    for (int64_t j = 0; j < dim_k; j++)
        c->gbar[(n - 1) * dim_k + j] = 1;
    for (int64_t r = n - 2; r >= 0; r--)
        for (int64_t j = 0; j < dim_k; j++)
            c->gbar[r * dim_k + j] = c->gbar[(r + 1) * dim_k + j] * c->a[(r + 1) * dim_k + j];
    for (int64_t r = 0; r < n; r++) {
        const REAL *q = h->q + (t0 + r) * h->sq, *k = h->k + (t0 + r) * h->sq;
        for (int64_t j = 0; j < dim_k; j++) {
            int64_t x = r * dim_k + j;
            c->Qg[x] = s * q[j] * c->gam[x];
            c->Kg[x] = k[j] * c->gam[x];
            c->Kb[x] = k[j] * c->gbar[x];
        }
    }
    SUF(chunk_pairs)(d, h, c, mm);
}

/* X <- (I + Diag(beta) Lk)^{-1} X, rows in order; blocks before a block row are one product.
 * Et (optional) receives each row before its beta scaling. */
static void SUF(subst_fwd)(const kda_dims *d, SUF(chunk) *c, REAL *X, int64_t w, REAL *Et,
                           SUF(kda_mm) *mm)
{
    int64_t n = c->n, C = d->C;
    for (int64_t n0 = 0; n0 < n; n0 += KDA_SUB) {
        int64_t e = KDA_MIN(n0 + KDA_SUB, n) - 1, bl = e - n0 + 1;
        SUF(mm)(mm, 0, 0, bl, w, n0, -1, c->L + n0 * C, C, X, w, 1, X + n0 * w, w);
        for (int64_t r = n0; r <= e; r++) {
            REAL *xr = X + r * w;
            for (int64_t i = n0; i < r; i++)
                SUF(axpy)(-c->L[r * C + i], X + i * w, xr, w);
            if (Et)
                memcpy(Et + r * w, xr, (size_t)w * sizeof(REAL));
            for (int64_t j = 0; j < w; j++)
                xr[j] *= c->bt[r];
        }
    }
}

/* Solves (I + Diag(beta) Lk)^T R = X in place, rows in reverse; Rt = beta ⊙ R. */
static void SUF(subst_bwd)(const kda_dims *d, SUF(chunk) *c, REAL *X, REAL *Rt, int64_t w,
                           SUF(kda_mm) *mm)
{
    int64_t n = c->n, C = d->C;
    for (int64_t n0 = (n - 1) / KDA_SUB * KDA_SUB; n0 >= 0; n0 -= KDA_SUB) {
        int64_t e = KDA_MIN(n0 + KDA_SUB, n) - 1, bl = e - n0 + 1;
        SUF(mm)(mm, 1, 0, bl, w, n - e - 1, -1, c->L + (e + 1) * C + n0, C, Rt + (e + 1) * w, w,
                1, X + n0 * w, w);
        for (int64_t r = e; r >= n0; r--) {
            REAL *xr = X + r * w;
            for (int64_t i = r + 1; i <= e; i++)
                SUF(axpy)(-c->L[i * C + r], Rt + i * w, xr, w);
            for (int64_t j = 0; j < w; j++)
                Rt[r * w + j] = c->bt[r] * xr[j];
        }
    }
}

/* Δ of the chunk for a state S [dim_k, w]: X = rows of [0 | v | 0] (v at column voff) minus
 * (k ⊙ Γ) S, then the solve. */
static void SUF(chunk_delta)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c,
                             const REAL *S, int64_t w, int64_t voff, REAL *X, REAL *Et,
                             SUF(kda_mm) *mm)
{
    int64_t n = c->n, dim_v = d->dim_v;
    for (int64_t r = 0; r < n; r++) {
        REAL *xr = X + r * w;
        memset(xr, 0, (size_t)w * sizeof(REAL));
        memcpy(xr + voff, h->v + (c->t0 + r) * h->sv, (size_t)dim_v * sizeof(REAL));
    }
    SUF(mm)(mm, 0, 0, n, w, d->dim_k, -1, c->Kg, d->dim_k, S, w, 1, X, w);
    SUF(subst_fwd)(d, c, X, w, Et, mm);
}

/* S <- Diag(Γ_last) S + (k ⊙ Γ̄)^T Δ */
static void SUF(chunk_advance)(const kda_dims *d, SUF(chunk) *c, REAL *S, int64_t w,
                               const REAL *X, SUF(kda_mm) *mm)
{
    int64_t dim_k = d->dim_k;
    const REAL *gl = c->gam + (c->n - 1) * dim_k;
    for (int64_t j = 0; j < dim_k; j++)
        for (int64_t i = 0; i < w; i++)
            S[j * w + i] *= gl[j];
    SUF(mm)(mm, 1, 0, dim_k, w, c->n, 1, c->Kb, dim_k, X, w, 1, S, w);
}

static void SUF(chunked_fwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w,
                                  SUF(kda_mm) *mm)
{
    SUF(chunk) c;
    SUF(chunk_carve)(d, w, &c);
    int64_t dim_k = d->dim_k, dim_v = d->dim_v, ns = dim_k * dim_v;
    if (h->s0)
        memcpy(c.S, h->s0, (size_t)ns * sizeof(REAL));
    else
        memset(c.S, 0, (size_t)ns * sizeof(REAL));
    for (int64_t t0 = 0; t0 < d->T; t0 += d->C) {
        memcpy(h->states + t0 / d->C * ns, c.S, (size_t)ns * sizeof(REAL));
        SUF(chunk_prep)(d, h, t0, &c, mm);
        SUF(chunk_delta)(d, h, &c, c.S, dim_v, 0, c.X, NULL, mm);
        REAL *o = h->o + t0 * h->sv;
        SUF(mm)(mm, 0, 0, c.n, dim_v, dim_k, 1, c.Qg, dim_k, c.S, dim_v, 0, o, h->sv);
        SUF(mm)(mm, 0, 0, c.n, dim_v, c.n, 1, c.A, d->C, c.X, dim_v, 1, o, h->sv);
        SUF(chunk_advance)(d, &c, c.S, dim_v, c.X, mm);
    }
    if (h->s_final)
        memcpy(h->s_final, c.S, (size_t)ns * sizeof(REAL));
}

/* Backward of one chunk; c.dS holds the gradient of the state after it, c.dSn receives the
 * gradient of the state before it. */
static void SUF(chunk_bwd)(const kda_dims *d, const SUF(kda_head) *h, SUF(chunk) *c,
                           const REAL *S, SUF(kda_mm) *mm)
{
    int64_t n = c->n, t0 = c->t0, C = d->C, dim_k = d->dim_k, dim_v = d->dim_v, sv = h->sv;
    const REAL *dO = h->d_o + t0 * sv, *gl = c->gam + (n - 1) * dim_k;
    REAL s = (REAL)d->scale;
    /* O = Qg S + Aqk Δ;  S' = Diag(Γ_last) S + Kb^T Δ */
    SUF(mm)(mm, 0, 1, n, n, dim_v, 1, dO, sv, c->X, dim_v, 0, c->dA, C);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r + 1; i < n; i++)
            c->dA[r * C + i] = 0;
    SUF(mm)(mm, 1, 0, n, dim_v, n, 1, c->A, C, dO, sv, 0, c->R, dim_v);
    SUF(mm)(mm, 0, 0, n, dim_v, dim_k, 1, c->Kb, dim_k, c->dS, dim_v, 1, c->R, dim_v);
    SUF(mm)(mm, 1, 0, dim_k, dim_v, n, 1, c->Qg, dim_k, dO, sv, 0, c->dSn, dim_v);
    for (int64_t j = 0; j < dim_k; j++) {
        SUF(axpy)(gl[j], c->dS + j * dim_v, c->dSn + j * dim_v, dim_v);
        c->dgam[j] = SUF(dot)(S + j * dim_v, c->dS + j * dim_v, dim_v);
    }
    SUF(mm)(mm, 0, 1, n, dim_k, dim_v, 1, dO, sv, S, dim_v, 0, c->dQg, dim_k);
    SUF(mm)(mm, 0, 1, n, dim_k, dim_v, 1, c->X, dim_v, c->dS, dim_v, 0, c->dKb, dim_k);
    /* Δ = (I + L)^{-1} (beta ⊙ E),  E = V - Kg S */
    SUF(subst_bwd)(d, c, c->R, c->Rt, dim_v, mm);
    for (int64_t r = 0; r < n; r++) {
        h->dbeta[(t0 + r) * h->sb] = SUF(dot)(c->Et + r * dim_v, c->R + r * dim_v, dim_v);
        memcpy(h->dv + (t0 + r) * sv, c->Rt + r * dim_v, (size_t)dim_v * sizeof(REAL));
    }
    SUF(mm)(mm, 0, 1, n, n, dim_v, -1, c->Rt, dim_v, c->X, dim_v, 0, c->dL, C);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r; i < n; i++)
            c->dL[r * C + i] = 0;
    SUF(mm)(mm, 0, 1, n, dim_k, dim_v, -1, c->Rt, dim_v, S, dim_v, 0, c->dKg, dim_k);
    SUF(mm)(mm, 1, 0, dim_k, dim_v, n, -1, c->Kg, dim_k, c->Rt, dim_v, 1, c->dSn, dim_v);
    /* back to q, k and the cumulative gates */
    memset(c->dQ, 0, (size_t)(n * dim_k) * sizeof(REAL));
    memset(c->dK, 0, (size_t)(n * dim_k) * sizeof(REAL));
    memset(c->dG, 0, (size_t)(n * dim_k) * sizeof(REAL));
    SUF(chunk_pairs_bwd)(d, h, c, mm);
    REAL *last = c->dG + (n - 1) * dim_k;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < dim_k; j++) {
            int64_t x = r * dim_k + j;
            /* Γ̄ of the last row is e^0: no gate gradient (kept out for the same reason) */
            REAL kb = r < n - 1 ? c->dKb[x] * c->Kb[x] : 0;
            c->dQ[x] += s * c->gam[x] * c->dQg[x];
            c->dK[x] += c->gam[x] * c->dKg[x] + c->gbar[x] * c->dKb[x];
            c->dG[x] += c->dQg[x] * c->Qg[x] + c->dKg[x] * c->Kg[x] - kb;
            last[j] += kb;
        }
    for (int64_t j = 0; j < dim_k; j++)
        last[j] += gl[j] * c->dgam[j];
    /* G_r = sum_{t <= r} g_t */
    for (int64_t r = n - 2; r >= 0; r--)
        SUF(axpy)(1, c->dG + (r + 1) * dim_k, c->dG + r * dim_k, dim_k);
    for (int64_t r = 0; r < n; r++) {
        memcpy(h->dg + (t0 + r) * h->sg, c->dG + r * dim_k, (size_t)dim_k * sizeof(REAL));
        memcpy(h->dq + (t0 + r) * h->sdq, c->dQ + r * dim_k, (size_t)dim_k * sizeof(REAL));
        memcpy(h->dk + (t0 + r) * h->sdq, c->dK + r * dim_k, (size_t)dim_k * sizeof(REAL));
    }
}

static void SUF(chunked_bwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w,
                                  SUF(kda_mm) *mm)
{
    SUF(chunk) c;
    SUF(chunk_carve)(d, w, &c);
    int64_t ns = d->dim_k * d->dim_v, NT = kda_chunks(d->T, d->C);
    if (h->ds_final)
        memcpy(c.dS, h->ds_final, (size_t)ns * sizeof(REAL));
    else
        memset(c.dS, 0, (size_t)ns * sizeof(REAL));
    for (int64_t ci = NT - 1; ci >= 0; ci--) {
        const REAL *S = h->states + ci * ns;
        SUF(chunk_prep)(d, h, ci * d->C, &c, mm);
        SUF(chunk_delta)(d, h, &c, S, d->dim_v, 0, c.X, c.Et, mm);
        SUF(chunk_bwd)(d, h, &c, S, mm);
        REAL *t = c.dS;
        c.dS = c.dSn;
        c.dSn = t;
    }
    if (h->ds0)
        memcpy(h->ds0, c.dS, (size_t)ns * sizeof(REAL));
}
