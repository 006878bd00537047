/* The core sections of a recipe: option tables, section validation and the top level. */
#include "recipe/schema_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define BIG 1e15 /* "unbounded" for counts; printed by %g as 1e+15 */

static const k3rt_option MODEL_OPTS[] = {
    {"d_model", K3RT_OPT_INT, 0, NULL, 1, 1048576, NULL, "model width"},
    {"vocab", K3RT_OPT_INT, 0, NULL, 1, 1e9, NULL, "vocabulary size (256 for bytes)"},
    {"layers", K3RT_OPT_INT, 0, NULL, 1, 100000, NULL, "decoder layers"},
    {"pattern", K3RT_OPT_STRING, K3RT_OPT_NULLABLE, "null", K3RT_RANGE_ANY, NULL,
     "mixer letters per layer, repeated to `layers`"},
    {"dense_layers", K3RT_OPT_INT, 0, "0", 0, 100000, NULL,
     "the first N layers use dense_ffn"},
    {"norm_eps", K3RT_OPT_FLOAT, 0, "1e-5", 1e-12, 1, NULL, "RMSNorm epsilon"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 10, NULL, "std of the normal initialisation"},
};
static const char *const MODEL_SPECS[] = {"mixers", "ffn", "dense_ffn", "balancer", "residual"};

static const k3rt_option PLAN_OPTS[] = {
    {"dp", K3RT_OPT_INT, 0, "1", 1, 65536, NULL, "data-parallel ranks"},
    {"ep", K3RT_OPT_INT, 0, "1", 1, 65536, NULL, "expert-parallel ranks"},
    {"cp", K3RT_OPT_INT, 0, "1", 1, 65536, NULL, "context-parallel ranks"},
    {"micro_batch", K3RT_OPT_INT, 0, "8", 1, 1e6, NULL, "sequences per rank and micro-step"},
    {"seq_len", K3RT_OPT_INT, 0, "256", 1, 1e8, NULL, "tokens per sequence"},
    {"grad_accum", K3RT_OPT_INT, 0, "1", 1, 1e6, NULL, "micro-steps per optimizer step"},
    {"device", K3RT_OPT_STRING, 0, "\"auto\"", K3RT_RANGE_ANY, "auto|cpu|cuda", "where to run"},
    {"dtype", K3RT_OPT_STRING, 0, "\"auto\"", K3RT_RANGE_ANY, "auto|f32|f64|bf16",
     "compute precision"},
    {"threads", K3RT_OPT_INT, 0, "0", 0, 65536, NULL, "CPU threads (0 = all cores)"},
    {"peak_tflops", K3RT_OPT_FLOAT, 0, "0", 0, 1e9, NULL,
     "the device's peak bf16 TFLOP/s for MFU (0 = k3rt's table of measured devices)"},
    {"deterministic", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "bitwise reproducible kernels"},
    {"shard_optimizer", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "fp32 master weights and optimizer states sharded across the ranks that hold the same "
     "parameters (ZeRO-1); sizes `k3rt plan`'s memory"},
};

static const k3rt_option TRAIN_OPTS[] = {
    {"steps", K3RT_OPT_INT, 0, "1000", 1, BIG, NULL, "optimizer steps"},
    {"warmup", K3RT_OPT_INT, 0, "100", 0, BIG, NULL, "linear warm-up steps"},
    {"schedule", K3RT_OPT_STRING, 0, "\"cosine\"", K3RT_RANGE_ANY, "cosine|linear|constant",
     "learning-rate decay after warm-up"},
    {"min_lr_ratio", K3RT_OPT_FLOAT, 0, "0.1", 0, 1, NULL, "final lr as a fraction of lr"},
    {"seed", K3RT_OPT_INT, 0, "1", 0, BIG, NULL, "initialisation and data order"},
    {"grad_clip", K3RT_OPT_FLOAT, 0, "1.0", 0, 1e9, NULL, "global gradient norm (0 = off)"},
    {"log_interval", K3RT_OPT_INT, 0, "10", 1, BIG, NULL, "steps between log lines"},
    {"eval_interval", K3RT_OPT_INT, 0, "250", 0, BIG, NULL,
     "steps between evaluations (0 = only at the end)"},
    {"eval_batches", K3RT_OPT_INT, 0, "0", 0, BIG, NULL, "batches per evaluation (0 = all)"},
    {"checkpoint_interval", K3RT_OPT_INT, 0, "500", 0, BIG, NULL,
     "steps between checkpoints (0 = none)"},
    {"keep_checkpoints", K3RT_OPT_INT, 0, "2", 0, 1e6, NULL, "newest kept (0 = all)"},
    {"max_bad_steps", K3RT_OPT_INT, 0, "5", 0, 1e6, NULL,
     "consecutive non-finite steps skipped before failing"},
};
static const char *const TRAIN_LISTS[] = {"changes"};

static const k3rt_option DATA_OPTS[] = {
    {"tokenizer", K3RT_OPT_STRING, 0, "\"bytes\"", K3RT_RANGE_ANY, "bytes|shards",
     "bytes of a text file, or pre-tokenized shards"},
    {"path", K3RT_OPT_STRING, K3RT_OPT_NULLABLE, "null", K3RT_RANGE_ANY, NULL,
     "text file (bytes)"},
    {"val_fraction", K3RT_OPT_FLOAT, 0, "0.1", 0, 0.9, NULL,
     "tail of the text held out (bytes)"},
    {"train", K3RT_OPT_STRING, K3RT_OPT_NULLABLE, "null", K3RT_RANGE_ANY, NULL,
     "training shard (shards)"},
    {"val", K3RT_OPT_STRING, K3RT_OPT_NULLABLE, "null", K3RT_RANGE_ANY, NULL,
     "validation shard (shards)"},
};

