/* `k3rt train` under plan.memory_budget: the planner `k3rt plan` runs (plan_compute_doc)
 * places the saved-tensor classes plan.activations leaves free, the run applies its choice,
 * and the first step records what the activation manager measured (train_internal.h). */
#define _GNU_SOURCE /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
#include "plan/plan.h"
#include "plan/plan_act.h"
#include "train/train_internal.h"
#include "util/log.h"

/* The planner prices the GPU it plans for; a CPU run has no such memory, so a fraction
 * ("60%") is of `k3rt plan`'s default H200 (141 GB), as `k3rt plan` without --gpu-mem. */
#define TRAIN_PLAN_GPU_MEM 141e9

int train_plan_activations(run *r, k3rt_error *err)
{
    const json_t *plan = json_object_get(r->doc, "plan");
    if (!json_object_get(plan, "memory_budget"))
        return K3RT_OK;
    plan_options o;
    memset(&o, 0, sizeof o);
    o.recipe_path = recipe_path(r->rec);
    o.gpus = 1;
    const char *axes[] = {"dp", "ep", "cp", "pp"};
    for (int i = 0; i < 4; i++) {
        json_int_t v = json_integer_value(json_object_get(plan, axes[i]));
        o.gpus *= v > 0 ? (int)v : 1;
    }
    o.gpu_mem = TRAIN_PLAN_GPU_MEM;
    o.node_gpus = 8;
    o.runtime = 1;
    o.runtime_fp8 = r->device == K3RT_DEVICE_CPU;  /* fp8 storage is CPU-only (actman.h) */
    r->act_plan = calloc(1, sizeof *r->act_plan);
    r->act_planned = json_object();
    if (!r->act_plan || !r->act_planned)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = plan_compute_doc(r->doc, &r->reg, &o, r->act_plan, err);
    if (rc) {
        k3rt_error_prefix(err, "plan.memory_budget: ");
        return rc;
    }
    const plan_report *p = r->act_plan;
    if (!p->act_solved)
        return k3rt_fail(err, K3RT_ERR_LIMIT, "%s", p->act_msg);
    for (int i = 0; i < p->n_act_cls; i++)
        if (!p->act_cls[i].fixed && strcmp(p->act_cls[i].name, PLAN_SUBLAYER_INPUTS))
            json_object_set_new(r->act_planned, p->act_cls[i].name,
                                json_string(act_policy_name(p->act_cls[i].policy)));
    return K3RT_OK;
}

void train_print_act_plan(const run *r)
{
    const plan_report *p = r->act_plan;
    if (!p)
        return;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    plan_print_policies(f, p);
    fclose(f);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        log_info("%s", line + strspn(line, " "));
    free(text);
    log_info("activation plan: predicted %.0f bytes of saved activations, %.0f bytes in all, "
             "within plan.memory_budget %.0f bytes (the planner's bf16 GPU pricing: "
             "`k3rt plan` prints the same)", p->act_peak, p->mem_total, p->mem_budget);
}

int train_act_record(rank_ctx *c, int64_t step, k3rt_error *err)
{
    const actman *am = c->m.am;
    /* Only runs that place activations (a budget or plan.activations): a run's other records
     * are one per step, which readers such as kill_resume.sh count on. */
    const json_t *pol = json_object_get(json_object_get(c->r->doc, "plan"), "activations");
    if (c->rank != 0 || !am || !c->r->metrics || (!c->r->act_plan && !json_object_size(pol)))
        return K3RT_OK;
    json_t *a = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "peak_bytes",
                          (json_int_t)actman_peak_bytes(am), "region_bytes",
                          (json_int_t)actman_device_bytes(am), "staging_peak_bytes",
                          (json_int_t)am->peak_slots * am->slot_bytes, "host_bytes",
                          (json_int_t)am->host_bytes, "stores", (json_int_t)am->stores, "loads",
                          (json_int_t)am->loads, "late_prefetches", (json_int_t)am->late_loads,
                          "recomputes", (json_int_t)am->recomputes);
    if (a && c->r->act_plan)
        plan_act_json_into(a, c->r->act_plan);
    json_t *rec = a ? json_pack("{s:I, s:o}", "step", (json_int_t)step, "activations", a) : NULL;
    int rc = train_write_record(c->r, rec, err);
    json_decref(rec);
    return rc;
}
