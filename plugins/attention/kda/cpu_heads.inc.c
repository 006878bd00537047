/* Running one function per (sequence, value head) over every head of a call of the
 * recurrence: the job that describes the call, each head's view of it (kda_head), the split
 * into per-thread tasks, each with its own scratch slot (large enough for either form of
 * cpu_recurrent.inc.c and cpu_chunked.inc.c), and the shape and workspace checks. What runs
 * per head is the job's `head`: cpu_core.inc.c's forward and backward, cpu_summary.inc.c's
 * summary. */

#ifndef KDA_MAX_TASKS
#define KDA_MAX_TASKS 256
#endif

typedef struct SUF(core_job) SUF(core_job);
struct SUF(core_job) {
    const kda_dims *d;
    k3rt_stream *s;
    /* the work of one head; item = b * HV + value head; w: the task's scratch slot */
    void (*head)(const SUF(core_job) *j, const SUF(kda_head) *h, int64_t item, REAL *w,
                 SUF(kda_mm) *mm);
    const REAL *q, *k, *v, *g, *beta, *s0, *d_o, *ds_final;
    REAL *o, *states, *s_final, *dq, *dk, *dv, *dg, *dbeta, *ds0, *m, *b;
    int64_t sdq;           /* token stride of dq/dk: H*dim_k, or HV*dim_k into the GVA buffers */
    REAL *scratch;
    int64_t slot, P;       /* elements per slot, tasks */
    int rc[KDA_MAX_TASKS];
};

/* Head `item`'s pointers into the job's tensors: the forward's outputs when o is set, the
 * backward's inputs and gradients when d_o is. */
static SUF(kda_head) SUF(head_of)(const SUF(core_job) *j, int64_t item)
{
    const kda_dims *d = j->d;
    int64_t T = d->T, H = d->H, HV = d->HV, dim_k = d->dim_k, dim_v = d->dim_v, ns = dim_k * dim_v;
    int64_t b = item / HV, hv = item % HV, hq = hv / (HV / H);
    int64_t qo = (b * T * H + hq) * dim_k, vo = (b * T * HV + hv) * dim_v,
        go = (b * T * HV + hv) * dim_k;
    int64_t bo = b * T * HV + hv, dqo = j->sdq == H * dim_k ? qo : go;
    SUF(kda_head) h;
    memset(&h, 0, sizeof h);
    h.sq = H * dim_k, h.sv = HV * dim_v, h.sg = HV * dim_k, h.sb = HV, h.sdq = j->sdq;
    h.q = j->q + qo, h.k = j->k + qo, h.g = j->g + go, h.beta = j->beta + bo;
    h.v = j->v + vo;
    h.s0 = j->s0 ? j->s0 + item * ns : NULL;
    h.states = j->states ? j->states + item * kda_chunks(T, d->C) * ns : NULL;
    if (j->o) { /* a forward */
        h.o = j->o + vo;
        h.s_final = j->s_final ? j->s_final + item * ns : NULL;
    }
    if (j->d_o) { /* a backward */
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
    int64_t items = j->d->B * j->d->HV;
    for (int64_t p = begin; p < end; p++) {
        SUF(kda_mm) mm = {j->s, 0};
        REAL *w = j->scratch + p * j->slot;
        for (int64_t it = p; it < items && !mm.rc; it += j->P) {
            SUF(kda_head) h = SUF(head_of)(j, it);
            j->head(j, &h, it, w, &mm);
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
    return d->HV > d->H ? KDA_ROUND(d->B * d->T * d->HV * d->dim_k) : 0;
}

int64_t SUF(kda_core_ws_elems)(const kda_dims *d, int slots)
{
    return (slots < 1 ? 1 : slots) * SUF(slot_elems)(d) + 2 * SUF(gva_elems)(d);
}

static int SUF(core_check)(const kda_dims *d, int64_t ws_elems, int64_t fixed, k3rt_error *err)
{
    if (d->B < 1 || d->T < 1 || d->H < 1 || d->HV < d->H || d->HV % d->H || d->dim_k < 1 ||
        d->dim_v < 1 || d->C < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "kda: bad recurrence shape B=%lld T=%lld H=%lld HV=%lld dk=%lld "
                         "dv=%lld chunk=%lld (all >= 1, HV a multiple of H)",
                         (long long)d->B, (long long)d->T, (long long)d->H, (long long)d->HV,
                         (long long)d->dim_k, (long long)d->dim_v, (long long)d->C);
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
