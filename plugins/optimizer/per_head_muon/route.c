/* per_head_muon: which rule updates each parameter (from its declared role, never its name),
 * how a Muon parameter splits into blocks, the Newton-Schulz job list, and describe().
 *
 *   matrix [out, in]                      Muon over the whole matrix
 *   head_matrix [out, in], heads H        Muon per head: H blocks along head_axis
 *                                         (per_head = false: the whole matrix)
 *   expert_matrix [E, out, in]            Muon per expert (each expert is its own matrix)
 *   router, embedding, output_head        AdamW, decayed by adamw_weight_decay
 *   norm_gain, vector, conv               AdamW, never decayed
 * A parameter flagged K3RT_PARAM_NO_DECAY is never decayed, whatever its rule. */
#include "muon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static muon_view whole(int64_t rows, int64_t cols)
{
    return (muon_view){.count = 1, .rows = rows, .cols = cols, .ld = cols,
                       .stride = rows * cols};
}

/* One block per head: axis 0 splits the rows (contiguous blocks), axis 1 the columns. */
static muon_view per_head(int64_t rows, int64_t cols, int64_t heads, int axis)
{
    if (axis == 0)
        return (muon_view){.count = heads, .rows = rows / heads, .cols = cols, .ld = cols,
                           .stride = rows / heads * cols};
    return (muon_view){.count = heads, .rows = rows, .cols = cols / heads, .ld = cols,
                       .stride = cols / heads};
}

static int check_heads(const char *name, const k3rt_param_decl *d, const char *why,
                       k3rt_error *err)
{
    if (d->ndim != 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s (%s) has %d "
                         "dimensions; a head layout needs [out, in]", name, why, d->ndim);
    if (d->head_axis != 0 && d->head_axis != 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s (%s): head_axis "
                         "must be 0 (rows) or 1 (columns), got %d", name, why, d->head_axis);
    int64_t len = d->shape[d->head_axis];
    if (d->heads < 1 || len % d->heads)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s (%s): %d heads "
                         "do not divide its %s (%lld)", name, why, d->heads,
                         d->head_axis ? "columns" : "rows", (long long)len);
    return K3RT_OK;
}

/* The Muon view of a matrix role (and whether it is one). */
static int muon_view_of(const muon *o, const char *name, const k3rt_param_decl *d,
                        muon_view *v, k3rt_error *err)
{
    const char *role = k3rt_role_name(d->role);
    int want = d->role == K3RT_ROLE_EXPERT_MATRIX ? 3 : 2;
    if (d->ndim != want)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s (role %s) has %d "
                         "dimensions; Muon expects %s", name, role, d->ndim,
                         want == 3 ? "[experts, out, in]" : "[out, in]");
    for (int k = 0; k < want; k++)
        if (d->shape[k] < 1)
            return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s has an empty "
                             "dimension %d", name, k);
    switch (d->role) {
    case K3RT_ROLE_MATRIX:
        *v = whole(d->shape[0], d->shape[1]);
        return K3RT_OK;
    case K3RT_ROLE_HEAD_MATRIX:
        K3RT_TRY(check_heads(name, d, "head_matrix", err));
        *v = o->per_head ? per_head(d->shape[0], d->shape[1], d->heads, d->head_axis)
                         : whole(d->shape[0], d->shape[1]);
        return K3RT_OK;
    default: /* K3RT_ROLE_EXPERT_MATRIX */
        if (d->experts > 0 && d->experts != d->shape[0])
            return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s declares %d "
                             "experts but its shape starts with %lld", name, d->experts,
                             (long long)d->shape[0]);
        *v = whole(d->shape[1], d->shape[2]);
        v->count = d->shape[0];
        return K3RT_OK;
    }
}

