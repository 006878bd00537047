/* The token-by-token delta rule for one (sequence, value head) — the reference the chunked
 * form is tested against (spec §3.1 forward, §3.3 backward). The state S [dk, dv] is walked row
 * by row (key channel j), so each step is a few passes of dv-long vector loops.
 *
 * Saved: the state at every chunk start (every C tokens), as in the chunked form, so either
 * backward can follow either forward. The backward recomputes the states inside one chunk
 * from that checkpoint, keeping C states instead of T. */

/* One step: S <- Diag(a) S; e = v - S^T k; u = beta e; S <- S + k u^T; and, when q is given,
 * o = S^T (scale q). e and u receive dv values. */
static void SUF(rec_step)(int64_t dk, int64_t dv, REAL *S, const REAL *a, const REAL *k,
                          const REAL *v, REAL beta, const REAL *q, REAL scale, REAL *o, REAL *e,
                          REAL *u)
{
    memset(e, 0, (size_t)dv * sizeof(REAL));
    for (int64_t j = 0; j < dk; j++) { /* decay first, then read with the decayed state */
        REAL *Sj = S + j * dv, aj = a[j], kj = k[j];
        for (int64_t c = 0; c < dv; c++) {
            Sj[c] *= aj;
            e[c] += kj * Sj[c];
        }
    }
    for (int64_t c = 0; c < dv; c++) {
        e[c] = v[c] - e[c];
        u[c] = beta * e[c];
    }
    if (q)
        memset(o, 0, (size_t)dv * sizeof(REAL));
    for (int64_t j = 0; j < dk; j++) { /* write, then read o after the write */
        REAL *Sj = S + j * dv;
        SUF(axpy)(k[j], u, Sj, dv);
        if (q)
            SUF(axpy)(scale * q[j], Sj, o, dv);
    }
}

static void SUF(decay)(int64_t dk, const REAL *g, REAL *a)
{
    for (int64_t j = 0; j < dk; j++)
        a[j] = EXP(g[j]);
}

static int64_t SUF(rec_scratch)(const kda_dims *d)
{
    int64_t dk = d->dk, dv = d->dv, S = dk * dv;
    int64_t fwd = KDA_ROUND(S) + KDA_ROUND(dk) + 2 * KDA_ROUND(dv);
    int64_t bwd = d->C * KDA_ROUND(S) + 2 * KDA_ROUND(S) + KDA_ROUND(dk) + 4 * KDA_ROUND(dv);
    return fwd > bwd ? fwd : bwd;
}

static void SUF(rec_fwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w)
{
    int64_t dk = d->dk, dv = d->dv, ns = dk * dv;
    REAL *S = w, *a = S + KDA_ROUND(ns), *e = a + KDA_ROUND(dk), *u = e + KDA_ROUND(dv);
    if (h->s0)
        memcpy(S, h->s0, (size_t)ns * sizeof(REAL));
    else
        memset(S, 0, (size_t)ns * sizeof(REAL));
    for (int64_t t = 0; t < d->T; t++) {
        if (t % d->C == 0)
            memcpy(h->states + (t / d->C) * ns, S, (size_t)ns * sizeof(REAL));
        SUF(decay)(dk, h->g + t * h->sg, a);
        SUF(rec_step)(dk, dv, S, a, h->k + t * h->sq, h->v + t * h->sv, h->beta[t * h->sb],
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
    int64_t dk = d->dk, dv = d->dv;
    REAL s = (REAL)d->scale, beta = h->beta[t * h->sb];
    const REAL *q = h->q + t * h->sq, *k = h->k + t * h->sq, *v = h->v + t * h->sv;
    const REAL *dO = h->d_o + t * h->sv;
    REAL *dq = h->dq + t * h->sdq, *dk_ = h->dk + t * h->sdq, *dg = h->dg + t * h->sg;
    SUF(decay)(dk, h->g + t * h->sg, a);
    /* St = Diag(a) Sp (the decayed state), e = v - St^T k, u = beta e */
    memset(e, 0, (size_t)dv * sizeof(REAL));
    for (int64_t j = 0; j < dk; j++) {
        const REAL *Spj = Sp + j * dv;
        REAL *Stj = St + j * dv;
        for (int64_t c = 0; c < dv; c++) {
            Stj[c] = a[j] * Spj[c];
            e[c] += k[j] * Stj[c];
        }
    }
    for (int64_t c = 0; c < dv; c++) {
        e[c] = v[c] - e[c];
        u[c] = beta * e[c];
    }
    /* o = (St + k u^T)^T (s q): dS += s q dO^T; dq = s (St dO + k (u.dO)).
     * Write S = St + k u^T: dk = dS u, du = dS^T k. */
    REAL udo = SUF(dot)(u, dO, dv);
    memset(du, 0, (size_t)dv * sizeof(REAL));
    for (int64_t j = 0; j < dk; j++) {
        REAL *dSj = dS + j * dv;
        SUF(axpy)(s * q[j], dO, dSj, dv);
        dq[j] = s * (SUF(dot)(St + j * dv, dO, dv) + k[j] * udo);
        dk_[j] = SUF(dot)(dSj, u, dv);
        SUF(axpy)(k[j], dSj, du, dv);
    }
    /* u = beta (v - St^T k) */
    h->dbeta[t * h->sb] = SUF(dot)(e, du, dv);
    REAL *dv_ = h->dv + t * h->sv;
    for (int64_t c = 0; c < dv; c++) {
        de[c] = beta * du[c];
        dv_[c] = de[c];
    }
    /* dk -= St de; dSt = dS - k de^T; dg = rowsum(dSt ⊙ St); dSp = Diag(a) dSt */
    for (int64_t j = 0; j < dk; j++) {
        const REAL *Stj = St + j * dv;
        REAL *dSj = dS + j * dv;
        dk_[j] -= SUF(dot)(Stj, de, dv);
        SUF(axpy)(-k[j], de, dSj, dv);
        dg[j] = SUF(dot)(dSj, Stj, dv);
        for (int64_t c = 0; c < dv; c++)
            dSj[c] *= a[j];
    }
}

static void SUF(rec_bwd_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *w)
{
    int64_t dk = d->dk, dv = d->dv, ns = dk * dv, C = d->C, NT = kda_chunks(d->T, C);
    REAL *Sbuf = w, *St = Sbuf + C * KDA_ROUND(ns), *dS = St + KDA_ROUND(ns);
    REAL *a = dS + KDA_ROUND(ns), *e = a + KDA_ROUND(dk), *u = e + KDA_ROUND(dv);
    REAL *du = u + KDA_ROUND(dv), *de = du + KDA_ROUND(dv);
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
            SUF(decay)(dk, h->g + t * h->sg, a);
            SUF(rec_step)(dk, dv, next, a, h->k + t * h->sq, h->v + t * h->sv,
                          h->beta[t * h->sb], NULL, 0, NULL, e, u);
        }
        for (int64_t i = n - 1; i >= 0; i--)
            SUF(rec_bwd_token)(d, h, t0 + i, Sbuf + i * KDA_ROUND(ns), dS, St, a, e, u, du, de);
    }
    if (h->ds0)
        memcpy(h->ds0, dS, (size_t)ns * sizeof(REAL));
}
