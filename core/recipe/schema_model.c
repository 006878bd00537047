/* The model section: scalars, the mixers and their layer pattern, FFNs, balancer, residual. */
#include "recipe/schema_model.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void letters(const json_t *mixers, const char *sep, char *buf, size_t len)
{
    const char *key;
    json_t *v;
    size_t at = 0;
    buf[0] = '\0';
    json_object_foreach((json_t *)mixers, key, v) {
        if (at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? sep : "", key);
    }
}

static int build_mixers(schema_ctx *c, const json_t *raw, json_t **out)
{
    if (!raw)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model: missing required key 'mixers' "
                         "(token mixers by letter, e.g. mixers = { M = k3.mla{...} })");
    const raw_spec *rs = raw_doc_spec(c->raw, raw);
    if (rs)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.mixers: expected a table of "
                         "letter = spec, e.g. mixers = { M = k3.%s{...} }, got a plugin spec",
                         rs->info.name);
    if (!json_is_object(raw))
        return sch_not_a_table(c, "model.mixers", raw);
    if (!json_object_size(raw))
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.mixers: is empty; give at least one "
                         "mixer, e.g. mixers = { M = k3.mla{...} }");
    json_t *m = json_object();
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)raw, key, v) {
        if (strlen(key) != 1 || !isalnum((unsigned char)key[0])) {
            json_decref(m);
            return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.mixers: key '%s' must be a "
                             "single letter or digit (model.pattern spells the layers with "
                             "these letters)", key);
        }
        char what[32];
        snprintf(what, sizeof what, "model.mixers.%s", key);
        json_t *spec;
        int rc = sch_spec(c, v, K3RT_KIND_ATTENTION, what, &spec);
        if (rc) {
            json_decref(m);
            return rc;
        }
        json_object_set_new(m, key, spec);
    }
    *out = m;
    return K3RT_OK;
}

static int check_pattern(schema_ctx *c, const char *p, const json_t *mixers, json_int_t layers)
{
    size_t n = strlen(p);
    if (n == 0)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.pattern: is empty");
    if ((json_int_t)n > layers || layers % (json_int_t)n)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.pattern: has %zu letters, which %s "
                         "model.layers (%lld); give %lld letters, or a shorter pattern whose "
                         "length divides %lld (it is repeated)", n,
                         (json_int_t)n > layers ? "is more than" : "does not divide",
                         (long long)layers, (long long)layers, (long long)layers);
    for (size_t i = 0; i < n; i++) {
        char k[2] = {p[i], '\0'};
        if (!json_object_get(mixers, k)) {
            char have[256];
            letters(mixers, ", ", have, sizeof have);
            return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.pattern: letter '%c' (position "
                             "%zu) has no entry in model.mixers (entries: %s)", p[i], i + 1,
                             have);
        }
    }
    return K3RT_OK;
}

/* model.pattern expanded to exactly `layers` letters; every mixer must be used. */
static int expand_pattern(schema_ctx *c, const json_t *pattern, const json_t *mixers,
                          json_int_t layers, json_t **out)
{
    const char *p = json_string_value(pattern);
    if (!p && json_object_size(mixers) != 1) {
        char have[256], example[256];
        letters(mixers, ", ", have, sizeof have);
        letters(mixers, "", example, sizeof example);
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.pattern: required when model.mixers "
                         "has %zu entries (%s): one letter per layer, repeated, e.g. "
                         "pattern = \"%s\"", json_object_size(mixers), have, example);
    }
    if (p)
        K3RT_TRY(check_pattern(c, p, mixers, layers));
    char *s = malloc((size_t)layers + 1);
    if (!s)
        return k3rt_fail(c->err, K3RT_ERR_NOMEM, "model.pattern: out of memory");
    size_t n = p ? strlen(p) : 0;
    const char *only = json_object_iter_key(json_object_iter((json_t *)mixers));
    for (json_int_t i = 0; i < layers; i++)
        s[i] = p ? p[i % (json_int_t)n] : only[0];
    s[layers] = '\0';
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)mixers, key, v) {
        if (!strchr(s, key[0])) {
            free(s);
            return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.mixers: entry '%s' is not used "
                             "by model.pattern \"%s\"", key, p);
        }
    }
    *out = json_string(s);
    free(s);
    return *out ? K3RT_OK : k3rt_fail(c->err, K3RT_ERR_NOMEM, "model.pattern: out of memory");
}

