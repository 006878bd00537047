/* Activation policies for `k3rt plan` (plan_policy.h). */
#include "plan/plan_policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
#include "plan/plan.h"
#include "plan/plan_act.h"

static double budget_bytes(const json_t *plan, double gpu_mem)
{
    const json_t *v = json_object_get(plan, "memory_budget");
    double bytes, fraction;
    if (json_is_number(v))
        return json_number_value(v);
    if (json_is_string(v) && !act_budget_parse(json_string_value(v), &bytes, &fraction))
        return fraction > 0 ? fraction * gpu_mem : bytes;
    return gpu_mem;
}

/* Step time and MFU under the stated assumptions: one micro-batch's compute on the largest
 * stage at PLAN_MFU of the peak plus the planner's extra time, times the micro-batches, over
 * (1 - bubble); half of the expert all-to-all exposed (the rest overlapped), off-node at
 * PLAN_NET_BW, on-node at PLAN_NVLINK_BW; data-parallel and pipeline traffic overlapped. */
static void predict_step(plan_report *r, double extra_s, double rate, double stage_tokens)
{
    double mb = (r->fwd_token + r->bwd_token) * stage_tokens / rate + extra_s;
    double moe = (double)r->moe_layers * r->stage_layers / r->n_layers;
    double a2a = 2 * r->a2a_bytes * moe;  /* forward and backward */
    double a2a_s = a2a * (r->a2a_off_node / PLAN_NET_BW +
                          (r->a2a_off_rank - r->a2a_off_node) / PLAN_NVLINK_BW);
    r->step_compute_s = (double)r->grad_accum * mb;
    r->step_s = r->step_compute_s / (1 - r->bubble) + 0.5 * (double)r->grad_accum * a2a_s;
    r->mfu = r->flops_per_step / r->gpus / (r->step_s * PLAN_PEAK_FLOPS);
}

/* Classes of one module type share "<slot>.<tag>." (act_policy.h). */
static int same_module(const char *a, const char *b)
{
    const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
    return da - a == db - b && !strncmp(a, b, (size_t)(da - a));
}

/* Bytes of one instance of class i's module (every class of its type). */
static double module_bytes(const act_cost *c, int n, int i)
{
    double sum = 0;
    for (int j = 0; j < n; j++)
        if (same_module(c[i].name, c[j].name))
            sum += c[j].bytes;
    return sum;
}

/* The runtime recomputes a module whole (actman.h): where the planner chose recompute for one
 * class of a module type, every class of that type is recomputed (memory only falls) and the
 * module's forward is charged once per instance, not once per class. */
static void whole_module_recompute(act_plan *p, const double *forward_s)
{
    for (int i = 0; i < p->n; i++) {
        if (p->cls[i].policy != ACT_RECOMPUTE)
            continue;
        for (int j = 0; j < p->n; j++)
            if (same_module(p->cls[i].name, p->cls[j].name) && p->cls[j].policy != ACT_RECOMPUTE) {
                p->peak -= p->cls[j].mem;
                p->extra_s -= p->cls[j].time;
                p->pcie_s -= p->cls[j].pcie;
                p->cls[j].policy = ACT_RECOMPUTE;
                p->cls[j].mem = p->cls[j].pcie = 0;
            }
    }
    for (int i = 0; i < p->n; i++) {
        if (p->cls[i].policy != ACT_RECOMPUTE)
            continue;
        int first = 1;
        for (int j = 0; j < i; j++)
            first &= !same_module(p->cls[i].name, p->cls[j].name);
        double t = first ? forward_s[i] * p->cls[i].instances : 0;
        p->extra_s += t - p->cls[i].time;
        p->cls[i].time = t;
    }
}

/* The window the runtime needs for the chosen policies (actman.h): the largest recomputed
 * module's parts (the scratch) and three staging slots of the largest module's moved parts. */
static double needed_window(const act_plan *p)
{
    double scratch = 0, slot = 0;
    for (int i = 0; i < p->n; i++) {
        double moved = 0;
        int rec = 0;
        for (int j = 0; j < p->n; j++) {
            if (!same_module(p->cls[i].name, p->cls[j].name))
                continue;
            rec |= p->cls[j].policy == ACT_RECOMPUTE;
            if (p->cls[j].policy == ACT_OFFLOAD || p->cls[j].policy == ACT_FP8)
                moved += p->cls[j].bytes;
        }
        if (rec)
            scratch = fmax(scratch, module_bytes(p->cls, p->n, i));
        slot = fmax(slot, moved);
    }
    return scratch + 3 * slot;
}

