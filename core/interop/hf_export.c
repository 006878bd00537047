/* k3rt checkpoint -> Hugging Face folder (hf_export.h): every parameter renamed and laid out by
 * the table; config.json in KimiLinearConfig's fields, with the k3rt model document under
 * "k3rt" so that `k3rt import` restores exactly the options the Hub fields cannot hold. */
#include "interop/hf_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/hf_config.h"
#include "interop/hf_table.h"
#include "interop/hf_tensors.h"
#include "train/ckpt_dir.h"
#include "util/fs.h"

typedef struct ex_ctx {
    const hf_options *o;
    hf_table t;
    const json_t *model;   /* the checkpoint's validated model document */
    json_t *doc;           /* the whole validated recipe document */
    st_file *f;
    char file[1300];
    hf_list out;
    st_file *state;        /* the checkpoint's state.safetensors (the balancers' biases) */
    json_t *differs;       /* what the tensors show that the config cannot (non-identity) */
} ex_ctx;

/* Adds one Hub tensor, converted to the export dtype (borrowed when it already is, and kept
 * f32 where the rule says the Hub checkpoint keeps it so: A_log, dt_bias, the router bias). */
static int emit_as(ex_ctx *c, const char *name, int dtype, int ndim, const int64_t *shape,
                   const void *data, int own, int keep_f32, k3rt_error *err)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    if (dtype == c->o->dtype || !k3rt_dtype_is_float(dtype) || (keep_f32 && dtype == K3RT_F32))
        return hf_list_add(&c->out, name, dtype, ndim, shape, data, own, err);
    void *conv = malloc((size_t)n * k3rt_dtype_size(c->o->dtype) + 1);
    int rc = conv ? k3rt_convert(conv, c->o->dtype, data, dtype, n, err)
                  : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (own)
        free((void *)data);
    if (rc) {
        free(conv);
        return rc;
    }
    return hf_list_add(&c->out, name, c->o->dtype, ndim, shape, conv, 1, err);
}

static int emit(ex_ctx *c, const char *name, int dtype, int ndim, const int64_t *shape,
                const void *data, int own, k3rt_error *err)
{
    return emit_as(c, name, dtype, ndim, shape, data, own, 0, err);
}

/* Whether e is a square identity matrix (f32: what an import of a Hub MoE sets). */
static int is_identity(const st_entry *e)
{
    if (e->ndim != 2 || e->shape[0] != e->shape[1] || e->dtype != K3RT_F32)
        return 0;
    const float *p = e->data;
    for (int64_t r = 0; r < e->shape[0]; r++)
        for (int64_t k = 0; k < e->shape[1]; k++)
            if (p[r * e->shape[1] + k] != (r == k ? 1.0f : 0.0f))
                return 0;
    return 1;
}

/* {"view": [dims]}: the Hub shape of a k3rt tensor of the same elements, one dim -1. */
static int view_shape(ex_ctx *c, const st_entry *e, const json_t *view, int64_t *shape,
                      int *ndim, k3rt_error *err)
{
    int64_t n = 1, known = 1;
    int free_at = -1;
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    *ndim = (int)json_array_size(view);
    for (int d = 0; d < *ndim && d < 8; d++) {
        shape[d] = json_integer_value(json_array_get(view, (size_t)d));
        if (shape[d] == -1 && free_at < 0)
            free_at = d;
        else
            known *= shape[d];
    }
    if (*ndim < 1 || *ndim > 8 || known < 1 || (free_at < 0 ? known != n : n % known))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: the \"view\" of %s does not hold its %lld "
                         "elements", c->t.path, e->name, (long long)n);
    if (free_at >= 0)
        shape[free_at] = n / known;
    return K3RT_OK;
}

