/* `k3rt ablate`: the suite, each variant's recipe checked and planned before anything trains,
 * then the runs and the report (ablate.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ablate/ablate_internal.h"
#include "plan/plan.h"
#include "recipe/recipe.h"
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
        if (rc) {
            k3rt_error_prefix(err, "variant '%s': ", r->v->name);
            break;
        }
        const json_t *doc = recipe_json(rec);
        r->steps = get_int(doc, "train", "steps");
        const char *changed = base ? data_order_change(recipe_json(base), doc) : NULL;
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

static int setup(ablate_ctx *c, k3rt_error *err)
{
    const ablate_options *o = c->o;
    K3RT_TRY(suite_load(o->suite_path, &c->suite, err));
    if (o->out_root)
        snprintf(c->root, sizeof c->root, "%s", o->out_root);
    else
        snprintf(c->root, sizeof c->root, "out/%s", c->suite.name);
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
        fs_join(r->dir, sizeof r->dir, c->root, v->name);
    }
    K3RT_TRY(check_variants(c, err));
    return o->dry_run ? K3RT_OK : fs_mkdirs(c->root, err);
}

/* What would run: each variant's overrides, size and planned FLOPs. */
static void print_plan(const ablate_ctx *c)
{
    printf("suite %s: base %s, output %s\n", c->suite.name, c->suite.base, c->root);
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
    }
}

static void cleanup(ablate_ctx *c)
{
    for (int i = 0; c->runs && i < c->n; i++) {
        free(c->runs[i].sets);
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