int muon_route(muon *o, const k3rt_param_ref *ref, muon_param *p, k3rt_error *err)
{
    const k3rt_param_decl *d = ref->decl;
    const char *name = p->name;
    p->role = d->role;
    p->head_axis = d->head_axis;
    switch (d->role) {
    case K3RT_ROLE_MATRIX:
    case K3RT_ROLE_HEAD_MATRIX:
    case K3RT_ROLE_EXPERT_MATRIX:
        p->rule = MUON_RULE_MUON;
        p->decayed = 1;
        K3RT_TRY(muon_view_of(o, name, d, &p->view, err));
        break;
    case K3RT_ROLE_ROUTER:
    case K3RT_ROLE_EMBEDDING:
    case K3RT_ROLE_OUTPUT_HEAD:
        p->rule = MUON_RULE_ADAMW;
        p->decayed = 1;
        break;
    case K3RT_ROLE_NORM_GAIN:
    case K3RT_ROLE_VECTOR:
    case K3RT_ROLE_CONV:
        p->rule = MUON_RULE_ADAMW;
        p->decayed = 0;
        break;
    default:
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s has unknown role "
                         "%d", name, d->role);
    }
    if (d->flags & K3RT_PARAM_NO_DECAY)
        p->decayed = 0;
    if (d->qk_clip != K3RT_QK_NONE && d->qk_clip != K3RT_QK_SQRT && d->qk_clip != K3RT_QK_FULL)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s has unknown qk_clip "
                         "mode %d", name, d->qk_clip);
    if (d->qk_clip != K3RT_QK_NONE && o->qk_clip) {
        K3RT_TRY(check_heads(name, d, "qk_clip", err));
        p->qk_clip = d->qk_clip;
        p->heads = per_head(d->shape[0], d->shape[1], d->heads, d->head_axis);
    }
    return K3RT_OK;
}

/* FLOPs of `steps` Newton-Schulz steps (X X^T, S S, P X on the small side m of an m x n
 * block) plus the elementwise passes: the weight that deals blocks to threads. */
static double ns_cost(const muon_view *v, int steps)
{
    double m = (double)(v->rows < v->cols ? v->rows : v->cols);
    double n = (double)(v->rows < v->cols ? v->cols : v->rows);
    return steps * (4 * m * m * n + 2 * m * m * m) + 6 * m * n;
}

static int by_cost_desc(const void *x, const void *y)
{
    const muon_job *a = x, *b = y;
    if (a->cost != b->cost)
        return a->cost < b->cost ? 1 : -1;
    if (a->param != b->param)  /* a total order: the plan is the same on every rank */
        return a->param < b->param ? -1 : 1;
    return a->block < b->block ? -1 : (a->block > b->block);
}

int muon_plan_jobs(muon *o, k3rt_error *err)
{
    int64_t n = 0;
    for (int32_t i = 0; i < o->n; i++)
        if (o->p[i].rule == MUON_RULE_MUON)
            n += o->p[i].view.count;
    o->jobs = calloc((size_t)n + 1, sizeof *o->jobs);
    if (!o->jobs)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory for %lld blocks",
                         (long long)n);
    o->n_jobs = 0;
    o->slot_elems = 0;
    for (int32_t i = 0; i < o->n; i++) {
        const muon_view *v = &o->p[i].view;
        if (o->p[i].rule != MUON_RULE_MUON)
            continue;
        int64_t m = v->rows < v->cols ? v->rows : v->cols;
        int64_t need = 2 * v->rows * v->cols + 2 * m * m;
        if (need > o->slot_elems)
            o->slot_elems = need;
        for (int64_t b = 0; b < v->count; b++)
            o->jobs[o->n_jobs++] = (muon_job){.param = i, .block = b,
                                              .cost = ns_cost(v, o->ns_steps)};
    }
    qsort(o->jobs, (size_t)o->n_jobs, sizeof *o->jobs, by_cost_desc);
    return K3RT_OK;
}

int muon_describe(void *self, int32_t index, char *buf, size_t len)
{
    const muon *o = self;
    if (!buf || !len)
        return K3RT_ERR_INVALID;
    if (index < 0 || index >= o->n) {
        buf[0] = '\0';
        return K3RT_ERR_INVALID;
    }
    const muon_param *p = &o->p[index];
    const char *nodecay = p->decayed ? "" : " (no decay)";
    const char *clip = p->qk_clip == K3RT_QK_SQRT ? ", qk-clip sqrt"
                       : p->qk_clip == K3RT_QK_FULL ? ", qk-clip full" : "";
    long long count = (long long)p->view.count;
    if (p->rule == MUON_RULE_ADAMW)
        snprintf(buf, len, "adamw%s%s", nodecay, clip);
    else if (p->role == K3RT_ROLE_EXPERT_MATRIX)
        snprintf(buf, len, "muon per-expert x%lld%s%s", count, nodecay, clip);
    else if (count > 1)
        snprintf(buf, len, "muon per-head x%lld (axis %d)%s%s", count, p->head_axis, nodecay,
                 clip);
    else
        snprintf(buf, len, "muon%s%s", nodecay, clip);
    return K3RT_OK;
}
