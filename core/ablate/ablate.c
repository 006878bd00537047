/* `k3rt ablate`: the suite, each variant's recipe checked and planned before anything trains,
 * then the runs and the report (ablate.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ablate/ablate_internal.h"
#include "backend/backend.h"
#include "plan/plan.h"
#include "recipe/recipe.h"
#include "train/ckpt_dir.h"
#include "train/device_choice.h"
#include "util/fs.h"
#include "util/log.h"

static int64_t get_int(const json_t *o, const char *section, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(o, section), key));
}

/* What decides the data a run sees: the seed, the data section and the batch geometry. */
static const char *data_order_change(const json_t *base, const json_t *doc)
{
    static const char *const plan_keys[] = {"micro_batch", "seq_len", "grad_accum", "dp"};
    if (get_int(base, "train", "seed") != get_int(doc, "train", "seed"))
        return "train.seed";
    if (!json_equal(json_object_get(base, "data"), json_object_get(doc, "data")))
        return "data";
    for (int i = 0; i < 4; i++)
        if (get_int(base, "plan", plan_keys[i]) != get_int(doc, "plan", plan_keys[i]))
            return plan_keys[i];
    return NULL;
}

/* What the trainer will make of the resolved recipe: its seed (checked against the suite's
 * `seeds`: a --set train.seed on the command line would make the replicas one run), device
 * and identity. */
static int inspect(variant_run *r, const recipe *rec, const ablate_suite *s, k3rt_error *err)
{
    const json_t *doc = recipe_json(rec);
    r->steps = get_int(doc, "train", "steps");
    r->seed = get_int(doc, "train", "seed");
    if (s->n_seeds && (r->v == s->variants || r->v->replica) && r->seed != r->v->seed)
        return k3rt_fail(err, K3RT_ERR_INVALID, "trains under train.seed = %lld, not the "
                         "suite's seed %lld: a train.seed override after the suite's own (on "
                         "the command line) defeats `seeds`; leave it out",
                         (long long)r->seed, r->v->seed);
    device_choice dc;
    K3RT_TRY(device_choose(rec, k3rt_cuda_device_count(), &dc, err));
    r->cuda = dc.cuda;
    char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    if (!text)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    sha256_hex(text, strlen(text), r->recipe_sha);
    free(text);
    return K3RT_OK;
}

/* Loads each variant's recipe (so a misspelt override fails now, not after the base has
 * trained) and plans it for its FLOPs per step. */
static int check_variants(ablate_ctx *c, k3rt_error *err)
{
    registry reg;
    K3RT_TRY(registry_init(&reg, c->o->plugin_path, err));
    recipe *base = NULL;
    int rc = K3RT_OK;
    for (int i = 0; i < c->n && !rc; i++) {
        variant_run *r = &c->runs[i];
        recipe *rec = NULL;
        rc = recipe_load(c->suite.base, &reg, r->sets, r->n_sets, NULL, &rec, err);
        if (!rc)
            rc = inspect(r, rec, &c->suite, err);
        if (rc) {
            k3rt_error_prefix(err, "variant '%s': ", r->v->name);
            recipe_free(rec);
            break;
        }
        const json_t *doc = recipe_json(rec);
        const char *changed = base && !r->v->replica ? data_order_change(recipe_json(base), doc)
                                                     : NULL;
        if (changed)
            log_warn("variant '%s' changes %s: it does not see the base's data order",
                     r->v->name, changed);
        plan_options po = {c->suite.base, r->sets, r->n_sets, c->o->plugin_path,
                           (int)(get_int(doc, "plan", "dp") * get_int(doc, "plan", "ep") *
                                 get_int(doc, "plan", "cp")),
                           141e9, 8, 0, 0};
        plan_report pr;
        rc = plan_compute(&po, &pr, err);
        if (rc)
            k3rt_error_prefix(err, "variant '%s': ", r->v->name);
        r->step_flops = pr.flops_per_step;
        r->params_total = pr.total;
        r->params_active = pr.active;
        if (base)
            recipe_free(rec);
        else
            base = rec;
    }
    recipe_free(base);
    registry_free(&reg);
    return rc;
}