/* A per-head fusion: the rule's listed siblings (in the module `prefix`) interleaved. */
static int fuse(ex_ctx *c, const char *prefix, const json_t *rule, const json_t *cfg,
                const char *hub, k3rt_error *err)
{
    const json_t *members = json_object_get(rule, "fuse_heads");
    const json_t *widths = json_object_get(rule, "widths");
    int k = (int)json_array_size(members);
    const void *parts[8];
    int64_t w[8], H = json_integer_value(json_object_get(cfg, "heads")), rows = 0, cols = -1;
    int dtype = -1;
    if (k < 1 || k > 8 || json_array_size(widths) != (size_t)k || H < 1)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: the rule of %s needs fuse_heads and widths "
                         "of one length (1 to 8) and a module with heads", c->t.path, hub);
    for (int p = 0; p < k; p++) {
        char full[512];
        snprintf(full, sizeof full, "%s%s", prefix, json_string_value(json_array_get(members, p)));
        const st_entry *e = st_find(c->f, full);
        w[p] = json_integer_value(json_object_get(cfg, json_string_value(json_array_get(widths,
                                                                                        p))));
        if (!e)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: has no %s, which %s fuses into %s",
                             c->file, full, c->t.path, hub);
        if (e->ndim != 2 || e->shape[0] != H * w[p] || (cols >= 0 && e->shape[1] != cols) ||
            (dtype >= 0 && e->dtype != dtype))
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s is not [%lld x %lld, in] like the "
                             "other parts of %s", c->file, full, (long long)H, (long long)w[p],
                             hub);
        parts[p] = e->data;
        cols = e->shape[1];
        dtype = e->dtype;
        rows += e->shape[0];
    }
    size_t es = k3rt_dtype_size(dtype);
    void *out = malloc((size_t)(rows * cols) * es + 1);
    if (!out)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    hf_fuse_heads(parts, w, k, H, cols, es, out);
    int64_t shape[2] = {rows, cols};
    return emit(c, hub, dtype, 2, shape, out, 1, err);
}

/* The Hub name of a rule, which may depend on a sibling's presence. */
static const char *rule_name(ex_ctx *c, const char *prefix, const json_t *rule)
{
    if (json_is_string(rule))
        return json_string_value(rule);
    const char *key;
    const json_t *alt;
    json_object_foreach((json_t *)json_object_get(rule, "name_if_present"), key, alt) {
        char full[512];
        snprintf(full, sizeof full, "%s%s", prefix, key);
        if (st_find(c->f, full))
            return json_string_value(alt);
    }
    return json_string_value(json_object_get(rule, "name"));
}

static int apply_rule(ex_ctx *c, const st_entry *e, const char *prefix, const json_t *rule,
                      const char *hub_prefix, const json_t *cfg, int layer, k3rt_error *err)
{
    if (json_object_get(rule, "fused_into"))
        return K3RT_OK; /* written with the parameter it is fused into */
    char tmpl[512], hub[512];
    const char *name = rule_name(c, prefix, rule);
    if (!name)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: the rule of %s has no \"name\"", c->t.path,
                         e->name);
    snprintf(tmpl, sizeof tmpl, "%s%s", hub_prefix, name);
    if (json_is_true(json_object_get(rule, "identity_if_absent"))) {
        /* Kimi-Linear's experts work at full width: an identity latent projection is its MoE
         * exactly and is left out; any other makes the folder a K3 one */
        if (is_identity(e))
            return K3RT_OK;
        char d[256];
        snprintf(d, sizeof d, "%s is not the identity (Kimi-Linear has no %s)", e->name, name);
        json_array_append_new(c->differs, json_string(d));
    }
    int keep = json_is_true(json_object_get(rule, "keep_f32"));
    const json_t *view = json_object_get(rule, "view");
    if (view) {
        int64_t shape[8];
        int nd;
        K3RT_TRY(view_shape(c, e, view, shape, &nd, err));
        return emit_as(c, hf_fill(hub, sizeof hub, tmpl, layer, 0), e->dtype, nd, shape,
                       e->data, 0, keep, err);
    }
    if (json_object_get(rule, "fuse_heads"))
        return fuse(c, prefix, rule, cfg, hf_fill(hub, sizeof hub, tmpl, layer, 0), err);
    if (json_is_true(json_object_get(rule, "conv1d"))) {
        if (e->ndim != 2)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s is not [channels, width]", c->file,
                             e->name);
        int64_t shape[3] = {e->shape[0], 1, e->shape[1]};
        return emit(c, hf_fill(hub, sizeof hub, tmpl, layer, 0), e->dtype, 3, shape, e->data, 0,
                    err);
    }
    if (json_is_true(json_object_get(rule, "split_experts"))) {
        if (e->ndim != 3)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s is not [experts, out, in]", c->file,
                             e->name);
        size_t bytes = (size_t)(e->shape[1] * e->shape[2]) * k3rt_dtype_size(e->dtype);
        for (int64_t j = 0; j < e->shape[0]; j++)
            K3RT_TRY(emit(c, hf_fill(hub, sizeof hub, tmpl, layer, (int)j), e->dtype, 2,
                          e->shape + 1, (const char *)e->data + (size_t)j * bytes, 0, err));
        return K3RT_OK;
    }
    return emit_as(c, hf_fill(hub, sizeof hub, tmpl, layer, 0), e->dtype, e->ndim, e->shape,
                   e->data, 0, keep, err);
}

