/* Context parallelism (spec §6.1): the state map of a span of tokens is affine,
 * S_out = M S_in + B with M [dim_k, dim_k], B [dim_k, dim_v] per (sequence, value head), and
 * summaries compose, (M, B) of span a then span b = (M_b M_a, M_b B_a + B_b): a rank exchanges
 * dim_k (dim_k + dim_v) numbers per head whatever its span length.
 *
 * One chunked state pass gives both halves: run it on [M | B] ([dim_k, dim_k + dim_v]) from
 * [I | 0] with values [0 | v]. The M half sees no values (the linear part), the B half starts from zero
 * (the final state from S_in = 0). Outputs are not formed.
 *
 * Per head with cpu_chunked.inc.c's state pass, over every head through cpu_heads.inc.c
 * (kda_core_summary), over a layer's span after its projections, conv and gates
 * (cpu_layer.inc.c; kda_layer_summary), and the composition of two spans (kda_compose). */

static void SUF(summary_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *m, REAL *b,
                              REAL *w, SUF(kda_mm) *mm)
{
    SUF(chunk) c;
    SUF(chunk_carve)(d, w, &c);
    int64_t dim_k = d->dim_k, dim_v = d->dim_v, wd = dim_k + dim_v;
    memset(c.S, 0, (size_t)(dim_k * wd) * sizeof(REAL));
    for (int64_t j = 0; j < dim_k; j++)
        c.S[j * wd + j] = 1;
    for (int64_t t0 = 0; t0 < d->T; t0 += d->C) {
        SUF(chunk_prep)(d, h, t0, &c, mm);
        SUF(chunk_delta)(d, h, &c, c.S, wd, dim_k, c.X, NULL, mm);
        SUF(chunk_advance)(d, &c, c.S, wd, c.X, mm);
    }
    for (int64_t j = 0; j < dim_k; j++) {
        memcpy(m + j * dim_k, c.S + j * wd, (size_t)dim_k * sizeof(REAL));
        memcpy(b + j * dim_v, c.S + j * wd + dim_k, (size_t)dim_v * sizeof(REAL));
    }
}

static void SUF(summary_of_head)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item,
                                 REAL *w, SUF(kda_mm) *mm)
{
    const kda_dims *d = j->d;
    SUF(summary_head)(d, h, j->m + item * d->dim_k * d->dim_k,
                      j->b + item * d->dim_k * d->dim_v, w, mm);
}

int SUF(kda_core_summary)(k3rt_stream *s, const kda_dims *d, const REAL *q, const REAL *k,
                          const REAL *v, const REAL *g, const REAL *beta, REAL *m, REAL *b,
                          REAL *ws, int64_t ws_elems, k3rt_error *err)
{
    K3RT_TRY(SUF(core_check)(d, ws_elems, 0, err));
    SUF(core_job) j;
    memset(&j, 0, sizeof j);
    j.d = d, j.s = s, j.head = SUF(summary_of_head);
    j.q = q, j.k = k, j.v = v, j.g = g, j.beta = beta, j.m = m, j.b = b;
    return SUF(core_run)(&j, ws, ws_elems, 0, err);
}

int SUF(kda_layer_summary)(const kda *m, k3rt_stream *s, const kda_io *io, REAL *sm, REAL *sb,
                           k3rt_error *err)
{
    kda_layout l;
    kda_layout_make(m, io->B, io->T, m->slots, &l);
    REAL *ws = io->ws;
    K3RT_TRY(SUF(layer_prep)(m, s, io, &l, err));
    const int64_t HV = m->HV, Dk = m->H * m->dim_k, Dv = HV * m->dim_v, Dg = HV * m->dim_k;
    const int64_t nm = HV * m->dim_k * m->dim_k, nb = HV * m->dim_k * m->dim_v;
    /* With documents a row's map is its last document's; S_in reaches it only when that
     * document starts the row too (else M = 0). */
    for (int64_t i = 0, at = 0, n = SUF(core_seqs)(io); i < n; i++) {
        SUF(core_seq) q;
        SUF(core_seq_at)(m, io, i, &at, &q);
        if (!q.last)
            continue;
        int64_t t = q.t0;
        K3RT_TRY(SUF(kda_core_summary)(s, &q.d, KDA_SV(&l, l.qn) + t * Dk, KDA_SV(&l, l.kn) + t * Dk,
                                       KDA_SV(&l, l.v) + t * Dv, KDA_SV(&l, l.g) + t * Dg,
                                       KDA_SV(&l, l.beta) + t * HV, sm + q.row * nm, sb + q.row * nb,
                                       ws + l.core, l.core_n, err));
        if (!q.first)
            memset(sm + q.row * nm, 0, (size_t)nm * sizeof(REAL));
    }
    return K3RT_OK;
}

/* (m, b) = (m2 m1, m2 b1 + b2) over n heads. Outputs may alias inputs (a running fold). */
int SUF(kda_compose)(k3rt_stream *s, int64_t n, int64_t dim_k, int64_t dim_v, const REAL *m1,
                     const REAL *b1, const REAL *m2, const REAL *b2, REAL *m, REAL *b,
                     k3rt_error *err)
{
    size_t nm = (size_t)(n * dim_k * dim_k), nb = (size_t)(n * dim_k * dim_v);
    REAL *tm = malloc(nm * sizeof(REAL)), *tb = malloc(nb * sizeof(REAL));
    if (!tm || !tb) {
        free(tm);
        free(tb);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "kda: cp_compose: out of memory (%zu bytes)",
                         (nm + nb) * sizeof(REAL));
    }
    memcpy(tb, b2, nb * sizeof(REAL));
    int64_t kk = dim_k * dim_k, kv = dim_k * dim_v;
    int rc = k3rt_gemm_strided_batched(s, KDA_DTYPE, 0, 0, dim_k, dim_k, dim_k, 1.0, m2, dim_k,
                                       kk, m1, dim_k, kk, 0.0, tm, dim_k, kk, n, err);
    if (!rc)
        rc = k3rt_gemm_strided_batched(s, KDA_DTYPE, 0, 0, dim_k, dim_v, dim_k, 1.0, m2, dim_k,
                                       kk, b1, dim_v, kv, 1.0, tb, dim_v, kv, n, err);
    if (!rc) {
        memcpy(m, tm, nm * sizeof(REAL));
        memcpy(b, tb, nb * sizeof(REAL));
    }
    free(tm);
    free(tb);
    return rc;
}
