/* The top level of a recipe: its keys, the train and data sections' cross-key rules, mid-run
 * changes (train.changes, on_step's result) and the names --set and error messages suggest. */
#include "recipe/schema_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define BIG 1e15 /* "unbounded" for counts; printed by %g as 1e+15 */

static const k3rt_option CHANGE_OPTS[] = {
    {"step", K3RT_OPT_INT, 0, NULL, 1, BIG, NULL, "the step the change applies from"},
};

static const char *const ROOT_KEYS[] = {"model", "optimizer", "plan", "train",
                                        "data", "sample", "out", "on_step"};
static const char *const CHANGE_KEYS[] = {"step", "balancer"};
static const char *const ON_STEP_KEYS[] = {"balancer"};

static int train_changes(schema_ctx *c, const json_t *raw, json_t **out)
{
    if (!raw || (json_is_object(raw) && !raw_doc_spec(c->raw, raw) && !json_object_size(raw))) {
        *out = json_array();
        return K3RT_OK;
    }
    if (!json_is_array(raw))
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "train.changes: expected a list of "
                         "{ step = N, balancer = k3.NAME{...} }, got %s", schema_json_kind(raw));
    json_t *list = json_array();
    json_int_t prev = 0;
    size_t i;
    json_t *item;
    json_array_foreach(raw, i, item) {
        char what[64], bwhat[80];
        snprintf(what, sizeof what, "train.changes[%zu]", i + 1);
        snprintf(bwhat, sizeof bwhat, "%s.balancer", what);
        int rc = (!json_is_object(item) || raw_doc_spec(c->raw, item))
                     ? sch_not_a_table(c, what, item)
                     : schema_check_keys(item, CHANGE_KEYS, COUNT(CHANGE_KEYS), what, c->err);
        json_t *step = NULL, *bal = NULL;
        if (!rc) {
            step = json_pack("{s:O*}", "step", json_object_get(item, "step"));
            rc = options_apply(CHANGE_OPTS, 1, sizeof(k3rt_option), step, what, c->err);
        }
        json_int_t s = rc ? 0 : json_integer_value(json_object_get(step, "step"));
        if (!rc && s <= prev)
            rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "%s: steps must increase strictly "
                           "(step %lld after step %lld)", what, (long long)s, (long long)prev);
        if (!rc && !json_object_get(item, "balancer"))
            rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "%s: missing required key 'balancer'",
                           what);
        if (!rc)
            rc = sch_balancer(c, json_object_get(item, "balancer"), bwhat, &bal);
        json_decref(step);
        if (rc) {
            json_decref(list);
            return rc;
        }
        prev = s;
        json_array_append_new(list, json_pack("{s:I, s:o}", "step", (json_int_t)s, "balancer",
                                              bal));
    }
    *out = list;
    return K3RT_OK;
}

static int train_build(schema_ctx *c, const json_t *raw, json_t **out)
{
    K3RT_TRY(sch_section_scalars(c, "train", raw, out));
    json_t *changes = NULL;
    int rc = train_changes(c, raw ? json_object_get(raw, "changes") : NULL, &changes);
    if (rc) {
        json_decref(*out);
        return rc;
    }
    json_object_set_new(*out, "changes", changes);
    return K3RT_OK;
}

static int data_build(schema_ctx *c, const json_t *raw, json_t **out)
{
    K3RT_TRY(sch_section_scalars(c, "data", raw, out));
    const char *tok = json_string_value(json_object_get(*out, "tokenizer"));
    int rc = K3RT_OK;
    if (!strcmp(tok, "bytes") && !json_is_string(json_object_get(*out, "path")))
        rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "data: tokenizer \"bytes\" reads a text file: "
                       "set data.path (e.g. path = \"data/tinyshakespeare.txt\")");
    if (!strcmp(tok, "shards") && (!json_is_string(json_object_get(*out, "train")) ||
                                   !json_is_string(json_object_get(*out, "val"))))
        rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "data: tokenizer \"shards\" needs data.train "
                       "and data.val (token shard files)");
    if (rc)
        json_decref(*out);
    return rc;
}

/* v by address: it is read only after the builder in `rc` has run. */
static int add(json_t *doc, const char *key, int rc, json_t **v)
{
    if (!rc)
        json_object_set_new(doc, key, *v);
    return rc;
}

