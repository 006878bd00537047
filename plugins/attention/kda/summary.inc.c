/* Context parallelism (spec §6.1): the state map of a span of tokens is affine,
 * S_out = M S_in + B with M [dk, dk], B [dk, dv] per (sequence, value head), and summaries
 * compose, (M, B) of span a then span b = (M_b M_a, M_b B_a + B_b): a rank exchanges
 * dk*(dk+dv) numbers per head whatever its span length.
 *
 * One chunked state pass gives both halves: run it on [M | B] ([dk, dk+dv]) from [I | 0] with
 * values [0 | v]. The M half sees no values (the linear part), the B half starts from zero
 * (the final state from S_in = 0). Outputs are not formed. */

static void SUF(summary_head)(const kda_dims *d, const SUF(kda_head) *h, REAL *m, REAL *b,
                              REAL *w, SUF(kda_mm) *mm)
{
    SUF(chunk) c;
    SUF(chunk_carve)(d, w, &c);
    int64_t dk = d->dk, dv = d->dv, wd = dk + dv;
    memset(c.S, 0, (size_t)(dk * wd) * sizeof(REAL));
    for (int64_t j = 0; j < dk; j++)
        c.S[j * wd + j] = 1;
    for (int64_t t0 = 0; t0 < d->T; t0 += d->C) {
        SUF(chunk_prep)(d, h, t0, &c, mm);
        SUF(chunk_delta)(d, h, &c, c.S, wd, dk, c.X, NULL, mm);
        SUF(chunk_advance)(d, &c, c.S, wd, c.X, mm);
    }
    for (int64_t j = 0; j < dk; j++) {
        memcpy(m + j * dk, c.S + j * wd, (size_t)dk * sizeof(REAL));
        memcpy(b + j * dv, c.S + j * wd + dk, (size_t)dv * sizeof(REAL));
    }
}

/* (m, b) = (m2 m1, m2 b1 + b2) over n heads. Outputs may alias inputs (a running fold). */
int SUF(kda_compose)(k3rt_stream *s, int64_t n, int64_t dk, int64_t dv, const REAL *m1,
                     const REAL *b1, const REAL *m2, const REAL *b2, REAL *m, REAL *b,
                     k3rt_error *err)
{
    size_t nm = (size_t)(n * dk * dk), nb = (size_t)(n * dk * dv);
    REAL *tm = malloc(nm * sizeof(REAL)), *tb = malloc(nb * sizeof(REAL));
    if (!tm || !tb) {
        free(tm);
        free(tb);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "kda: cp_compose: out of memory (%zu bytes)",
                         (nm + nb) * sizeof(REAL));
    }
    memcpy(tb, b2, nb * sizeof(REAL));
    int rc = k3rt_gemm_strided_batched(s, KDA_DTYPE, 0, 0, dk, dk, dk, 1.0, m2, dk, dk * dk, m1,
                                       dk, dk * dk, 0.0, tm, dk, dk * dk, n, err);
    if (!rc)
        rc = k3rt_gemm_strided_batched(s, KDA_DTYPE, 0, 0, dk, dv, dk, 1.0, m2, dk, dk * dk, b1,
                                       dv, dk * dv, 1.0, tb, dv, dk * dv, n, err);
    if (!rc) {
        memcpy(m, tm, nm * sizeof(REAL));
        memcpy(b, tb, nb * sizeof(REAL));
    }
    free(tm);
    free(tb);
    return rc;
}