/* Runs on the GPU go one at a time; CPU runs at once share the cores. */
static void choose_jobs(ablate_ctx *c)
{
    for (int i = 0; i < c->n; i++)
        c->cuda |= c->runs[i].cuda;
    c->jobs = c->o->jobs > 0 ? c->o->jobs : 1;
    if (c->cuda && c->jobs > 1) {
        log_warn("--jobs %d: the runs train on the GPU, so one at a time (two on one device "
                 "would each measure a share of it)", c->jobs);
        c->jobs = 1;
    }
    c->threads = c->jobs > 1 ? k3rt_cpu_threads() / c->jobs : 0;
    c->threads = c->jobs > 1 && c->threads < 1 ? 1 : c->threads;
}

static int setup(ablate_ctx *c, k3rt_error *err)
{
    const ablate_options *o = c->o;
    K3RT_TRY(suite_load(o->suite_path, &c->suite, err));
    if (o->out_root)
        snprintf(c->root, sizeof c->root, "%s", o->out_root);
    else
        snprintf(c->root, sizeof c->root, "out/%s", c->suite.name);
    c->runs_dir = o->runs_dir ? o->runs_dir : c->suite.runs[0] ? c->suite.runs : NULL;
    c->n = c->suite.n_variants;
    c->runs = calloc((size_t)c->n, sizeof *c->runs);
    if (!c->runs)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n; i++) {
        variant_run *r = &c->runs[i];
        const ablate_variant *v = &c->suite.variants[i];
        r->v = v;
        r->sets = calloc((size_t)(c->suite.n_sets + v->n_sets + o->n_overrides + 1),
                         sizeof *r->sets);
        if (!r->sets)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        for (int k = 0; k < c->suite.n_sets; k++)
            r->sets[r->n_sets++] = c->suite.sets[k];
        for (int k = 0; k < v->n_sets; k++)
            r->sets[r->n_sets++] = v->sets[k];
        for (int k = 0; k < o->n_overrides; k++)
            r->sets[r->n_sets++] = o->overrides[k];
    }
    K3RT_TRY(check_variants(c, err));
    choose_jobs(c);
    K3RT_TRY(ablate_prepare_runs(c, err));
    return o->dry_run ? K3RT_OK : fs_mkdirs(c->root, err);
}

/* What would run: each variant's overrides, size and planned FLOPs. */
static void print_plan(const ablate_ctx *c)
{
    printf("suite %s: base %s, output %s\n", c->suite.name, c->suite.base, c->root);
    if (c->jobs > 1)
        printf("runs: on the CPU, %d at a time, %d threads each\n", c->jobs, c->threads);
    else
        printf("runs: one at a time, on the %s\n", c->cuda ? "GPU" : "CPU");
    for (int i = 0; i < c->n; i++) {
        const variant_run *r = &c->runs[i];
        char t[32], a[32];
        plan_human((double)r->params_total, t, sizeof t);
        plan_human((double)r->params_active, a, sizeof a);
        printf("  %-20s %s parameters (%s active), %lld steps x %.4g FLOPs = %.4g FLOPs\n",
               r->v->name, t, a, (long long)r->steps, r->step_flops,
               r->step_flops * (double)r->steps);
        for (int k = 0; k < r->n_sets; k++)
            printf("  %-20s   --set %s\n", "", r->sets[k]);
        printf("  %-20s   in %s\n", "", r->dir);
    }
}

static void cleanup(ablate_ctx *c)
{
    for (int i = 0; c->runs && i < c->n; i++) {
        free(c->runs[i].sets);
        json_decref(c->runs[i].args);
        free(c->runs[i].curve_flops);
        free(c->runs[i].curve_loss);
    }
    free(c->runs);
    suite_free(&c->suite);
}

int ablate_main(const ablate_options *o, k3rt_error *err)
{
    ablate_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    int rc = setup(&c, err);
    if (!rc && o->dry_run) {
        print_plan(&c);
        cleanup(&c);
        return K3RT_OK;
    }
    if (!rc)
        rc = ablate_run_all(&c, err);
    if (!rc)
        rc = ablate_report(&c, err);
    if (!rc) {
        char failed[1024] = "";
        size_t at = 0;
        for (int i = 0; i < c.n && at < sizeof failed; i++)
            if (c.runs[i].failed)
                at += (size_t)snprintf(failed + at, sizeof failed - at, "%s%s (%s/train.log)",
                                       at ? ", " : "", c.runs[i].v->name, c.runs[i].dir);
        if (at)
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "variants failed: %s", failed);
    }
    cleanup(&c);
    return rc;
}
