/* The core sections of a recipe as k3rt_option tables (model scalars, plan, train, data,
 * sample) and the validation every section and spec slot shares (schema_section.h). */
#include "recipe/schema_section.h"

#include "recipe/act_keys.h"

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
    {"comm", K3RT_OPT_STRING, 0, "\"auto\"", K3RT_RANGE_ANY, "auto|local|mpi|tcp|nccl",
     "how ranks talk: auto = threads of one process (local), or one process per rank when a "
     "launcher started several (mpi under mpirun, else tcp)"},
    {"pp", K3RT_OPT_INT, 0, "1", 1, 4096, NULL,
     "pipeline stages, 1F1B (`k3rt plan` only: training has no pipeline execution yet)"},
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
    {"shard_gradients", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "gradients reduce-scattered to their shard too (ZeRO-2; `k3rt plan` only: training does "
     "not shard gradients yet)"},
};

static const char *const PLAN_KEYS[] = {"activations", "memory_budget"};

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
    {"eval_at_start", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "also evaluate the initial weights (step 0) of a fresh run"},
    {"checkpoint_interval", K3RT_OPT_INT, 0, "500", 0, BIG, NULL,
     "steps between checkpoints (0 = none)"},
    {"keep_checkpoints", K3RT_OPT_INT, 0, "2", 0, 1e6, NULL, "newest kept (0 = all)"},
    {"max_bad_steps", K3RT_OPT_INT, 0, "5", 0, 1e6, NULL,
     "consecutive non-finite steps skipped before failing"},
    {"init_weights", K3RT_OPT_STRING, K3RT_OPT_NULLABLE, "null", K3RT_RANGE_ANY, NULL,
     "safetensors file of k3rt-named parameters loaded over the initialisation of a fresh run "
     "(fine-tuning; written by k3rt import); relative to the working directory"},
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
    {"packed_documents", K3RT_OPT_BOOL, 0, "false", K3RT_RANGE_ANY, NULL,
     "shards: train and evaluate with the shards' .docs boundaries, so token mixers restart "
     "at each document (KDA: set max_documents to the most documents of a micro-batch)"},
};

static const k3rt_option SAMPLE_OPTS[] = {
    {"bytes", K3RT_OPT_INT, 0, "500", 0, 1e9, NULL, "tokens to generate"},
    {"temperature", K3RT_OPT_FLOAT, 0, "0.8", 0, 100, NULL, "0 = greedy"},
    {"top_k", K3RT_OPT_INT, 0, "0", 0, 1e9, NULL, "0 = no top-k cut"},
    {"prompt", K3RT_OPT_STRING, 0, "\"\\n\"", K3RT_RANGE_ANY, NULL, "text to continue"},
    {"seed", K3RT_OPT_INT, 0, "1", 0, BIG, NULL, "sampling seed"},
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
    {"plan", PLAN_OPTS, COUNT(PLAN_OPTS), PLAN_KEYS, COUNT(PLAN_KEYS)},
    {"train", TRAIN_OPTS, COUNT(TRAIN_OPTS), TRAIN_LISTS, COUNT(TRAIN_LISTS)},
    {"data", DATA_OPTS, COUNT(DATA_OPTS), NULL, 0},
    {"sample", SAMPLE_OPTS, COUNT(SAMPLE_OPTS), NULL, 0},
};

static int section_names(const section *s, const char **names, int max)
{
    int n = 0;
    for (int i = 0; i < s->n_opts && n < max; i++)
        names[n++] = s->opts[i].name;
    for (int i = 0; i < s->n_structured && n < max; i++)
        names[n++] = s->structured[i];
    return n;
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

int sch_section_names(const char *name, const char **names, int max)
{
    const section *s = find_section(name);
    return s ? section_names(s, names, max) : -1;
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

/* plan.activations: {class pattern = policy}. Whether a pattern matches a class of this model
 * is checked when the model is built (model/actman.c), where the classes are known. */
static int plan_activations(schema_ctx *c, const json_t *v, json_t *out)
{
    if (!v)
        return K3RT_OK;
    if (!json_is_object(v) || raw_doc_spec(c->raw, v))
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "plan.activations: expected a table of "
                         "tensor-class patterns to policies, e.g. activations = { "
                         "[\"mixer.K.*\"] = \"recompute\", [\"ffn.*\"] = \"offload\" }; got %s",
                         schema_json_kind(v));
    const char *key;
    json_t *pol;
    json_object_foreach((json_t *)v, key, pol) {
        if (!act_glob_valid(key))
            return k3rt_fail(c->err, K3RT_ERR_INVALID, "plan.activations: \"%s\" is not a class "
                             "pattern (letters, digits, '_', '.', '*' and '?', e.g. "
                             "\"mixer.K.*\")", key);
        if (!json_is_string(pol) || act_policy_parse(json_string_value(pol)) < 0)
            return k3rt_fail(c->err, K3RT_ERR_INVALID, "plan.activations[\"%s\"]: expected one "
                             "of %s, got %s%s%s", key, ACT_POLICY_LIST,
                             json_is_string(pol) ? "\"" : "",
                             json_is_string(pol) ? json_string_value(pol) : schema_json_kind(pol),
                             json_is_string(pol) ? "\"" : "");
    }
    json_object_set(out, "activations", (json_t *)v);
    return K3RT_OK;
}

/* plan.memory_budget: bytes, "60%" of the device's memory, or a size with a unit. */
static int plan_budget(schema_ctx *c, const json_t *v, json_t *out)
{
    double bytes, fraction;
    if (!v)
        return K3RT_OK;
    int ok = json_is_number(v) ? json_number_value(v) >= 1 && json_number_value(v) < 1e18
                               : json_is_string(v) &&
                                     !act_budget_parse(json_string_value(v), &bytes, &fraction);
    if (!ok)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "plan.memory_budget: expected bytes per "
                         "GPU (a number >= 1), a share of the device's memory (\"60%%\", at most "
                         "\"100%%\") or a size with a unit (\"96GB\", \"96GiB\", \"512MB\"); got "
                         "%s%s%s", json_is_string(v) ? "\"" : "",
                         json_is_string(v) ? json_string_value(v) : schema_json_kind(v),
                         json_is_string(v) ? "\"" : "");
    json_object_set(out, "memory_budget", (json_t *)v);
    return K3RT_OK;
}

int sch_plan(schema_ctx *c, const json_t *raw, json_t **out)
{
    K3RT_TRY(sch_section_scalars(c, "plan", raw, out));
    int rc = plan_activations(c, raw ? json_object_get(raw, "activations") : NULL, *out);
    if (!rc)
        rc = plan_budget(c, raw ? json_object_get(raw, "memory_budget") : NULL, *out);
    if (rc)
        json_decref(*out);
    return rc;
}
