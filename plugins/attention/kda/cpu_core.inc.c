/* The recurrence (kda.h's kda_core_*): the forward and the backward of every head in the
 * form the layer asks for, recurrent (cpu_recurrent.inc.c) or chunked (cpu_chunked.inc.c),
 * through cpu_heads.inc.c's runner, and the GVA sum of the q/k gradients over the value heads
 * that share a qk head. */

static void SUF(recurrent_fwd)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item,
                               REAL *w, SUF(kda_mm) *mm)
{
    (void)item, (void)mm;
    SUF(rec_fwd_head)(j->d, h, w);
}

static void SUF(chunked_fwd)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item,
                             REAL *w, SUF(kda_mm) *mm)
{
    (void)item;
    SUF(chunked_fwd_head)(j->d, h, w, mm);
}

static void SUF(recurrent_bwd)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item,
                               REAL *w, SUF(kda_mm) *mm)
{
    (void)item, (void)mm;
    SUF(rec_bwd_head)(j->d, h, w);
}

static void SUF(chunked_bwd)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item,
                             REAL *w, SUF(kda_mm) *mm)
{
    (void)item;
    SUF(chunked_bwd_head)(j->d, h, w, mm);
}

int SUF(kda_core_fwd)(k3rt_stream *s, int algorithm, const kda_dims *d, const REAL *q,
                      const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                      const REAL *s0, REAL *o, REAL *states, REAL *s_final, REAL *ws,
                      int64_t ws_elems, k3rt_error *err)
{
    K3RT_TRY(SUF(core_check)(d, ws_elems, 0, err));
    SUF(core_job) j;
    memset(&j, 0, sizeof j);
    j.d = d, j.s = s;
    j.head = algorithm == KDA_RECURRENT ? SUF(recurrent_fwd) : SUF(chunked_fwd);
    j.q = q, j.k = k, j.v = v, j.g = g, j.beta = beta, j.s0 = s0;
    j.o = o, j.states = states, j.s_final = s_final;
    return SUF(core_run)(&j, ws, ws_elems, 0, err);
}

/* dq[b, t, h] = sum of the per-value-head gradients of the value heads reading qk head h. */
typedef struct SUF(gva_job) {
    const kda_dims *d;
    const REAL *src;
    REAL *dst;
} SUF(gva_job);

static void SUF(gva_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(gva_job) *j = ctx;
    int64_t H = j->d->H, HV = j->d->HV, dim_k = j->d->dim_k, rep = HV / H;
    for (int64_t row = begin; row < end; row++) /* row = (b*T + t)*H + h */
        for (int64_t c = 0; c < dim_k; c++) {
            REAL acc = 0;
            for (int64_t r = 0; r < rep; r++)
                acc += j->src[(row * rep + r) * dim_k + c];
            j->dst[row * dim_k + c] = acc;
        }
}

int SUF(kda_core_bwd)(k3rt_stream *s, int algorithm, const kda_dims *d, const REAL *q,
                      const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                      const REAL *states, const REAL *d_o, const REAL *ds_final, REAL *dq,
                      REAL *dk, REAL *dv, REAL *dg, REAL *dbeta, REAL *ds0, REAL *ws,
                      int64_t ws_elems, k3rt_error *err)
{
    int64_t gva = SUF(gva_elems)(d);
    K3RT_TRY(SUF(core_check)(d, ws_elems, 2 * gva, err));
    SUF(core_job) j;
    memset(&j, 0, sizeof j);
    j.d = d, j.s = s;
    j.head = algorithm == KDA_RECURRENT ? SUF(recurrent_bwd) : SUF(chunked_bwd);
    j.q = q, j.k = k, j.v = v, j.g = g, j.beta = beta, j.states = (REAL *)states;
    j.d_o = d_o, j.ds_final = ds_final;
    j.dq = gva ? ws : dq, j.dk = gva ? ws + gva : dk;
    j.sdq = gva ? d->HV * d->dim_k : d->H * d->dim_k;
    j.dv = dv, j.dg = dg, j.dbeta = dbeta, j.ds0 = ds0;
    K3RT_TRY(SUF(core_run)(&j, ws, ws_elems, 2 * gva, err));
    if (gva) {
        int64_t rows = d->B * d->T * d->H;
        SUF(gva_job) a = {d, ws, dq}, b = {d, ws + gva, dk};
        SUF(par)(s, rows, SUF(gva_rows), &a);
        SUF(par)(s, rows, SUF(gva_rows), &b);
    }
    return K3RT_OK;
}
