/* per_head_muon: one optimizer step.
 *
 *   1. Muon group: every block (a whole matrix, one head's rows/columns, one expert) is an
 *      independent Newton-Schulz problem (block.inc.c). Blocks are dealt to the stream's CPU
 *      threads largest first onto the least-loaded thread; a block costing more than a
 *      thread's fair share runs alone first, with BLAS using every thread.
 *   2. AdamW group: the core op k3rt_adamw_step_multi over all its parameters at once, with
 *      the engine's step number for the bias correction.
 *   3. QK-clip, after the update (Kimi K2): for a parameter whose owner declared qk_clip and
 *      a head h whose max pre-softmax logit S_h (reported by the owner for the forward of
 *      this step, reduced with MAX across ranks) exceeds tau, gamma = tau / S_h and the head's
 *      block is scaled by sqrt(gamma) (K3RT_QK_SQRT: query and key sides, so the logit scales
 *      by gamma) or by gamma (K3RT_QK_FULL: the query side of a key shared by all heads).
 * On CUDA the same three run on the device (cuda.c). */
#include "muon.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* QK-clip needs every clipped parameter's max logits (the host checked their shape). */
static int check_max_logits(const muon_param *p, const k3rt_param_ref *ref, k3rt_error *err)
{
    if (!p->qk_clip)
        return K3RT_OK;
    if (!k3rt_tensor_present(&ref->head_max_logit))
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s: QK-clip is on "
                         "(qk_clip) but its owner reported no max logits (stats \"max_logit\"); "
                         "turn the owner's reporting on (mla: report_max_logit = true) or set "
                         "qk_clip = false", p->name);
    const float *s = ref->head_max_logit.data;
    for (int64_t h = 0; h < p->heads.count; h++)
        if (isnan(s[h]) || s[h] == INFINITY)  /* -inf: the owner saw no tokens */
            return k3rt_fail(err, K3RT_ERR_NUMERIC, "per_head_muon: parameter %s: head %lld "
                             "reports max logit %g; QK-clip needs a finite value", p->name,
                             (long long)h, (double)s[h]);
    return K3RT_OK;
}

/* ---- the Muon group --------------------------------------------------------------------- */

typedef struct run_ctx {
    muon *o;
    const k3rt_optimizer_step *a;
    double lr;
    atomic_int failed;
    k3rt_error err;
} run_ctx;

static int run_job(run_ctx *c, const muon_job *j, int slot, k3rt_error *err)
{
    muon *o = c->o;
    const k3rt_param_ref *ref = &c->a->params[j->param];
    muon_block_args b = {.o = o, .p = &o->p[j->param], .param = ref->param.data,
                         .grad = ref->grad.data, .block = j->block, .lr = c->lr};
    size_t es = k3rt_dtype_size(o->dtype);
    void *scratch = (char *)o->scratch + (size_t)slot * (size_t)o->slot_elems * es;
    int rc = o->dtype == K3RT_F32 ? muon_block_f32(c->a->stream, &b, scratch, err)
                                  : muon_block_f64(c->a->stream, &b, scratch, err);
    return rc ? k3rt_error_prefix(err, "per_head_muon: parameter %s block %lld: ",
                                  b.p->name, (long long)j->block)
              : K3RT_OK;
}

static void run_slots(void *ctx, int64_t begin, int64_t end)
{
    run_ctx *c = ctx;
    k3rt_error e;
    for (int64_t slot = begin; slot < end; slot++)
        for (int64_t i = 0; i < c->o->n_jobs && !atomic_load(&c->failed); i++)
            if (c->o->jobs[i].owner == slot && run_job(c, &c->o->jobs[i], (int)slot, &e) &&
                atomic_exchange(&c->failed, 1) == 0)
                c->err = e;
}

/* Longest job first onto the least-loaded slot; a job above the fair share runs alone. */
static int plan_owners(muon *o, int slots, k3rt_error *err)
{
    double *load = calloc((size_t)slots, sizeof *load), total = 0;
    if (!load)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    for (int64_t i = 0; i < o->n_jobs; i++)
        total += o->jobs[i].cost;
    for (int64_t i = 0; i < o->n_jobs; i++) {
        muon_job *j = &o->jobs[i];
        if (slots > 1 && j->cost > total / slots) {
            j->owner = -1;
            continue;
        }
        int best = 0;
        for (int s = 1; s < slots; s++)
            if (load[s] < load[best])
                best = s;
        j->owner = best;
        load[best] += j->cost;
    }
    free(load);
    o->planned_slots = slots;
    return K3RT_OK;
}

static int ensure_scratch(muon *o, int slots, k3rt_error *err)
{
    if (slots <= o->scratch_slots)
        return K3RT_OK;
    size_t bytes = (size_t)slots * (size_t)o->slot_elems * k3rt_dtype_size(o->dtype);
    void *s = realloc(o->scratch, bytes ? bytes : 1);
    if (!s)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory for %d x %lld "
                         "elements of Newton-Schulz scratch", slots, (long long)o->slot_elems);
    o->scratch = s;
    o->scratch_slots = slots;
    return K3RT_OK;
}