static const k3rt_option SAMPLE_OPTS[] = {
    {"bytes", K3RT_OPT_INT, 0, "500", 0, 1e9, NULL, "tokens to generate"},
    {"temperature", K3RT_OPT_FLOAT, 0, "0.8", 0, 100, NULL, "0 = greedy"},
    {"top_k", K3RT_OPT_INT, 0, "0", 0, 1e9, NULL, "0 = no top-k cut"},
    {"prompt", K3RT_OPT_STRING, 0, "\"\\n\"", K3RT_RANGE_ANY, NULL, "text to continue"},
    {"seed", K3RT_OPT_INT, 0, "1", 0, BIG, NULL, "sampling seed"},
};

static const k3rt_option CHANGE_OPTS[] = {
    {"step", K3RT_OPT_INT, 0, NULL, 1, BIG, NULL, "the step the change applies from"},
};

typedef struct section {
    const char *name;
    const k3rt_option *opts;
    int n_opts;
    const char *const *structured; /* keys checked by code: specs and lists */
    int n_structured;
} section;

static const section SECTIONS[] = {
    {"model", MODEL_OPTS, COUNT(MODEL_OPTS), MODEL_SPECS, COUNT(MODEL_SPECS)},
    {"plan", PLAN_OPTS, COUNT(PLAN_OPTS), NULL, 0},
    {"train", TRAIN_OPTS, COUNT(TRAIN_OPTS), TRAIN_LISTS, COUNT(TRAIN_LISTS)},
    {"data", DATA_OPTS, COUNT(DATA_OPTS), NULL, 0},
    {"sample", SAMPLE_OPTS, COUNT(SAMPLE_OPTS), NULL, 0},
};
static const char *const ROOT_KEYS[] = {"model", "optimizer", "plan", "train",
                                        "data", "sample", "out", "on_step"};
static const char *const CHANGE_KEYS[] = {"step", "balancer"};
static const char *const ON_STEP_KEYS[] = {"balancer"};

static int section_names(const section *s, const char **names, int max)
{
    int n = 0;
    for (int i = 0; i < s->n_opts && n < max; i++)
        names[n++] = s->opts[i].name;
    for (int i = 0; i < s->n_structured && n < max; i++)
        names[n++] = s->structured[i];
    return n;
}

int schema_check_keys(const json_t *obj, const char *const *names, int n, const char *what,
                      k3rt_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int known = 0;
        for (int i = 0; i < n && !known; i++)
            known = !strcmp(key, names[i]);
        if (!known)
            return schema_unknown_key(what, key, names, n, err);
    }
    return K3RT_OK;
}

int sch_not_a_table(schema_ctx *c, const char *what, const json_t *v)
{
    const raw_spec *rs = v ? raw_doc_spec(c->raw, v) : NULL;
    if (rs)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "%s: expected a table, got a plugin spec "
                         "(k3.%s)", what, rs->info.name);
    return k3rt_fail(c->err, K3RT_ERR_INVALID, "%s: expected a table, got %s", what,
                     schema_json_kind(v));
}

static const section *find_section(const char *name)
{
    for (int i = 0; i < COUNT(SECTIONS); i++)
        if (!strcmp(name, SECTIONS[i].name))
            return &SECTIONS[i];
    return NULL;
}

int sch_section_scalars(schema_ctx *c, const char *section_name, const json_t *raw,
                        json_t **out)
{
    const section *s = find_section(section_name);
    if (raw && (!json_is_object(raw) || raw_doc_spec(c->raw, raw)))
        return sch_not_a_table(c, s->name, raw);
    const char *names[64];
    int n = section_names(s, names, 64);
    if (raw)
        K3RT_TRY(schema_check_keys(raw, names, n, s->name, c->err));
    json_t *cfg = json_object();
    for (int i = 0; raw && i < s->n_opts; i++) {
        json_t *v = json_object_get(raw, s->opts[i].name);
        if (v)
            json_object_set(cfg, s->opts[i].name, v);
    }
    int rc = options_apply(s->opts, (uint32_t)s->n_opts, sizeof(k3rt_option), cfg,
                                s->name, c->err);
    if (rc) {
        json_decref(cfg);
        return rc;
    }
    *out = schema_ordered(s->opts, (uint32_t)s->n_opts, sizeof(k3rt_option), cfg);
    return *out ? K3RT_OK : k3rt_fail(c->err, K3RT_ERR_NOMEM, "%s: out of memory", s->name);
}

int sch_spec(schema_ctx *c, const json_t *v, int kind, const char *what, json_t **out)
{
    return schema_spec(c->raw, c->reg, v, kind, what, out, c->pos, c->err);
}

/* A balancer slot: absent or k3.none mean the built-in `none` balancer. */
int sch_balancer(schema_ctx *c, const json_t *v, const char *what, json_t **out)
{
    if (!v || json_is_null(v))
        return schema_default_spec(c->reg, "none", K3RT_KIND_BALANCER, what, out, c->err);
    return sch_spec(c, v, K3RT_KIND_BALANCER, what, out);
}

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
        rc = add(d, "plan", sch_section_scalars(&c, "plan", json_object_get(root, "plan"), &v),
                 &v);
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
        const section *s = find_section(c0);
        return s ? section_names(s, names, max) : SCHEMA_LEAF;
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
