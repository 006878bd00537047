/* The pieces of one MLA decode step on the CPU (mla.h's mla_dec_kernels; decode.c runs the
 * step), included by cpu.c after cpu.inc.c for each REAL: one query per head against the latent
 * cache, with the forward's own row reductions and exp, and the output gate. */

static int SUF(dec_attend)(const mla *m, k3rt_stream *s, int64_t B, int64_t L,
                           const mla_cache *c, const void *q_abs, const void *q_r, void *ctx,
                           k3rt_error *err)
{
    int64_t H = m->H, dc = m->dc, dr = m->dr, w = dc + dr;
    for (int64_t b = 0; b < B; b++) {
        const REAL *kv = (const REAL *)c->kv + b * c->cap * w;
        REAL *S = (REAL *)c->scores + b * H * c->cap, *out = (REAL *)ctx + b * H * dc;
        /* S [H, L] = scale (q_abs ĉ^T + q_r kr^T) */
        K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 1, H, L, dc, m->scale, (const REAL *)q_abs + b * H * dc,
                           dc, kv, w, 0.0, S, c->cap, err));
        if (dr)
            K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 1, H, L, dr, m->scale,
                               (const REAL *)q_r + b * H * dr, dr, kv + dc, w, 1.0, S, c->cap,
                               err));
        for (int64_t h = 0; h < H; h++) {
            REAL *sh = S + h * c->cap, mx = SUF(row_max)(sh, L);
            for (int64_t j = 0; j < L; j++)
                sh[j] = EXP(sh[j] - mx);
            REAL inv = (REAL)1 / SUF(row_sum)(sh, L);
            for (int64_t j = 0; j < L; j++)
                sh[j] *= inv;
        }
        /* ctx [H, dc] = P ĉ */
        K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 0, H, dc, L, 1.0, S, c->cap, kv, w, 0.0, out, dc, err));
    }
    return K3RT_OK;
}

static int SUF(dec_gate)(const mla *m, k3rt_stream *s, int64_t n, const void *o, const void *z,
                         void *og, k3rt_error *err)
{
    (void)m, (void)s, (void)err;
    const REAL *ov = o, *zv = z;
    REAL *g = og;
    for (int64_t i = 0; i < n; i++)
        g[i] = ov[i] * SUF(sigmoid)(zv[i]);
    return K3RT_OK;
}

const mla_dec_kernels SUF(mla_dec_cpu) = {SUF(dec_attend), SUF(dec_gate)};