/* The window depends on the choice, the knapsack takes it as given: solve for candidate
 * windows — a scratch S of 0 or one module type's bytes, staging M of 0 or three of one
 * class's bytes, with recompute refused to modules larger than S and moves to classes larger
 * than M / 3 — keep plans whose real window is within what they assumed, and take the
 * fastest. The first candidate, four of the largest module, holds any plan. p->cls receives
 * the winner; returns 1 when one fits, 0 when none does (p->min_budget the least), -1 out
 * of memory. */
static int best_plan(act_plan *p, double largest, const double *forward_s)
{
    int n = p->n, found = 0;
    double *S = malloc((size_t)(n + 1) * sizeof *S), *M = malloc((size_t)(n + 1) * sizeof *M);
    act_cost *trial = malloc((size_t)n * sizeof *trial), *best = malloc((size_t)n * sizeof *best);
    if (!S || !M || !trial || !best) {
        free(S), free(M), free(trial), free(best);
        return -1;
    }
    int nS = 0, nM = 0;
    S[nS++] = 0;
    M[nM++] = 0;
    for (int i = 0; i < n; i++) {
        double s = module_bytes(p->cls, n, i), mv = 3 * p->cls[i].bytes;
        int dup = 0;
        for (int k = 0; k < nS; k++)
            dup |= S[k] == s;
        if (!dup)
            S[nS++] = s;
        dup = 0;
        for (int k = 0; k < nM; k++)
            dup |= M[k] == mv;
        if (!dup)
            M[nM++] = mv;
    }
    act_plan winner = *p;
    double least = INFINITY;
    k3rt_error e;
    for (int si = -1; si < nS; si++)
        for (int mi = si < 0 ? nM - 1 : 0; mi < nM; mi++) {
            act_plan q = *p;
            memcpy(trial, p->cls, (size_t)n * sizeof *trial);
            q.cls = trial;
            q.window = si < 0 ? 4 * largest : S[si] + M[mi];
            for (int i = 0; si >= 0 && i < n; i++) {
                trial[i].no_recompute |= module_bytes(trial, n, i) > S[si];
                trial[i].no_move |= 3 * trial[i].bytes > M[mi];
            }
            memset(&e, 0, sizeof e);
            int ok = act_plan_solve(&q, &e) == K3RT_OK;
            least = fmin(least, q.min_budget);
            if (!ok)
                continue;
            whole_module_recompute(&q, forward_s);
            double need = needed_window(&q), moved = 0;
            for (int i = 0; i < n; i++)
                moved += trial[i].policy != ACT_KEEP;
            q.peak += (moved ? need : 0) - (moved ? q.window : 0);
            if (need > q.window + 1 || q.peak > q.budget || (found && q.extra_s >= winner.extra_s))
                continue;
            found = 1;
            winner = q;
            memcpy(best, trial, (size_t)n * sizeof *best);
        }
    if (found) {
        memcpy(p->cls, best, (size_t)n * sizeof *best);
        winner.cls = p->cls;
        *p = winner;
    }
    p->min_budget = least;
    free(S), free(M), free(trial), free(best);
    return found;
}