static int refuse(ex_ctx *c, const char *name, const char *why, k3rt_error *err)
{
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: parameter %s has no Hugging Face name: "
                     "%s (%s)", c->file, name, why, c->t.path);
}

static int export_tensor(ex_ctx *c, const st_entry *e, k3rt_error *err)
{
    const char *key;
    const json_t *v;
    int i, j;
    json_object_foreach(json_object_get(json_object_get(c->t.doc, "model"), "params"), key, v)
        if (hf_match(key, e->name, &i, &j)) {
            char hub[512];
            return emit(c, hf_fill(hub, sizeof hub, json_string_value(v), i, 0), e->dtype,
                        e->ndim, e->shape, e->data, 0, err);
        }
    char slot[16];
    int at = 0;
    if (sscanf(e->name, "layers.%d.%15[a-z_].%n", &i, slot, &at) != 2 || !at)
        return refuse(c, e->name, "only layers.{i}.mixer.*, layers.{i}.ffn.* and the names of "
                      "the table's \"model\" section map", err);
    const json_t *spec = hf_layer_spec(c->model, i, slot);
    const char *plugin = json_string_value(json_object_get(spec, "plugin"));
    const json_t *entry = hf_table_plugin(&c->t, plugin);
    if (!entry) {
        char why[256];
        snprintf(why, sizeof why, "the %s plugin%s%s has no entry in the table", slot,
                 plugin ? " " : "", plugin ? plugin : "");
        return refuse(c, e->name, why, err);
    }
    const json_t *rule = json_object_get(json_object_get(entry, "params"), e->name + at);
    if (!rule) {
        char why[256];
        snprintf(why, sizeof why, "the table lists no %s for plugin %s", e->name + at, plugin);
        return refuse(c, e->name, why, err);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%.*s", at, e->name);
    const char *hub_prefix = json_string_value(json_object_get(entry, "prefix"));
    if (!hub_prefix)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: plugin %s has no \"prefix\" string",
                         c->t.path, plugin);
    return apply_rule(c, e, prefix, rule, hub_prefix, json_object_get(spec, "config"), i, err);
}

/* The balancers' per-expert selection bias as the Hub router's e_score_correction_bias (the
 * FFN entry's "balancer_state": state name -> rule): every routed layer gets one, zeros where
 * the balancer keeps none (none, aux_loss), since a Hub loader leaves a missing one
 * uninitialised. */
