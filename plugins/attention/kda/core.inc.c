/* The recurrence over all (sequence, value head) pairs: argument checks, the split into
 * per-thread tasks (each with its own scratch slot), and the GVA sum of q/k gradients over the
 * value heads that share a qk head. Work per head: recurrent.inc.c, chunked.inc.c,
 * summary.inc.c. */

#ifndef KDA_MAX_TASKS
#define KDA_MAX_TASKS 256
#endif

enum { SUF(KDA_FWD), SUF(KDA_BWD), SUF(KDA_SUMMARY) };

typedef struct SUF(core_job) {
    const kda_dims *d;
    k3rt_stream *s;
    int algorithm, mode;
    const REAL *q, *k, *v, *g, *beta, *s0, *d_o, *ds_final;
    REAL *o, *states, *s_final, *dq, *dk, *dv, *dg, *dbeta, *ds0, *m, *b;
    int64_t sdq;           /* token stride of dq/dk: H*dk, or HV*dk into the GVA buffers */
    REAL *scratch;
    int64_t slot, P;       /* elements per slot, tasks */
    int rc[KDA_MAX_TASKS];
} SUF(core_job);

static SUF(kda_head) SUF(head_of)(const SUF(core_job) *j, int64_t item)
{
    const kda_dims *d = j->d;
    int64_t T = d->T, H = d->H, HV = d->HV, dk = d->dk, dv = d->dv, ns = dk * dv;
    int64_t b = item / HV, hv = item % HV, hq = hv / (HV / H);
    int64_t qo = (b * T * H + hq) * dk, vo = (b * T * HV + hv) * dv, go = (b * T * HV + hv) * dk;
    int64_t bo = b * T * HV + hv, dqo = j->sdq == H * dk ? qo : go;
    SUF(kda_head) h;
    memset(&h, 0, sizeof h);
    h.sq = H * dk, h.sv = HV * dv, h.sg = HV * dk, h.sb = HV, h.sdq = j->sdq;
    h.q = j->q + qo, h.k = j->k + qo, h.g = j->g + go, h.beta = j->beta + bo;
    h.v = j->v + vo;
    h.s0 = j->s0 ? j->s0 + item * ns : NULL;
    h.states = j->states ? j->states + item * kda_chunks(T, d->C) * ns : NULL;
    if (j->mode == SUF(KDA_FWD)) {
        h.o = j->o + vo;
        h.s_final = j->s_final ? j->s_final + item * ns : NULL;
    } else if (j->mode == SUF(KDA_BWD)) {
        h.d_o = j->d_o + vo;
        h.ds_final = j->ds_final ? j->ds_final + item * ns : NULL;
        h.dq = j->dq + dqo, h.dk = j->dk + dqo;
        h.dv = j->dv + vo, h.dg = j->dg + go, h.dbeta = j->dbeta + bo;
        h.ds0 = j->ds0 ? j->ds0 + item * ns : NULL;
    }
    return h;
}

/* Task p runs heads p, p + P, p + 2P, ... with scratch slot p. */
static void SUF(core_tasks)(void *ctx, int64_t begin, int64_t end)
{
    SUF(core_job) *j = ctx;
    const kda_dims *d = j->d;
    int64_t items = d->B * d->HV, ns = d->dk * d->dv;
    for (int64_t p = begin; p < end; p++) {
        SUF(kda_mm) mm = {j->s, 0};
        REAL *w = j->scratch + p * j->slot;
        for (int64_t it = p; it < items && !mm.rc; it += j->P) {
            SUF(kda_head) h = SUF(head_of)(j, it);
            if (j->mode == SUF(KDA_SUMMARY))
                SUF(summary_head)(d, &h, j->m + it * d->dk * d->dk, j->b + it * ns, w, &mm);
            else if (j->mode == SUF(KDA_FWD) && j->algorithm == KDA_RECURRENT)
                SUF(rec_fwd_head)(d, &h, w);
            else if (j->mode == SUF(KDA_FWD))
                SUF(chunked_fwd_head)(d, &h, w, &mm);
            else if (j->algorithm == KDA_RECURRENT)
                SUF(rec_bwd_head)(d, &h, w);
            else
                SUF(chunked_bwd_head)(d, &h, w, &mm);
        }
        j->rc[p] = mm.rc;
    }
}

static int64_t SUF(slot_elems)(const kda_dims *d)
{
    int64_t r = SUF(rec_scratch)(d), c = SUF(chunk_scratch)(d);
    return KDA_ROUND(r > c ? r : c);
}

