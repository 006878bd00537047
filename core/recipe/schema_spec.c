/* Plugin specs in the schema: resolution by name/kind or path, option validation against the
 * plugin's descriptor, the core-owned optimizer "lr", and the shared key messages. */
#include "recipe/schema.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plugin/named.h"
#include "util/nearest.h"

static const k3rt_option *opt_at(const k3rt_option *opts, uint32_t size, uint32_t i)
{
    return (const k3rt_option *)((const char *)opts + (size_t)i * size);
}

const char *schema_json_kind(const json_t *v)
{
    if (!v)
        return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "a table";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "none";
    }
    return "?";
}

int schema_unknown_key(const char *what, const char *key, const char *const *names, int n,
                       k3rt_error *err)
{
    const char *near = nearest_word(key, names, n);
    if (near)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: unknown key '%s'; did you mean '%s'?",
                         what, key, near);
    char list[512] = "";
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", names[i]);
    return k3rt_fail(err, K3RT_ERR_INVALID, "%s: unknown key '%s' (valid keys: %s)", what, key,
                     n ? list : "none");
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

const plugin_entry *schema_resolve(const registry *reg, const char *name, const char *path,
                                   int kind)
{
    if (path && *path)
        return registry_find_file(reg, path, kind);
    return registry_find(reg, name, kind);
}

int schema_plugin_names(const plugin_entry *e, const char **names, int max)
{
    int n = 0;
    for (uint32_t i = 0; i < e->desc.n_options && n < max; i++)
        names[n++] = opt_at(e->desc.options, e->desc.option_size, i)->name;
    if (e->desc.kind == K3RT_KIND_OPTIMIZER && n < max)
        names[n++] = "lr";
    return n;
}

json_t *schema_ordered(const k3rt_option *opts, uint32_t n, uint32_t size, json_t *cfg)
{
    json_t *out = json_object();
    for (uint32_t i = 0; out && i < n; i++) {
        const k3rt_option *o = opt_at(opts, size, i);
        json_t *v = json_object_get(cfg, o->name);
        if (!v)
            continue;
        if (o->type == K3RT_OPT_FLOAT && json_is_integer(v))
            json_object_set_new(out, o->name, json_real((double)json_integer_value(v)));
        else
            json_object_set(out, o->name, v);
    }
    json_decref(cfg);
    return out;
}

/* The optimizer's learning rate belongs to the core (the schedule scales it); it is taken
 * out of the options before the plugin sees them. */
static int take_lr(const plugin_entry *e, json_t *cfg, const char *label, double *lr,
                   k3rt_error *err)
{
    const char *names[257];
    int n = schema_plugin_names(e, names, 257);
    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v) {
        int known = 0;
        for (int i = 0; i < n && !known; i++)
            known = !strcmp(key, names[i]);
        if (!known)
            return schema_unknown_key(label, key, names, n, err);
    }
    v = json_object_get(cfg, "lr");
    if (!v)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: missing required key 'lr' (the peak "
                         "learning rate, e.g. lr = 3e-3)", label);
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key 'lr' expects a number > 0, got %s%s",
                         label, schema_json_kind(v), json_is_number(v) ? " <= 0" : "");
    *lr = json_number_value(v);
    json_object_del(cfg, "lr");
    return K3RT_OK;
}

/* Validates cfg (taken) for plugin e and builds the document's SPEC. */
static int make_spec(const plugin_entry *e, const char *path, json_t *cfg, const char *what,
                     json_t **out, k3rt_error *err)
{
    char label[256];
    snprintf(label, sizeof label, "%s (%s)", what, e->desc.name);
    double lr = 0;
    int rc = K3RT_OK;
    if (e->desc.kind == K3RT_KIND_OPTIMIZER)
        rc = take_lr(e, cfg, label, &lr, err);
    if (!rc)
        rc = options_apply(e->desc.options, e->desc.n_options, e->desc.option_size, cfg,
                                label, err);
    if (rc) {
        json_decref(cfg);
        return rc;
    }
    cfg = schema_ordered(e->desc.options, e->desc.n_options, e->desc.option_size, cfg);
    json_t *spec = json_object();
    if (!spec || !cfg) {
        json_decref(spec);
        json_decref(cfg);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", label);
    }
    json_object_set_new(spec, "plugin", json_string(e->desc.name));
    json_object_set_new(spec, "kind", json_string(k3rt_kind_name(e->desc.kind)));
    json_object_set_new(spec, "path", path ? json_string(path) : json_null());
    if (e->desc.kind == K3RT_KIND_OPTIMIZER)
        json_object_set_new(spec, "lr", json_real(lr));
    json_object_set_new(spec, "config", cfg);
    *out = spec;
    return K3RT_OK;
}

int schema_spec(const raw_doc *raw, registry *reg, const json_t *v, int kind, const char *what,
                json_t **out, char *pos, k3rt_error *err)
{
    const raw_spec *rs = v ? raw_doc_spec(raw, v) : NULL;
    if (!rs)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: expected a %s plugin spec such as "
                         "k3.NAME{ ... }, got %s", what, k3rt_kind_name(kind),
                         schema_json_kind(v));
    const spec_info *in = &rs->info;
    const plugin_entry *e = schema_resolve(reg, in->name, in->path, kind);
    int rc;
    if (!e) {
        const plugin_entry *other = schema_resolve(reg, in->name, in->path, 0);
        if (other)
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: '%s' is a %s plugin; a %s plugin is "
                           "expected here", what, in->name, k3rt_kind_name(other->desc.kind),
                           k3rt_kind_name(kind));
        else
            rc = registry_not_found(reg, in->name, kind, what, err);
    } else {
        json_t *cfg = json_deep_copy(v);
        rc = cfg ? make_spec(e, in->path[0] ? in->path : NULL, cfg, what, out, err)
                 : k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", what);
    }
    if (rc)
        snprintf(pos, SANDBOX_POS_MAX, "%s", in->pos);
    return rc;
}

int schema_default_spec(registry *reg, const char *name, int kind, const char *what,
                        json_t **out, k3rt_error *err)
{
    const plugin_entry *e = registry_find(reg, name, kind);
    if (!e) {
        char where[256];
        snprintf(where, sizeof where, "%s (default %s{})", what, name);
        return registry_not_found(reg, name, kind, where, err);
    }
    json_t *cfg = json_object();
    if (!cfg)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", what);
    return make_spec(e, NULL, cfg, what, out, err);
}
