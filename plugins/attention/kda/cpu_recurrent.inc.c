/* The token-by-token delta rule for one (sequence, value head) — the reference the chunked
 * form is tested against (spec §3.1 forward, §3.3 backward). The state S [dim_k, dim_v] is
 * walked row by row (key channel j), so each step is a few passes of dim_v-long vector loops.
 *
 * Saved: the state at every chunk start (every C tokens), as in the chunked form, so either
 * backward can follow either forward. The backward recomputes the states inside one chunk
 * from that checkpoint, keeping C states instead of T. */

/* One step: S <- Diag(a) S; e = v - S^T k; u = beta e; S <- S + k u^T; and, when q is given,
 * o = S^T (scale q). e and u receive dim_v values. */
static void SUF(rec_step)(int64_t dim_k, int64_t dim_v, REAL *S, const REAL *a, const REAL *k,
                          const REAL *v, REAL beta, const REAL *q, REAL scale, REAL *o, REAL *e,
                          REAL *u)
{
    memset(e, 0, (size_t)dim_v * sizeof(REAL));
    for (int64_t j = 0; j < dim_k; j++) { /* decay first, then read with the decayed state */
        REAL *Sj = S + j * dim_v, aj = a[j], kj = k[j];
        for (int64_t c = 0; c < dim_v; c++) {
            Sj[c] *= aj;
            e[c] += kj * Sj[c];
        }
    }
    for (int64_t c = 0; c < dim_v; c++) {
        e[c] = v[c] - e[c];
        u[c] = beta * e[c];
    }
    if (q)
        memset(o, 0, (size_t)dim_v * sizeof(REAL));
    for (int64_t j = 0; j < dim_k; j++) { /* write, then read o after the write */
        REAL *Sj = S + j * dim_v;
        SUF(axpy)(k[j], u, Sj, dim_v);
        if (q)
            SUF(axpy)(scale * q[j], Sj, o, dim_v);
    }
}

static void SUF(decay)(int64_t dim_k, const REAL *g, REAL *a)
{
    for (int64_t j = 0; j < dim_k; j++)
        a[j] = EXP(g[j]);
}

static int64_t SUF(rec_scratch)(const kda_dims *d)
{
    int64_t dim_k = d->dim_k, dim_v = d->dim_v, S = dim_k * dim_v;
    int64_t fwd = KDA_ROUND(S) + KDA_ROUND(dim_k) + 2 * KDA_ROUND(dim_v);
    int64_t bwd = d->C * KDA_ROUND(S) + 2 * KDA_ROUND(S) + KDA_ROUND(dim_k) + 4 * KDA_ROUND(dim_v);
    return fwd > bwd ? fwd : bwd;
}

static void SUF(rec_fwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w)
{
    int64_t dim_k = d->dim_k, dim_v = d->dim_v, ns = dim_k * dim_v;
    REAL *S = w, *a = S + KDA_ROUND(ns), *e = a + KDA_ROUND(dim_k), *u = e + KDA_ROUND(dim_v);
    if (h->s0)
        memcpy(S, h->s0, (size_t)ns * sizeof(REAL));
    else
        memset(S, 0, (size_t)ns * sizeof(REAL));
    for (int64_t t = 0; t < d->T; t++) {
        if (t % d->C == 0)
            memcpy(h->states + (t / d->C) * ns, S, (size_t)ns * sizeof(REAL));
        SUF(decay)(dim_k, h->g + t * h->sg, a);
        SUF(rec_step)(dim_k, dim_v, S, a, h->k + t * h->sq, h->v + t * h->sv, h->beta[t * h->sb],
                      h->q + t * h->sq, (REAL)d->scale, h->o + t * h->sv, e, u);
    }
    if (h->s_final)
        memcpy(h->s_final, S, (size_t)ns * sizeof(REAL));
}

/* Backward of one token (spec §3.3): Sp is the state before the token, dS the gradient of the
 * state after it on entry and of the state before it on exit. */