int plan_policies(model *m, const json_t *plan, plan_report *r, k3rt_error *err)
{
    actman am;
    int64_t T = r->seq_len / r->cp;
    K3RT_TRY(actman_plan(m, r->micro_batch, T, json_object_get(plan, "activations"), &am,
                         err));
    /* the classes, and one more: the engine's sublayer inputs (plan only, see below) */
    int n = am.n_cls < PLAN_MAX_ACT_CLASSES - 1 ? am.n_cls : PLAN_MAX_ACT_CLASSES - 1;
    act_cost *c = calloc((size_t)n + 1, sizeof *c);
    double *forward_s = calloc((size_t)n + 1, sizeof *forward_s);
    if (!c || !forward_s) {
        free(c);
        free(forward_s);
        actman_free(&am);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "plan: out of memory");
    }
    double rate = PLAN_PEAK_FLOPS * PLAN_MFU, largest = 0;
    double stage = (double)r->stage_layers / m->n_layers;
    double tokens = (double)r->micro_batch * (double)T;
    r->act_kept_bytes = 0;
    for (int i = 0; i < n; i++) {
        const act_class *k = &am.cls[i];
        snprintf(c[i].name, sizeof c[i].name, "%s", k->name);
        c[i].bytes = 0.5 * (double)k->bytes;  /* the CPU plugins count f32; bf16 on the GPU */
        c[i].elem_bytes = 2;
        /* the largest stage's share of the layers, each of its micro-batches in flight */
        c[i].instances = (int)ceil(k->instances * stage - 1e-9) * r->in_flight;
        c[i].fp8_ok = k->fp8_ok && !r->act_no_fp8;
        forward_s[i] = k->recompute_flops / rate;  /* the module's forward */
        c[i].overlap_s = 3 * forward_s[i];          /* its forward and backward */
        c[i].fixed = k->fixed ? k->policy : -1;
        /* as plan_memory scaled the arena: the stage's share, times the micro-batches */
        r->act_kept_bytes += c[i].bytes * k->instances * stage * r->in_flight;
    }
    /* The engine keeps every sublayer's input (bf16 [N, d], two per layer) for its backward;
     * the planner may offload them, which the runtime does not do yet (the report says so). */
    snprintf(c[n].name, sizeof c[n].name, "%s", PLAN_SUBLAYER_INPUTS);
    c[n].bytes = 2.0 * 2 * (double)r->micro_batch * (double)T * (double)m->d;
    c[n].elem_bytes = 2;
    c[n].instances = r->stage_layers * r->in_flight;
    c[n].overlap_s = (r->fwd_token + r->bwd_token) * tokens / m->n_layers / rate;
    c[n].fixed = r->act_runtime ? ACT_KEEP : -1;  /* train: what the runtime does */
    c[n].no_recompute = 1;
    double hs_kept = c[n].bytes * c[n].instances;
    r->act_kept_bytes += hs_kept;
    n++;
    /* The knapsack charges a recomputed class its byte share of the module's forward (and
     * whole_module_recompute corrects the chosen plan); the window holds three staging slots
     * and the recompute scratch, each one module's parts. */
    for (int i = 0; i < n; i++) {
        double mod = module_bytes(c, n, i);
        c[i].recompute_s = mod > 0 ? forward_s[i] * c[i].bytes / mod : 0;
        largest = fmax(largest, mod);
    }
    actman_free(&am);
    act_plan p;
    memset(&p, 0, sizeof p);
    p.cls = c;
    p.n = n;
    r->mem_budget = budget_bytes(plan, r->gpu_mem);
    double rest = r->mem_weights + r->mem_master + r->mem_grads + r->mem_optimizer +
                  (r->mem_activations - r->act_kept_bytes);
    p.budget = r->act_budget = r->mem_budget - rest;
    p.hbm_bw = PLAN_HBM_BW;
    p.pcie_bw = PLAN_PCIE_BW;
    p.pcie_capacity_s = (r->fwd_token + r->bwd_token) * tokens * stage / rate;
    int solved = best_plan(&p, largest, forward_s);
    if (solved < 0) {
        free(c);
        free(forward_s);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "plan: out of memory");
    }
    r->act_solved = solved;
    r->act_min_budget = p.min_budget + rest;
    r->act_msg[0] = 0;
    if (!r->act_solved) {
        char b[4][32];
        plan_bytes(r->mem_budget, b[0], sizeof b[0]);
        plan_bytes(p.budget, b[1], sizeof b[1]);
        plan_bytes(rest, b[2], sizeof b[2]);
        plan_bytes(r->act_min_budget, b[3], sizeof b[3]);
        snprintf(r->act_msg, sizeof r->act_msg, "plan.memory_budget %s leaves %s for the saved "
                 "activations after %s of weights, gradients, optimizer state and buffers; the "
                 "smallest budget that works is %s (%.0f bytes) per GPU", b[0], b[1], b[2], b[3],
                 ceil(r->act_min_budget));
    }
    r->n_act_cls = n;
    for (int i = 0; i < n; i++) {
        plan_act_class *o = &r->act_cls[i];
        snprintf(o->name, sizeof o->name, "%s", c[i].name);
        o->policy = r->act_solved ? c[i].policy : ACT_KEEP;
        o->fixed = c[i].fixed >= 0;
        o->instances = c[i].instances;
        o->bytes = c[i].bytes * c[i].instances;
        o->mem = r->act_solved ? c[i].mem : o->bytes;
        o->extra_s = r->act_solved ? c[i].time : 0;
    }
    predict_step(r, p.extra_s, rate, tokens * stage);
    if (r->act_solved) {
        r->act_peak = p.peak;
        r->act_extra_s = p.extra_s;
        r->act_pcie_s = p.pcie_s;
        r->mem_activations = r->mem_activations - r->act_kept_bytes + p.peak;
        r->mem_total = rest + p.peak;
        r->fits = r->mem_total <= r->mem_budget && r->mem_total <= r->gpu_mem;
    }
    free(c);
    free(forward_s);
    return K3RT_OK;
}
