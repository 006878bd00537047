/* Hugging Face folder -> k3rt weights and recipe (hf_export.h): every Hub tensor named back
 * through the table (a tensor it does not name is refused by name), split, stacked and
 * reshaped to k3rt's layout, in f32; the recipe states the model (config.json's k3rt block, or
 * its Kimi-Linear fields) and loads the weights through train.init_weights. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "interop/hf_export.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/hf_config.h"
#include "interop/hf_recipe.h"
#include "interop/hf_table.h"
#include "interop/hf_tensors.h"
#include "util/fs.h"

typedef struct im_ctx {
    const hf_options *o;
    hf_table t;
    json_t *model;
    hf_weights w;
    hf_list out;
    hf_list state;       /* module state (the balancers' biases) for train.init_state */
    json_t *filled;      /* stacked expert tensors: k3rt name -> experts copied so far */
    char dir_cfg[1400];
} im_ctx;

/* The Hub tensor as f32 (or f64) data: borrowed when it already is, else a new buffer. */
static int float_data(const st_entry *e, void **owned, const void **data, int *dtype,
                      k3rt_error *err)
{
    *owned = NULL;
    *data = e->data;
    *dtype = e->dtype;
    if (e->dtype == K3RT_F32 || e->dtype == K3RT_F64)
        return K3RT_OK;
    if (!k3rt_dtype_is_float(e->dtype))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "tensor %s is %s; parameters are floats",
                         e->name, k3rt_dtype_name(e->dtype));
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    *owned = malloc((size_t)n * 4 + 1);
    if (!*owned)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    *data = *owned;
    *dtype = K3RT_F32;
    return k3rt_convert(*owned, K3RT_F32, e->data, e->dtype, n, err);
}

/* Adds a tensor taking data: the list owns it when the caller did. */
static int put(im_ctx *c, const char *name, int dtype, int ndim, const int64_t *shape,
               const void *data, void **owned, k3rt_error *err)
{
    if (hf_list_find(&c->out, name) >= 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: two tensors map to %s", c->o->src, name);
    int rc = hf_list_add(&c->out, name, dtype, ndim, shape, data, *owned != NULL, err);
    *owned = NULL;
    return rc;
}

static int split(im_ctx *c, const st_entry *e, const char *prefix, const json_t *rule,
                 const json_t *cfg, int dtype, const void *data, k3rt_error *err)
{
    const json_t *members = json_object_get(rule, "fuse_heads"), *widths =
                                                                      json_object_get(rule, "widths");
    int k = (int)json_array_size(members);
    int64_t H = json_integer_value(json_object_get(cfg, "heads")), w[8], sum = 0;
    if (k < 1 || k > 8 || json_array_size(widths) != (size_t)k)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: the rule for %s needs fuse_heads and "
                         "widths of one length (1 to 8)", c->t.path, e->name);
    for (int p = 0; p < k; p++)
        sum += w[p] = json_integer_value(json_object_get(cfg, json_string_value(
                                                                  json_array_get(widths, p))));
    if (e->ndim != 2 || H < 1 || e->shape[0] != H * sum)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is not [%lld heads x %lld, in] "
                         "as the model's options say", c->o->src, e->name, (long long)H,
                         (long long)sum);
    void *parts[8] = {0};
    size_t es = k3rt_dtype_size(dtype);
    for (int p = 0; p < k; p++)
        if (!(parts[p] = malloc((size_t)(H * w[p] * e->shape[1]) * es + 1))) {
            for (int q = 0; q < p; q++)
                free(parts[q]);
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        }
    hf_split_heads(data, w, k, H, e->shape[1], es, parts);
    int rc = K3RT_OK;
    for (int p = 0; p < k; p++) {
        char name[512];
        int64_t shape[2] = {H * w[p], e->shape[1]};
        snprintf(name, sizeof name, "%s%s", prefix, json_string_value(json_array_get(members,
                                                                                     p)));
        if (!rc)
            rc = put(c, name, dtype, 2, shape, parts[p], &parts[p], err);
        free(parts[p]);
    }
    return rc;
}