static void SUF(rec_bwd_token)(const kda_dims *d, const SUF(kda_head) *h, int64_t t,
                               const REAL *Sp, REAL *dS, REAL *St, REAL *a, REAL *e, REAL *u,
                               REAL *du, REAL *de)
{
    int64_t dim_k = d->dim_k, dim_v = d->dim_v;
    REAL s = (REAL)d->scale, beta = h->beta[t * h->sb];
    const REAL *q = h->q + t * h->sq, *k = h->k + t * h->sq, *v = h->v + t * h->sv;
    const REAL *dO = h->d_o + t * h->sv;
    REAL *dq = h->dq + t * h->sdq, *dk = h->dk + t * h->sdq, *dg = h->dg + t * h->sg;
    SUF(decay)(dim_k, h->g + t * h->sg, a);
    /* St = Diag(a) Sp (the decayed state), e = v - St^T k, u = beta e */
    memset(e, 0, (size_t)dim_v * sizeof(REAL));
    for (int64_t j = 0; j < dim_k; j++) {
        const REAL *Spj = Sp + j * dim_v;
        REAL *Stj = St + j * dim_v;
        for (int64_t c = 0; c < dim_v; c++) {
            Stj[c] = a[j] * Spj[c];
            e[c] += k[j] * Stj[c];
        }
    }
    for (int64_t c = 0; c < dim_v; c++) {
        e[c] = v[c] - e[c];
        u[c] = beta * e[c];
    }
    /* o = (St + k u^T)^T (s q): dS += s q dO^T; dq = s (St dO + k (u.dO)).
     * Write S = St + k u^T: dk = dS u, du = dS^T k. */
    REAL udo = SUF(dot)(u, dO, dim_v);
    memset(du, 0, (size_t)dim_v * sizeof(REAL));
    for (int64_t j = 0; j < dim_k; j++) {
        REAL *dSj = dS + j * dim_v;
        SUF(axpy)(s * q[j], dO, dSj, dim_v);
        dq[j] = s * (SUF(dot)(St + j * dim_v, dO, dim_v) + k[j] * udo);
        dk[j] = SUF(dot)(dSj, u, dim_v);
        SUF(axpy)(k[j], dSj, du, dim_v);
    }
    /* u = beta (v - St^T k) */
    h->dbeta[t * h->sb] = SUF(dot)(e, du, dim_v);
    REAL *dv = h->dv + t * h->sv;
    for (int64_t c = 0; c < dim_v; c++) {
        de[c] = beta * du[c];
        dv[c] = de[c];
    }
    /* dk -= St de; dSt = dS - k de^T; dg = rowsum(dSt ⊙ St); dSp = Diag(a) dSt */
    for (int64_t j = 0; j < dim_k; j++) {
        const REAL *Stj = St + j * dim_v;
        REAL *dSj = dS + j * dim_v;
        dk[j] -= SUF(dot)(Stj, de, dim_v);
        SUF(axpy)(-k[j], de, dSj, dim_v);
        dg[j] = SUF(dot)(dSj, Stj, dim_v);
        for (int64_t c = 0; c < dim_v; c++)
            dSj[c] *= a[j];
    }
}

static void SUF(rec_bwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w)
{
    int64_t dim_k = d->dim_k, dim_v = d->dim_v, ns = dim_k * dim_v, C = d->C,
        NT = kda_chunks(d->T, C);
    REAL *Sbuf = w, *St = Sbuf + C * KDA_ROUND(ns), *dS = St + KDA_ROUND(ns);
    REAL *a = dS + KDA_ROUND(ns), *e = a + KDA_ROUND(dim_k), *u = e + KDA_ROUND(dim_v);
    REAL *du = u + KDA_ROUND(dim_v), *de = du + KDA_ROUND(dim_v);
    if (h->ds_final)
        memcpy(dS, h->ds_final, (size_t)ns * sizeof(REAL));
    else
        memset(dS, 0, (size_t)ns * sizeof(REAL));
    for (int64_t c = NT - 1; c >= 0; c--) {
        int64_t t0 = c * C, n = KDA_MIN(C, d->T - t0);
        /* Sbuf[i] = state before token t0 + i */
        memcpy(Sbuf, h->states + c * ns, (size_t)ns * sizeof(REAL));
        for (int64_t i = 0; i + 1 < n; i++) {
            REAL *next = Sbuf + (i + 1) * KDA_ROUND(ns);
            int64_t t = t0 + i;
            memcpy(next, Sbuf + i * KDA_ROUND(ns), (size_t)ns * sizeof(REAL));
            SUF(decay)(dim_k, h->g + t * h->sg, a);
            SUF(rec_step)(dim_k, dim_v, next, a, h->k + t * h->sq, h->v + t * h->sv,
                          h->beta[t * h->sb], NULL, 0, NULL, e, u);
        }
        for (int64_t i = n - 1; i >= 0; i--)
            SUF(rec_bwd_token)(d, h, t0 + i, Sbuf + i * KDA_ROUND(ns), dS, St, a, e, u, du, de);
    }
    if (h->ds0)
        memcpy(h->ds0, dS, (size_t)ns * sizeof(REAL));
}
