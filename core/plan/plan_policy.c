/* Activation policies for `k3rt plan` (plan_policy.h). */
#include "plan/plan_policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
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

int plan_policies(model *m, const json_t *plan, plan_report *r, k3rt_error *err)
{
    actman am;
    int64_t T = r->seq_len / r->cp;
    K3RT_TRY(actman_plan(m, r->micro_batch, T, json_object_get(plan, "activations"), &am,
                         err));
    int n = am.n_cls < PLAN_MAX_COMPONENTS ? am.n_cls : PLAN_MAX_COMPONENTS;
    act_cost *c = calloc((size_t)(n ? n : 1), sizeof *c);
    if (!c) {
        actman_free(&am);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "plan: out of memory");
    }
    double rate = PLAN_PEAK_FLOPS * PLAN_MFU, largest = 0;
    r->act_kept_bytes = 0;
    for (int i = 0; i < n; i++) {
        const act_class *k = &am.cls[i];
        snprintf(c[i].name, sizeof c[i].name, "%s", k->name);
        c[i].bytes = 0.5 * (double)k->bytes;  /* the CPU plugins count f32; bf16 on the GPU */
        c[i].elem_bytes = 2;
        c[i].instances = k->instances;
        c[i].fp8_ok = k->fp8_ok;
        c[i].recompute_s = k->recompute_flops / rate;
        c[i].overlap_s = 3 * k->recompute_flops / rate;  /* its forward and backward */
        c[i].fixed = k->fixed ? k->policy : -1;
        r->act_kept_bytes += c[i].bytes * c[i].instances;
        largest = fmax(largest, c[i].bytes);
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
    p.window = 4 * largest;  /* three staging slots and the recompute scratch */
    p.hbm_bw = PLAN_HBM_BW;
    p.pcie_bw = PLAN_PCIE_BW;
    double tokens = (double)r->micro_batch * (double)T;
    p.pcie_capacity_s = (r->fwd_token + r->bwd_token) * tokens / rate;
    k3rt_error perr = {0};
    r->act_solved = act_plan_solve(&p, &perr) == K3RT_OK;
    r->act_min_budget = p.min_budget + rest;
    r->act_msg[0] = 0;
    if (!r->act_solved)
        snprintf(r->act_msg, sizeof r->act_msg, "plan.memory_budget %.1f GB leaves %.1f GB "
                 "for the saved activations after %.1f GB of weights, gradients, optimizer "
                 "state and buffers; the smallest budget that works is %.1f GB per GPU",
                 r->mem_budget / 1e9, p.budget / 1e9, rest / 1e9, r->act_min_budget / 1e9);
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
    if (r->act_solved) {
        r->act_peak = p.peak;
        r->act_extra_s = p.extra_s;
        r->act_pcie_s = p.pcie_s;
        r->mem_activations = r->mem_activations - r->act_kept_bytes + p.peak;
        r->mem_total = rest + p.peak;
        r->fits = r->mem_total <= r->mem_budget && r->mem_total <= r->gpu_mem;
    }
    free(c);
    return K3RT_OK;
}
