/* `k3rt plan`: recipe and plan checks, parameter components, FLOPs (plan.h). */
#include "plan/plan.h"
#include "plan/plan_policy.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "plan/plan_memory.h"
#include "recipe/recipe.h"

static int64_t get_int(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* The plan section against N; everything the rest relies on is checked here. */
static int read_plan(const json_t *doc, const plan_options *o, plan_report *r, k3rt_error *err)
{
    const json_t *plan = json_object_get(doc, "plan");
    r->dp = (int)get_int(plan, "dp");
    r->ep = (int)get_int(plan, "ep");
    r->cp = (int)get_int(plan, "cp");
    r->pp = (int)get_int(plan, "pp");
    r->shard_gradients = json_is_true(json_object_get(plan, "shard_gradients"));
    r->micro_batch = get_int(plan, "micro_batch");
    r->seq_len = get_int(plan, "seq_len");
    r->grad_accum = get_int(plan, "grad_accum");
    r->shard_optimizer = json_is_true(json_object_get(plan, "shard_optimizer"));
    r->steps = get_int(json_object_get(doc, "train"), "steps");
    r->gpus = o->gpus;
    r->gpu_mem = o->gpu_mem;
    r->node_gpus = o->node_gpus;
    r->act_runtime = o->runtime;
    r->act_no_fp8 = o->runtime && !o->runtime_fp8;
    if (o->gpus < 1 || o->node_gpus < 1 || !(o->gpu_mem > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "plan: --gpus (%d), --node-gpus (%d) and "
                         "--gpu-mem (%g bytes) must be positive", o->gpus, o->node_gpus,
                         o->gpu_mem);
    int64_t ranks = (int64_t)r->dp * r->ep * r->cp * r->pp;
    if (ranks != o->gpus)
        return k3rt_fail(err, K3RT_ERR_INVALID, "plan: dp x ep x cp x pp = %d x %d x %d x %d = "
                         "%lld ranks, but --gpus is %d: the product of the plan's parallel "
                         "sizes must equal the GPU count (set them with --set plan.dp=..., "
                         "plan.ep=..., plan.cp=..., plan.pp=...)", r->dp, r->ep, r->cp, r->pp,
                         (long long)ranks, o->gpus);
    if (r->seq_len % r->cp)
        return k3rt_fail(err, K3RT_ERR_INVALID, "plan: cp = %d does not divide seq_len = %lld "
                         "(each context-parallel rank takes an equal span)", r->cp,
                         (long long)r->seq_len);
    r->tokens_per_step = r->micro_batch * r->seq_len * r->grad_accum * r->dp * r->ep;
    return K3RT_OK;
}

/* Which component a parameter counts towards; *expert is set for routed-expert matrices. */
static void component_of(const model *m, const param_slot *p, char *buf, size_t len,
                         int *expert)
{
    *expert = 0;
    if (p->module < 0) {
        snprintf(buf, len, "%s", p->decl.role == K3RT_ROLE_EMBEDDING     ? "embedding"
                                 : p->decl.role == K3RT_ROLE_OUTPUT_HEAD ? "lm head"
                                                                         : "model norms");
        return;
    }
    char mod[96];
    plan_module_name(m, p->module, mod, sizeof mod);
    const model_module *mm = &m->mods[p->module];
    if (mm->kind != K3RT_KIND_MOE || !m->layers[mm->layer].experts) {
        snprintf(buf, len, "%s", mod);
        return;
    }
    *expert = p->decl.role == K3RT_ROLE_EXPERT_MATRIX;
    snprintf(buf, len, "%s: %s", mod, *expert ? "routed experts" : "all but routed experts");
}

/* Sums the declarations into components; instances counts the distinct modules of each. */
static int count_params(const model *m, plan_report *r, k3rt_error *err)
{
    char *seen = calloc((size_t)PLAN_MAX_COMPONENTS * (size_t)(m->n_mods + 1), 1);
    if (!seen)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "plan: out of memory");
    int rc = K3RT_OK;
    for (int i = 0; i < m->n_params && !rc; i++) {
        const param_slot *p = &m->params[i];
        char name[96];
        int expert, c = 0;
        component_of(m, p, name, sizeof name, &expert);
        while (c < r->n_comps && strcmp(r->comps[c].name, name))
            c++;
        if (c == PLAN_MAX_COMPONENTS) {
            rc = k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan: more than %d parameter components",
                           PLAN_MAX_COMPONENTS);
            break;
        }
        plan_component *pc = &r->comps[c];
        if (c == r->n_comps) {
            r->n_comps++;
            snprintf(pc->name, sizeof pc->name, "%s", name);
            pc->expert = expert;
        }
        char *s = &seen[(size_t)c * (size_t)(m->n_mods + 1) + (size_t)(p->module + 1)];
        if (p->module >= 0 && !*s)
            pc->instances++;
        *s = 1;
        pc->total += p->numel;
        pc->active += model_param_active(m, i);
    }
    free(seen);
    model_param_counts(m, &r->total, &r->active);
    return rc;
}

static void describe_model(const model *m, const char *path, plan_report *r)
{
    snprintf(r->recipe, sizeof r->recipe, "%s", path);
    r->n_layers = m->n_layers;
    r->d = m->d;
    r->vocab = m->vocab;
    int keep = (int)sizeof r->pattern - 4;
    for (int i = 0; i < m->n_layers && i < keep; i++)
        r->pattern[i] = m->layers[i].mixer_letter;
    if (m->n_layers > keep)
        memcpy(r->pattern + keep, "...", 4);
}

static int count_flops(model *m, plan_report *r, k3rt_error *err)
{
    double f, b;
    K3RT_TRY(model_flops(m, r->micro_batch, r->seq_len, &f, &b, err));
    double tokens = (double)(r->micro_batch * r->seq_len);
    r->fwd_token = f / tokens;
    r->bwd_token = b / tokens;
    /* The trainer's per-step count (train_loop.c) in the same order of operations, so the
     * two agree exactly. */
    r->flops_per_step = (f + b) * (double)(r->grad_accum * r->dp * r->ep);
    return K3RT_OK;
}

int plan_compute_doc(const json_t *doc, registry *reg, const plan_options *o, plan_report *r,
                     k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    model m;
    K3RT_TRY(read_plan(doc, o, r, err));
    model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.dtype = K3RT_F32;
    mo.device = K3RT_DEVICE_CPU;
    mo.stream = k3rt_host_stream();
    mo.seed = (uint64_t)get_int(json_object_get(doc, "train"), "seed");
    K3RT_TRY(model_declare(&m, json_object_get(doc, "model"), reg, &mo, err));
    describe_model(&m, o->recipe_path, r);
    int rc = count_params(&m, r, err);
    if (!rc)
        rc = count_flops(&m, r, err);
    if (!rc)
        rc = plan_memory(&m, doc, reg, r, err);
    if (!rc)
        rc = plan_policies(&m, json_object_get(doc, "plan"), r, err);
    model_free(&m);
    return rc;
}

int plan_compute(const plan_options *o, plan_report *r, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    registry reg;
    K3RT_TRY(registry_init(&reg, o->plugin_path, err));
    recipe *rec = NULL;
    int rc = recipe_load(o->recipe_path, &reg, o->overrides, o->n_overrides, NULL, &rec, err);
    if (!rc)
        rc = plan_compute_doc(recipe_json(rec), &reg, o, r, err);
    recipe_free(rec);
    registry_free(&reg);
    return rc;
}