static int stack(im_ctx *c, const st_entry *e, const char *name, int j, const json_t *cfg,
                 int dtype, const void *data, k3rt_error *err)
{
    int64_t E = json_integer_value(json_object_get(cfg, "experts"));
    if (e->ndim != 2 || j < 0 || j >= E)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s: expert %d of %lld, shape "
                         "[out, in] expected", c->o->src, e->name, j, (long long)E);
    size_t bytes = (size_t)(e->shape[0] * e->shape[1]) * k3rt_dtype_size(dtype);
    int at = hf_list_find(&c->out, name);
    if (at < 0) {
        int64_t shape[3] = {E, e->shape[0], e->shape[1]};
        void *buf = calloc((size_t)E, bytes + 1);
        if (!buf)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        K3RT_TRY(hf_list_add(&c->out, name, dtype, 3, shape, buf, 1, err));
        at = c->out.n - 1;
    }
    st_entry *s = &c->out.e[at];
    if (s->shape[1] != e->shape[0] || s->shape[2] != e->shape[1] || s->dtype != dtype)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s differs in shape or dtype from "
                         "the other experts of %s", c->o->src, e->name, name);
    memcpy((char *)s->data + (size_t)j * bytes, data, bytes);
    json_object_set_new(c->filled, name, json_integer(json_integer_value(json_object_get(
                                                          c->filled, name)) + 1));
    return K3RT_OK;
}

/* {"view": [dims]}: a Hub tensor of those dims (-1 any) is k3rt's [n]. */
static int unview(im_ctx *c, const st_entry *e, const json_t *view, const char *name, int dtype,
                  const void *data, void **owned, k3rt_error *err)
{
    int64_t n = 1;
    int ok = e->ndim == (int)json_array_size(view);
    for (int d = 0; d < e->ndim; d++) {
        json_int_t want = json_integer_value(json_array_get(view, (size_t)d));
        ok &= want == -1 || want == e->shape[d];
        n *= e->shape[d];
    }
    if (!ok) {
        char *v = json_dumps(view, JSON_ENCODE_ANY);
        int rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is not of shape %s (-1: any)",
                           c->o->src, e->name, v ? v : "?");
        free(v);
        return rc;
    }
    return put(c, name, dtype, 1, &n, data, owned, err);
}

/* A Hub router bias (the FFN entry's "balancer_state") as the layer's balancer state: an
 * all-zero one is what a fresh balancer starts from and is left out. */
static int put_state(im_ctx *c, const st_entry *e, const char *name, int dtype,
                     const void *data, void **owned, k3rt_error *err)
{
    int64_t n = e->ndim == 1 ? e->shape[0] : -1;
    if (n < 1 || dtype != K3RT_F32)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is not a per-expert [experts] "
                         "vector of floats", c->o->src, e->name);
    const float *p = data;
    int zero = 1;
    for (int64_t k = 0; k < n && zero; k++)
        zero = p[k] == 0.0f;
    if (zero)
        return K3RT_OK;
    int rc = hf_list_add(&c->state, name, dtype, 1, &n, data, *owned != NULL, err);
    *owned = NULL;
    return rc;
}

/* The rule of entry whose Hub name (or an alternative) matches rest; *j the expert. *state is
 * set when it is a balancer_state rule (the returned name then is the state's). */
static const char *find_rule(const json_t *entry, const char *rest, const json_t **rule, int *j,
                             int *state)
{
    const char *param;
    const json_t *r;
    *state = 0;
    json_object_foreach(json_object_get(entry, "balancer_state"), param, r) {
        int i;
        const char *name = json_string_value(json_object_get(r, "name"));
        if (name && hf_match(name, rest, &i, j))
            return *state = 1, *rule = r, param;
    }
    json_object_foreach(json_object_get(entry, "params"), param, r) {
        int i;
        if (json_is_string(r) && hf_match(json_string_value(r), rest, &i, j))
            return *rule = r, param;
        const char *name = json_string_value(json_object_get(r, "name"));
        if (name && hf_match(name, rest, &i, j))
            return *rule = r, param;
        const char *key;
        const json_t *alt;
        json_object_foreach(json_object_get(r, "name_if_present"), key, alt)
            if (hf_match(json_string_value(alt), rest, &i, j))
                return *rule = r, param;
    }
    return NULL;
}