/* Absent: dense_glu{} when the registry has it (needed only when dense_layers > 0);
 * k3.none: no dense FFN. */
static int dense_ffn(schema_ctx *c, const json_t *v, json_int_t dense, json_t **out)
{
    if (v && !json_is_null(v))
        return sch_spec(c, v, K3RT_KIND_MOE, "model.dense_ffn", out);
    if (v && dense > 0)
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.dense_ffn: is none, but "
                         "model.dense_layers = %lld needs a dense FFN", (long long)dense);
    if (!v && (dense > 0 || registry_find(c->reg, "dense_glu", K3RT_KIND_MOE)))
        return schema_default_spec(c->reg, "dense_glu", K3RT_KIND_MOE, "model.dense_ffn", out,
                                   c->err);
    *out = json_null();
    return K3RT_OK;
}

static int residual(schema_ctx *c, const json_t *v, json_t **out)
{
    if (!v)
        return schema_default_spec(c->reg, "standard", K3RT_KIND_RESIDUAL, "model.residual",
                                   out, c->err);
    if (json_is_null(v))
        return k3rt_fail(c->err, K3RT_ERR_INVALID, "model.residual: cannot be none (the plain "
                         "residual stream is k3.standard{})");
    return sch_spec(c, v, K3RT_KIND_RESIDUAL, "model.residual", out);
}

/* v by address: it is read only after the builder in `rc` has run. */
static int put(json_t *m, const char *key, int rc, json_t **v)
{
    if (!rc)
        json_object_set_new(m, key, *v);
    return rc;
}

int sch_model(schema_ctx *c, const json_t *raw, json_t **out)
{
    json_t *sc;
    K3RT_TRY(sch_section_scalars(c, "model", raw, &sc));
    json_int_t layers = json_integer_value(json_object_get(sc, "layers"));
    json_int_t dense = json_integer_value(json_object_get(sc, "dense_layers"));
    json_t *m = json_object(), *mixers = NULL, *v = NULL;
    int rc = K3RT_OK;
    if (dense > layers)
        rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "model: dense_layers (%lld) exceeds layers "
                       "(%lld)", (long long)dense, (long long)layers);
    json_object_set(m, "d_model", json_object_get(sc, "d_model"));
    json_object_set(m, "vocab", json_object_get(sc, "vocab"));
    json_object_set(m, "layers", json_object_get(sc, "layers"));
    if (!rc)
        rc = build_mixers(c, json_object_get(raw, "mixers"), &mixers);
    if (!rc)
        rc = put(m, "pattern", expand_pattern(c, json_object_get(sc, "pattern"), mixers, layers,
                                              &v), &v);
    if (!rc)
        json_object_set(m, "mixers", mixers);
    json_decref(mixers);
    const json_t *ffn = json_object_get(raw, "ffn");
    if (!rc && !ffn)
        rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "model: missing required key 'ffn' (the "
                       "feed-forward block, e.g. ffn = k3.dense_glu{})");
    if (!rc && json_is_null(ffn))
        rc = k3rt_fail(c->err, K3RT_ERR_INVALID, "model.ffn: cannot be none");
    if (!rc)
        rc = put(m, "ffn", sch_spec(c, ffn, K3RT_KIND_MOE, "model.ffn", &v), &v);
    if (!rc)
        rc = put(m, "dense_ffn", dense_ffn(c, json_object_get(raw, "dense_ffn"), dense, &v),
                 &v);
    if (!rc)
        json_object_set(m, "dense_layers", json_object_get(sc, "dense_layers"));
    if (!rc)
        rc = put(m, "balancer", sch_balancer(c, json_object_get(raw, "balancer"),
                                             "model.balancer", &v), &v);
    if (!rc)
        rc = put(m, "residual", residual(c, json_object_get(raw, "residual"), &v), &v);
    json_object_set(m, "norm_eps", json_object_get(sc, "norm_eps"));
    json_object_set(m, "init_std", json_object_get(sc, "init_std"));
    json_decref(sc);
    if (rc) {
        json_decref(m);
        return rc;
    }
    *out = m;
    return K3RT_OK;
}