static int64_t SUF(gva_elems)(const kda_dims *d)
{
    return d->HV > d->H ? KDA_ROUND(d->B * d->T * d->HV * d->dk) : 0;
}

int64_t SUF(kda_core_ws_elems)(const kda_dims *d, int slots)
{
    return (slots < 1 ? 1 : slots) * SUF(slot_elems)(d) + 2 * SUF(gva_elems)(d);
}

static int SUF(core_check)(const kda_dims *d, int64_t ws_elems, int64_t fixed, k3rt_error *err)
{
    if (d->B < 1 || d->T < 1 || d->H < 1 || d->HV < d->H || d->HV % d->H || d->dk < 1 ||
        d->dv < 1 || d->C < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "kda: bad recurrence shape B=%lld T=%lld H=%lld HV=%lld dk=%lld "
                         "dv=%lld chunk=%lld (all >= 1, HV a multiple of H)",
                         (long long)d->B, (long long)d->T, (long long)d->H, (long long)d->HV,
                         (long long)d->dk, (long long)d->dv, (long long)d->C);
    if (ws_elems < fixed + SUF(slot_elems)(d))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "kda: recurrence workspace of %lld elements is too small (needs at "
                         "least %lld)", (long long)ws_elems,
                         (long long)(fixed + SUF(slot_elems)(d)));
    return K3RT_OK;
}

static int SUF(core_run)(SUF(core_job) *j, REAL *ws, int64_t ws_elems, int64_t fixed,
                         k3rt_error *err)
{
    const kda_dims *d = j->d;
    int64_t items = d->B * d->HV, slots = (ws_elems - fixed) / SUF(slot_elems)(d);
    int64_t P = k3rt_stream_threads(j->s);
    P = KDA_MIN(KDA_MIN(P, items), KDA_MIN(slots, (int64_t)KDA_MAX_TASKS));
    j->scratch = ws + fixed;
    j->slot = SUF(slot_elems)(d);
    j->P = P < 1 ? 1 : P;
    memset(j->rc, 0, sizeof j->rc);
    k3rt_parallel_for(j->s, j->P, 1, SUF(core_tasks), j);
    for (int64_t p = 0; p < j->P; p++)
        if (j->rc[p])
            return k3rt_fail(err, j->rc[p], "kda: a matrix product of the recurrence failed "
                             "(%s)", k3rt_status_name(j->rc[p]));
    return K3RT_OK;
}

int SUF(kda_core_fwd)(k3rt_stream *s, int algorithm, const kda_dims *d, const REAL *q,
                      const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                      const REAL *s0, REAL *o, REAL *states, REAL *s_final, REAL *ws,
                      int64_t ws_elems, k3rt_error *err)
{
    K3RT_TRY(SUF(core_check)(d, ws_elems, 0, err));
    SUF(core_job) j;
    memset(&j, 0, sizeof j);
    j.d = d, j.s = s, j.algorithm = algorithm, j.mode = SUF(KDA_FWD);
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
    int64_t H = j->d->H, HV = j->d->HV, dk = j->d->dk, rep = HV / H;
    for (int64_t row = begin; row < end; row++) /* row = (b*T + t)*H + h */
        for (int64_t c = 0; c < dk; c++) {
            REAL acc = 0;
            for (int64_t r = 0; r < rep; r++)
                acc += j->src[(row * rep + r) * dk + c];
            j->dst[row * dk + c] = acc;
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
    j.d = d, j.s = s, j.algorithm = algorithm, j.mode = SUF(KDA_BWD);
    j.q = q, j.k = k, j.v = v, j.g = g, j.beta = beta, j.states = (REAL *)states;
    j.d_o = d_o, j.ds_final = ds_final;
    j.dq = gva ? ws : dq, j.dk = gva ? ws + gva : dk;
    j.sdq = gva ? d->HV * d->dk : d->H * d->dk;
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

int SUF(kda_core_summary)(k3rt_stream *s, const kda_dims *d, const REAL *q, const REAL *k,
                          const REAL *v, const REAL *g, const REAL *beta, REAL *m, REAL *b,
                          REAL *ws, int64_t ws_elems, k3rt_error *err)
{
    K3RT_TRY(SUF(core_check)(d, ws_elems, 0, err));
    SUF(core_job) j;
    memset(&j, 0, sizeof j);
    j.d = d, j.s = s, j.algorithm = KDA_CHUNKED, j.mode = SUF(KDA_SUMMARY);
    j.q = q, j.k = k, j.v = v, j.g = g, j.beta = beta, j.m = m, j.b = b;
    return SUF(core_run)(&j, ws, ws_elems, 0, err);
}