static int import_layer_tensor(im_ctx *c, const st_entry *e, int layer, k3rt_error *err)
{
    static const char *const slots[] = {"mixer", "ffn"};
    for (int s = 0; s < 2; s++) {
        const json_t *spec = hf_layer_spec(c->model, layer, slots[s]);
        const json_t *entry = hf_table_plugin(&c->t, json_string_value(json_object_get(spec,
                                                                                     "plugin")));
        char prefix[256], hub[256];
        const char *hp = json_string_value(json_object_get(entry, "prefix"));
        if (!hp)
            continue;
        hf_fill(hub, sizeof hub, hp, layer, 0);
        if (strncmp(e->name, hub, strlen(hub)))
            continue;
        const json_t *rule;
        int j, state;
        const char *param = find_rule(entry, e->name + strlen(hub), &rule, &j, &state);
        if (!param)
            continue;
        snprintf(prefix, sizeof prefix, state ? "layers.%d.balancer." : "layers.%d.%s.", layer,
                 slots[s]);
        void *owned;
        const void *data;
        int dtype;
        K3RT_TRY(float_data(e, &owned, &data, &dtype, err));
        const json_t *cfg = json_object_get(spec, "config");
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix, param);
        int rc;
        if (state)
            rc = put_state(c, e, name, dtype, data, &owned, err);
        else if (json_object_get(rule, "view"))
            rc = unview(c, e, json_object_get(rule, "view"), name, dtype, data, &owned, err);
        else if (json_object_get(rule, "fuse_heads"))
            rc = split(c, e, prefix, rule, cfg, dtype, data, err);
        else if (json_is_true(json_object_get(rule, "split_experts")))
            rc = stack(c, e, name, j, cfg, dtype, data, err);
        else if (json_is_true(json_object_get(rule, "conv1d")))
            rc = e->ndim == 3 && e->shape[1] == 1
                     ? put(c, name, dtype, 2, (int64_t[]){e->shape[0], e->shape[2]}, data,
                           &owned, err)
                     : k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is not [channels, 1, "
                                 "width]", c->o->src, e->name);
        else
            rc = put(c, name, dtype, e->ndim, e->shape, data, &owned, err);
        free(owned);
        return rc;
    }
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: tensor %s maps to no parameter of layer "
                     "%d's modules in %s", c->o->src, e->name, layer, c->t.path);
}

static int import_tensor(im_ctx *c, const st_entry *e, k3rt_error *err)
{
    const char *key;
    const json_t *v;
    int i, j;
    json_object_foreach(json_object_get(json_object_get(c->t.doc, "model"), "params"), key, v)
        if (hf_match(json_string_value(v), e->name, &i, &j)) {
            char name[512];
            void *owned;
            const void *data;
            int dtype;
            K3RT_TRY(float_data(e, &owned, &data, &dtype, err));
            int rc = put(c, hf_fill(name, sizeof name, key, i, 0), dtype, e->ndim, e->shape,
                         data, &owned, err);
            free(owned);
            return rc;
        }
    int layer;
    if (sscanf(e->name, "model.layers.%d.", &layer) == 1)
        return import_layer_tensor(c, e, layer, err);
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: tensor %s has no k3rt name in %s",
                     c->o->src, e->name, c->t.path);
}

static int check_experts(im_ctx *c, k3rt_error *err)
{
    const char *name;
    const json_t *v;
    json_object_foreach(c->filled, name, v) {
        int at = hf_list_find(&c->out, name);
        if (json_integer_value(v) != c->out.e[at].shape[0])
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s: %lld of %lld experts present (each "
                             "expert's tensor once)", c->o->src, name,
                             (long long)json_integer_value(v), (long long)c->out.e[at].shape[0]);
    }
    return K3RT_OK;
}

/* A parameter whose rule is "identity_if_absent" and that the folder left out (Kimi-Linear's
 * MoE has no latent projection) is the identity: exact when the module's width equals d_model
 * (its table "hub" value), refused otherwise. */