int schema_build(const raw_doc *raw, registry *reg, const char *stem, json_t **doc, char *pos,
                 k3rt_error *err)
{
    schema_ctx c = {raw, reg, pos, err};
    snprintf(pos, SANDBOX_POS_MAX, "%s", raw->pos);
    const json_t *root = raw->root;
    K3RT_TRY(schema_check_keys(root, ROOT_KEYS, COUNT(ROOT_KEYS), "top level", err));
    const json_t *model = json_object_get(root, "model");
    if (!model)
        return k3rt_fail(err, K3RT_ERR_INVALID, "top level: missing required section "
                         "'model' (d_model, vocab, layers, mixers, ffn)");
    const json_t *opt = json_object_get(root, "optimizer");
    if (!opt)
        return k3rt_fail(err, K3RT_ERR_INVALID, "top level: missing required key "
                         "'optimizer' (e.g. optimizer = k3.adamw{ lr = 3e-3 })");
    json_t *d = json_object(), *v = NULL;
    int rc = add(d, "model", sch_model(&c, model, &v), &v);
    if (!rc)
        rc = add(d, "optimizer", sch_spec(&c, opt, K3RT_KIND_OPTIMIZER, "optimizer", &v),
                 &v);
    if (!rc)
        rc = add(d, "plan", sch_plan(&c, json_object_get(root, "plan"), &v), &v);
    if (!rc)
        rc = add(d, "train", train_build(&c, json_object_get(root, "train"), &v), &v);
    if (!rc)
        rc = add(d, "data", data_build(&c, json_object_get(root, "data"), &v), &v);
    if (!rc)
        rc = add(d, "sample", sch_section_scalars(&c, "sample", json_object_get(root, "sample"),
                                                   &v), &v);
    const json_t *o = json_object_get(root, "out");
    if (!rc && o && (!json_is_string(o) || !json_string_length(o)))
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "out: expected an output folder (a non-empty "
                       "string), got %s", schema_json_kind(o));
    if (!rc) {
        char def[512];
        snprintf(def, sizeof def, "runs/%s", stem);
        json_object_set_new(d, "out", o ? json_copy((json_t *)o) : json_string(def));
        json_object_set_new(d, "has_on_step", json_boolean(raw->has_on_step));
    }
    if (rc) {
        json_decref(d);
        return rc;
    }
    *doc = d;
    return K3RT_OK;
}

int schema_changes(const raw_doc *raw, registry *reg, json_t **changes, char *pos,
                   k3rt_error *err)
{
    schema_ctx c = {raw, reg, pos, err};
    *changes = NULL;
    snprintf(pos, SANDBOX_POS_MAX, "%s", raw->pos);
    const json_t *root = raw->root;
    if (!root || json_is_null(root))
        return K3RT_OK;
    if (!json_is_object(root) || raw_doc_spec(raw, root))
        return k3rt_fail(err, K3RT_ERR_INVALID, "on_step must return nil or a table such as "
                         "{ balancer = k3.NAME{...} }, got %s",
                         raw_doc_spec(raw, root) ? "a plugin spec" : schema_json_kind(root));
    K3RT_TRY(schema_check_keys(root, ON_STEP_KEYS, COUNT(ON_STEP_KEYS), "on_step result", err));
    const json_t *b = json_object_get(root, "balancer");
    if (!b)
        return K3RT_OK;
    json_t *spec;
    K3RT_TRY(sch_balancer(&c, b, "on_step result: balancer", &spec));
    *changes = json_pack("{s:o}", "balancer", spec);
    return K3RT_OK;
}

int schema_names(const char *const *comps, int depth, const char **names, int max, int *kind)
{
    *kind = 0;
    if (depth == 0) {
        int n = 0;
        for (; n < COUNT(ROOT_KEYS) && n < max; n++)
            names[n] = ROOT_KEYS[n];
        return n;
    }
    const char *c0 = comps[0];
    if (depth == 1) {
        if (!strcmp(c0, "optimizer")) {
            *kind = K3RT_KIND_OPTIMIZER;
            return SCHEMA_SPEC;
        }
        int n = sch_section_names(c0, names, max);
        return n >= 0 ? n : SCHEMA_LEAF;
    }
    int model = !strcmp(c0, "model"), changes = !strcmp(c0, "train") &&
                                                 !strcmp(comps[1], "changes");
    if (depth == 2 && model) {
        const char *c1 = comps[1];
        *kind = !strcmp(c1, "ffn") || !strcmp(c1, "dense_ffn") ? K3RT_KIND_MOE
                : !strcmp(c1, "balancer")                      ? K3RT_KIND_BALANCER
                : !strcmp(c1, "residual")                      ? K3RT_KIND_RESIDUAL
                                                               : 0;
        if (*kind)
            return SCHEMA_SPEC;
        return !strcmp(c1, "mixers") ? SCHEMA_MAP : SCHEMA_LEAF;
    }
    if (depth == 2 && changes)
        return SCHEMA_LIST;
    if (depth == 3 && model && !strcmp(comps[1], "mixers")) {
        *kind = K3RT_KIND_ATTENTION;
        return SCHEMA_SPEC;
    }
    if (depth == 3 && changes) {
        int n = 0;
        for (; n < COUNT(CHANGE_KEYS) && n < max; n++)
            names[n] = CHANGE_KEYS[n];
        return n;
    }
    if (depth == 4 && changes && !strcmp(comps[3], "balancer")) {
        *kind = K3RT_KIND_BALANCER;
        return SCHEMA_SPEC;
    }
    return SCHEMA_LEAF;
}
