/* Validated documents checked again (doc_check.h): the document is turned back into the raw
 * tree a recipe converts to (each SPEC becomes its options, remembered as a spec), run through
 * schema_build, and the result must equal the document. */
#include "recipe/doc_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/named.h"
#include "recipe/schema.h"
#include "util/json_diff.h"

typedef struct unwrap_ctx {
    raw_doc *raw;
    const registry *reg;
    k3rt_error *err;
} unwrap_ctx;

static int is_spec(const json_t *v)
{
    return json_is_object(v) && json_is_string(json_object_get(v, "plugin")) &&
           json_is_object(json_object_get(v, "config"));
}

static int remember(unwrap_ctx *c, const json_t *obj, const char *name, const char *path,
                    const char *at)
{
    raw_doc *d = c->raw;
    if (d->n_specs == d->cap_specs) {
        int cap = d->cap_specs ? 2 * d->cap_specs : 16;
        raw_spec *p = realloc(d->specs, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(c->err, K3RT_ERR_NOMEM, "%s: out of memory", at);
        d->specs = p;
        d->cap_specs = cap;
    }
    raw_spec *s = &d->specs[d->n_specs++];
    memset(s, 0, sizeof *s);
    s->obj = obj;
    snprintf(s->info.name, sizeof s->info.name, "%s", name);
    snprintf(s->info.path, sizeof s->info.path, "%s", path ? path : "");
    snprintf(s->info.pos, sizeof s->info.pos, "%s:", at);
    return K3RT_OK;
}

/* A SPEC back to its options (plus an optimizer's "lr"). A plugin named by its file must be
 * one this command already loaded: nothing here loads code. */
static int unwrap_spec(unwrap_ctx *c, const json_t *v, const char *at, json_t **out)
{
    const char *name = json_string_value(json_object_get(v, "plugin"));
    const json_t *path = json_object_get(v, "path");
    if (path && !json_is_null(path) && !json_is_string(path))
        return k3rt_fail(c->err, K3RT_ERR_FORMAT, "%s: \"path\" must be a string or null", at);
    const char *file = json_string_value(path);
    if (file && !registry_find_file(c->reg, file, 0))
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "%s: plugin '%s' is named by its file %s; "
                         "a checkpoint never loads code: name that file on the command line "
                         "(--plugin %s) or in the recipe (k3.plugin) if you trust it", at,
                         name, file, file);
    json_t *opts = json_deep_copy(json_object_get(v, "config"));
    const json_t *lr = json_object_get(v, "lr");
    if (opts && lr)
        json_object_set(opts, "lr", (json_t *)lr);
    if (!opts)
        return k3rt_fail(c->err, K3RT_ERR_NOMEM, "%s: out of memory", at);
    *out = opts;
    return remember(c, opts, name, file, at);
}

static int unwrap(unwrap_ctx *c, const json_t *v, const char *at, json_t **out)
{
    if (is_spec(v))
        return unwrap_spec(c, v, at, out);
    if (!json_is_object(v) && !json_is_array(v)) {
        *out = json_incref((json_t *)v);
        return K3RT_OK;
    }
    json_t *copy = json_is_object(v) ? json_object() : json_array();
    if (!copy)
        return k3rt_fail(c->err, K3RT_ERR_NOMEM, "%s: out of memory", at);
    const char *key;
    json_t *item;
    size_t i;
    int rc = K3RT_OK;
    char sub[256];
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, item) {
            json_t *u = NULL;
            snprintf(sub, sizeof sub, "%s%s%s", at, *at ? "." : "", key);
            if ((rc = unwrap(c, item, sub, &u)) != K3RT_OK)
                break;
            json_object_set_new(copy, key, u);
        }
    } else {
        json_array_foreach(v, i, item) {
            json_t *u = NULL;
            snprintf(sub, sizeof sub, "%s[%zu]", at, i + 1);
            if ((rc = unwrap(c, item, sub, &u)) != K3RT_OK)
                break;
            json_array_append_new(copy, u);
        }
    }
    if (rc) {
        json_decref(copy);
        return rc;
    }
    *out = copy;
    return K3RT_OK;
}

/* A value the schema refuses makes the document malformed (FORMAT); a plugin it cannot find
 * stays NOT_FOUND. */
static int malformed(int rc, k3rt_error *err)
{
    if (rc == K3RT_ERR_INVALID && err)
        err->code = rc = K3RT_ERR_FORMAT;
    return rc;
}

/* The schema's result must be the document itself, defaults aside. */
static int same(const json_t *doc, const json_t *rebuilt, const char *what, k3rt_error *err)
{
    char where[256];
    if (!json_first_conflict(doc, rebuilt, what, where, sizeof where))
        return K3RT_OK;
    return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: differs from what the recipe schema makes of "
                     "it (edited by hand, or written by another k3rt version)", where);
}

int doc_check_config(const json_t *doc, registry *reg, json_t **out, k3rt_error *err)
{
    *out = NULL;
    if (!json_is_object(doc))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "config: expected an object (the validated "
                         "recipe), got %s", schema_json_kind(doc));
    raw_doc raw = {0};
    unwrap_ctx c = {&raw, reg, err};
    json_t *root = NULL, *rebuilt = NULL;
    int rc = unwrap(&c, doc, "", &root);
    raw.root = root;
    const json_t *on_step = root ? json_object_get(root, "has_on_step") : NULL;
    if (!rc && !json_is_boolean(on_step))
        rc = k3rt_fail(err, K3RT_ERR_FORMAT, "has_on_step: expected true or false, got %s",
                       schema_json_kind(on_step));
    if (!rc) {
        raw.has_on_step = json_is_true(on_step);
        json_object_del(root, "has_on_step");
        char pos[SANDBOX_POS_MAX]; /* the keys are in the messages already */
        rc = malformed(schema_build(&raw, reg, "manifest", &rebuilt, pos, err), err);
    }
    if (!rc)
        rc = same(doc, rebuilt, "config", err);
    if (!rc)
        *out = json_incref(rebuilt);
    json_decref(rebuilt);
    raw_doc_free(&raw);
    return rc;
}

int doc_check_spec(const json_t *spec, int kind, registry *reg, const char *what, json_t **out,
                   k3rt_error *err)
{
    *out = NULL;
    if (!is_spec(spec))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: expected a plugin spec {plugin, kind, "
                         "path, config}, got %s", what, schema_json_kind(spec));
    raw_doc raw = {0};
    unwrap_ctx c = {&raw, reg, err};
    json_t *opts = NULL, *rebuilt = NULL;
    int rc = unwrap_spec(&c, spec, what, &opts);
    raw.root = opts;
    char pos[SANDBOX_POS_MAX];
    if (!rc)
        rc = malformed(schema_spec(&raw, reg, opts, kind, what, &rebuilt, pos, err), err);
    if (!rc)
        rc = same(spec, rebuilt, what, err);
    if (!rc)
        *out = json_incref(rebuilt);
    json_decref(rebuilt);
    raw_doc_free(&raw);
    return rc;
}