static int fill_identities(im_ctx *c, k3rt_error *err)
{
    static const char *const slots[] = {"mixer", "ffn"};
    int layers = (int)json_integer_value(json_object_get(c->model, "layers"));
    int64_t d = json_integer_value(json_object_get(c->model, "d_model"));
    for (int i = 0; i < layers; i++)
        for (int s = 0; s < 2; s++) {
            const json_t *spec = hf_layer_spec(c->model, i, slots[s]);
            const json_t *entry = hf_table_plugin(&c->t, json_string_value(json_object_get(
                                                              spec, "plugin")));
            const char *param;
            const json_t *rule;
            json_object_foreach((json_t *)json_object_get(entry, "params"), param, rule) {
                if (!json_is_true(json_object_get(rule, "identity_if_absent")))
                    continue;
                char name[512];
                snprintf(name, sizeof name, "layers.%d.%s.%s", i, slots[s], param);
                if (hf_list_find(&c->out, name) >= 0)
                    continue;
                json_int_t w = json_integer_value(json_object_get(json_object_get(spec,
                                                                                  "config"),
                                                                  "latent"));
                if (w != d || d < 1)
                    return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: has no %s (k3rt's %s), which "
                                     "only an identity can stand for when the module's latent "
                                     "(%lld) is d_model (%lld)", c->o->src,
                                     json_string_value(json_object_get(rule, "name")), name,
                                     (long long)w, (long long)d);
                float *eye = calloc((size_t)(d * d), sizeof *eye);
                if (!eye)
                    return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
                for (int64_t k = 0; k < d; k++)
                    eye[k * d + k] = 1.0f;
                K3RT_TRY(hf_list_add(&c->out, name, K3RT_F32, 2, (int64_t[]){d, d}, eye, 1, err));
            }
        }
    return K3RT_OK;
}

static int run_import(im_ctx *c, k3rt_error *err)
{
    json_error_t je;
    fs_join(c->dir_cfg, sizeof c->dir_cfg, c->o->src, "config.json");
    json_t *cfg = json_load_file(c->dir_cfg, 0, &je);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s", c->dir_cfg,
                         cfg ? "not a JSON object" : je.text);
    }
    int rc = hf_model_from_config(&c->t, cfg, c->dir_cfg, &c->model, err);
    if (!rc)
        rc = hf_read_weights(c->o->src, &c->w, err);
    for (int i = 0; !rc && i < c->w.all.n; i++)
        rc = import_tensor(c, &c->w.all.e[i], err);
    if (!rc)
        rc = check_experts(c, err);
    if (!rc)
        rc = fill_identities(c, err);
    char weights[PATH_MAX + 32], abs[PATH_MAX], state[PATH_MAX + 32];
    if (!rc)
        rc = fs_mkdirs(c->o->out, err);
    /* absolute, so that the recipe works from any working directory */
    if (!rc && !realpath(c->o->out, abs))
        rc = k3rt_fail(err, K3RT_ERR_IO, "%s: cannot resolve the path", c->o->out);
    fs_join(weights, sizeof weights, rc ? c->o->out : abs, "model.safetensors");
    json_t *meta = json_pack("{s:s, s:s}", "format", "k3rt", "imported_from", c->o->src);
    if (!rc)
        rc = st_write(weights, c->out.e, c->out.n, meta, err);
    fs_join(state, sizeof state, rc ? c->o->out : abs, "state.safetensors");
    if (!rc && c->state.n)
        rc = st_write(state, c->state.e, c->state.n, meta, err);
    json_decref(meta);
    if (!rc)
        rc = hf_write_recipe(c->o->recipe_out, c->model, hf_get_path(cfg, "k3rt"), weights,
                             c->state.n ? state : NULL, c->o->src, err);
    json_decref(cfg);
    if (!rc)
        printf("wrote %s (%d tensors)%s%s and %s\n", weights, c->out.n,
               c->state.n ? ", " : "", c->state.n ? state : "", c->o->recipe_out);
    return rc;
}

int hf_import(const hf_options *o, k3rt_error *err)
{
    im_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.filled = json_object();
    registry reg;
    memset(&reg, 0, sizeof reg);
    int rc = registry_init(&reg, o->plugin_path, err);
    if (!rc)
        rc = hf_table_open(&c.t, o->names, &reg, err);
    if (!rc)
        rc = run_import(&c, err);
    hf_list_free(&c.out);
    hf_list_free(&c.state);
    hf_close_weights(&c.w);
    json_decref(c.model);
    json_decref(c.filled);
    hf_table_close(&c.t);
    registry_free(&reg);
    return rc;
}