static int export_balancer_state(ex_ctx *c, const char *dir, k3rt_error *err)
{
    char path[1300];
    st_file *s = NULL;
    fs_join(path, sizeof path, dir, "state.safetensors");
    if (fs_exists(path))
        K3RT_TRY(st_open(path, &s, err));
    int rc = K3RT_OK;
    int layers = (int)json_integer_value(json_object_get(c->model, "layers"));
    for (int i = 0; i < layers && !rc; i++) {
        const json_t *spec = hf_layer_spec(c->model, i, "ffn");
        const json_t *entry = hf_table_plugin(&c->t, json_string_value(json_object_get(spec,
                                                                                     "plugin")));
        int64_t E = json_integer_value(json_object_get(json_object_get(spec, "config"),
                                                       "experts"));
        const char *hp = json_string_value(json_object_get(entry, "prefix"));
        const char *key;
        const json_t *rule;
        json_object_foreach((json_t *)json_object_get(entry, "balancer_state"), key, rule) {
            char own[160], tmpl[512], hub[512];
            snprintf(own, sizeof own, "layers.%d.balancer.%s", i, key);
            snprintf(tmpl, sizeof tmpl, "%s%s", hp ? hp : "",
                     json_string_value(json_object_get(rule, "name")));
            hf_fill(hub, sizeof hub, tmpl, i, 0);
            const st_entry *e = s ? st_find(s, own) : NULL;
            if (e && (e->ndim != 1 || e->shape[0] != E || e->dtype != K3RT_F32)) {
                rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s is not [%lld] f32, the per-expert "
                               "bias %s holds", path, own, (long long)E, hub);
                break;
            }
            float *zero = e ? NULL : calloc((size_t)(E > 0 ? E : 1), sizeof *zero);
            if (!e && !zero) {
                rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
                break;
            }
            rc = emit_as(c, hub, K3RT_F32, 1, &E, e ? e->data : zero, !e,
                         json_is_true(json_object_get(rule, "keep_f32")), err);
            if (rc)
                break;
        }
    }
    if (s && !rc) {
        /* the state file stays open: the list borrows its data until it is written */
        c->state = s;
        return K3RT_OK;
    }
    if (s)
        st_close(s);
    return rc;
}

static int write_config(ex_ctx *c, k3rt_error *err)
{
    json_t *cfg;
    K3RT_TRY(hf_config_from_model(&c->t, c->model, c->o->dtype, c->differs, &cfg, err));
    /* the run's batch geometry and data, so that an import can evaluate it the same way */
    json_t *k3 = json_object_get(cfg, "k3rt");
    const json_t *plan = json_object_get(c->doc, "plan");
    json_object_set_new(k3, "plan", json_pack("{s:O, s:O}", "micro_batch",
                                              json_object_get(plan, "micro_batch"), "seq_len",
                                              json_object_get(plan, "seq_len")));
    json_object_set(k3, "data", json_object_get(c->doc, "data"));
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(cfg);
    if (!text)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    char path[1400];
    int rc = fs_write_atomic(fs_join(path, sizeof path, c->o->out, "config.json"), text,
                             strlen(text), err);
    free(text);
    return rc;
}

static int run_export(ex_ctx *c, k3rt_error *err)
{
    char dir[1200];
    K3RT_TRY(ckpt_resolve(c->o->src, dir, sizeof dir, err));
    json_t *man;
    K3RT_TRY(ckpt_read_manifest(dir, &man, err));
    c->doc = json_deep_copy(json_object_get(man, "config"));
    json_decref(man);
    c->model = json_object_get(c->doc, "model");
    if (!json_is_object(c->model))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: no config.model", dir);
    K3RT_TRY(st_open(fs_join(c->file, sizeof c->file, dir, "model.safetensors"), &c->f, err));
    for (int i = 0; i < st_count(c->f); i++)
        K3RT_TRY(export_tensor(c, st_at(c->f, i), err));
    K3RT_TRY(export_balancer_state(c, dir, err));
    K3RT_TRY(fs_mkdirs(c->o->out, err));
    int shards;
    K3RT_TRY(hf_write_weights(c->o->out, &c->out, c->o->shard_bytes, &shards, err));
    K3RT_TRY(write_config(c, err));
    printf("wrote %s: %d tensors in %d file%s, config.json\n", c->o->out, c->out.n, shards,
           shards > 1 ? "s (model.safetensors.index.json)" : "");
    return K3RT_OK;
}

int hf_export(const hf_options *o, k3rt_error *err)
{
    ex_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.differs = json_array();
    registry reg;
    memset(&reg, 0, sizeof reg);
    int rc = registry_init(&reg, o->plugin_path, err);
    if (!rc)
        rc = hf_table_open(&c.t, o->names, &reg, err);
    if (!rc)
        rc = run_export(&c, err);
    hf_list_free(&c.out);
    if (c.f)
        st_close(c.f);
    if (c.state)
        st_close(c.state);
    json_decref(c.differs);
    json_decref(c.doc);
    hf_table_close(&c.t);
    registry_free(&reg);
    return rc;
}