static int muon_group(muon *o, const k3rt_optimizer_step *a, k3rt_error *err)
{
    if (o->n_jobs == 0)
        return K3RT_OK;
    int slots = k3rt_stream_threads(a->stream);
    if (slots < 1)
        slots = 1;
    if (slots > o->n_jobs)
        slots = (int)o->n_jobs;
    K3RT_TRY(ensure_scratch(o, slots, err));
    if (o->planned_slots != slots)
        K3RT_TRY(plan_owners(o, slots, err));
    run_ctx c = {.o = o, .a = a, .lr = a->lr};
    atomic_init(&c.failed, 0);
    for (int64_t i = 0; i < o->n_jobs; i++)
        if (o->jobs[i].owner < 0)
            K3RT_TRY(run_job(&c, &o->jobs[i], 0, err));
    k3rt_parallel_for(a->stream, slots, 1, run_slots, &c);
    if (atomic_load(&c.failed)) {
        *err = c.err;
        return err->code;
    }
    return K3RT_OK;
}

/* ---- AdamW group and QK-clip ------------------------------------------------------------- */

int muon_adamw_plan(muon *o, k3rt_error *err)
{
    size_t k = (size_t)o->n + 1;
    o->adamw_index = calloc(k, sizeof *o->adamw_index);
    o->aw_w = calloc(k, sizeof *o->aw_w);
    o->aw_g = calloc(k, sizeof *o->aw_g);
    o->aw_m = calloc(k, sizeof *o->aw_m);
    o->aw_v = calloc(k, sizeof *o->aw_v);
    o->aw_n = calloc(k, sizeof *o->aw_n);
    o->aw_wd = calloc(k, sizeof *o->aw_wd);
    if (!o->adamw_index || !o->aw_w || !o->aw_g || !o->aw_m || !o->aw_v || !o->aw_n ||
        !o->aw_wd)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    o->n_adamw = 0;
    for (int32_t i = 0; i < o->n; i++) {
        const muon_param *p = &o->p[i];
        if (p->rule != MUON_RULE_ADAMW)
            continue;
        int32_t j = o->n_adamw++;
        o->adamw_index[j] = i;
        o->aw_m[j] = p->state;
        o->aw_v[j] = p->v;
        o->aw_n[j] = p->n;
        o->aw_wd[j] = p->decayed ? o->adamw_weight_decay : 0.0;
    }
    return K3RT_OK;
}

/* Every AdamW parameter in one k3rt_adamw_step_multi: one fused launch on CUDA, the per-tensor
 * op on the CPU. */
int muon_adamw_group(muon *o, const k3rt_optimizer_step *a, k3rt_error *err)
{
    if (!o->n_adamw)
        return K3RT_OK;
    for (int32_t j = 0; j < o->n_adamw; j++) {
        o->aw_w[j] = a->params[o->adamw_index[j]].param.data;
        o->aw_g[j] = a->params[o->adamw_index[j]].grad.data;
    }
    if (k3rt_adamw_step_multi(a->stream, o->dtype, o->n_adamw, o->aw_w, o->aw_g, o->aw_m,
                              o->aw_v, o->aw_n, o->aw_wd, a->lr, o->beta1, o->beta2, o->eps,
                              a->step, err))
        return k3rt_error_prefix(err, "per_head_muon: AdamW group: ");
    return K3RT_OK;
}

static void qk_clip(const muon *o, const k3rt_optimizer_step *a)
{
    for (int32_t i = 0; i < o->n; i++) {
        const muon_param *p = &o->p[i];
        const k3rt_tensor *t = &a->params[i].head_max_logit;
        if (!p->qk_clip)
            continue;
        const float *s = t->data;
        for (int64_t h = 0; h < p->heads.count; h++) {
            if (!(s[h] > o->qk_tau))
                continue;
            double gamma = o->qk_tau / (double)s[h];
            double f = p->qk_clip == K3RT_QK_SQRT ? sqrt(gamma) : gamma;
            if (o->dtype == K3RT_F32)
                muon_scale_block_f32(a->params[i].param.data, &p->heads, h, f);
            else
                muon_scale_block_f64(a->params[i].param.data, &p->heads, h, f);
        }
    }
}

int muon_cpu_step(muon *o, const k3rt_optimizer_step *a, k3rt_error *err)
{
    if (o->qk_clip)
        for (int32_t i = 0; i < o->n; i++)
            K3RT_TRY(check_max_logits(&o->p[i], &a->params[i], err));
    K3RT_TRY(muon_group(o, a, err));
    K3RT_TRY(muon_adamw_group(o, a, err));
    if (o->qk_clip)
        qk_clip(o, a);
    return K3RT_OK;
}
