/* Loading and checking an ablation suite (suite.h). */
#include "ablate/suite.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/convert.h"
#include "recipe/sandbox.h"
#include "recipe/schema.h"
#include "recipe/sugar.h"
#include "util/fs.h"

typedef struct job {
    const char *text;
    size_t len;
    const char *chunk;
    raw_doc *raw;
} job;

/* The converter recognises plugin specs through the k3 sugar's tables, so the sugar is
 * installed, over an empty registry: a suite names plugins only inside override strings. */
static int install_sugar(lua_State *L)
{
    sugar_install(L, lua_touserdata(L, 1));
    return 0;
}

static int evaluate(lua_State *L)
{
    job *j = lua_touserdata(L, 1);
    if (sandbox_load(L, j->text, j->len, j->chunk) != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        sandbox_raise(L, "%s: a suite must return a table { base = \"recipe.lua\", variants = "
                      "{ ... } }, got a %s value", j->chunk + 1, luaL_typename(L, -1));
    convert_value(L, -1, j->raw, "suite");
    return 0;
}

static int string_of(const json_t *obj, const char *key, const char *what, char *buf,
                     size_t len, int required, k3rt_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v && !required)
        return K3RT_OK;
    if (!json_is_string(v) || !json_string_length(v) || json_string_length(v) >= len)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' expects a non-empty string "
                         "(under %zu characters), got %s", what, key, len,
                         schema_json_kind(v));
    snprintf(buf, len, "%s", json_string_value(v));
    return K3RT_OK;
}

/* A list of "key.path=value" strings ({} and absent are empty). */
static int overrides_of(const json_t *obj, const char *what, char ***out, int *n,
                        k3rt_error *err)
{
    const json_t *v = json_object_get(obj, "set");
    *out = NULL;
    *n = 0;
    if (!v || (json_is_object(v) && !json_object_size(v)))
        return K3RT_OK;
    if (!json_is_array(v))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s.set: expected a list of \"key.path=value\" "
                         "strings, got %s", what, schema_json_kind(v));
    *out = calloc(json_array_size(v) + 1, sizeof **out);
    if (!*out)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item) {
        const char *s = json_string_value(item);
        if (!s || !strchr(s, '=') || *s == '=')
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s.set[%zu]: expected \"key.path=value\" "
                             "(as for k3rt train --set), got %s%s%s", what, i + 1,
                             s ? "\"" : schema_json_kind(item), s ? s : "", s ? "\"" : "");
        (*out)[(*n)++] = strdup(s);
        if (!(*out)[*n - 1])
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    return K3RT_OK;
}

static int valid_name(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '.'))
            return 0;
    return 1;
}

static int add_variant(ablate_suite *s, const json_t *v, const char *what, k3rt_error *err)
{
    static const char *const KEYS[] = {"name", "set"};
    if (!json_is_object(v))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: expected a table { name = \"...\", set = "
                         "{ ... } }, got %s", what, schema_json_kind(v));
    K3RT_TRY(schema_check_keys(v, KEYS, 2, what, err));
    ablate_variant *av = &s->variants[s->n_variants++];
    K3RT_TRY(string_of(v, "name", what, av->name, sizeof av->name, 1, err));
    if (!valid_name(av->name) || !strcmp(av->name, ".") || !strcmp(av->name, ".."))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: name '%s' names a folder: use letters, "
                         "digits, '-', '_' and '.'", what, av->name);
    for (int i = 0; i < s->n_variants - 1; i++)
        if (!strcmp(s->variants[i].name, av->name))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: name '%s' is used twice", what,
                             av->name);
    return overrides_of(v, what, &av->sets, &av->n_sets, err);
}

#define MAX_SEEDS 16

/* `seeds`: a list of distinct non-negative integers (absent: none). */
static int seeds_of(const json_t *root, long long *out, int *n, k3rt_error *err)
{
    const json_t *v = json_object_get(root, "seeds");
    *n = 0;
    if (!v)
        return K3RT_OK;
    if (!json_is_array(v) || !json_array_size(v) || json_array_size(v) > MAX_SEEDS)
        return k3rt_fail(err, K3RT_ERR_INVALID, "suite: key 'seeds' expects a list of 1 to %d "
                         "integers, e.g. { 1, 2 }, got %s%s", MAX_SEEDS, schema_json_kind(v),
                         json_array_size(v) > MAX_SEEDS ? " (too long)" : "");
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item) {
        if (!json_is_integer(item) || json_integer_value(item) < 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "suite.seeds[%zu]: expected a "
                             "non-negative integer (a train.seed), got %s", i + 1,
                             schema_json_kind(item));
        out[*n] = (long long)json_integer_value(item);
        for (int k = 0; k < *n; k++)
            if (out[k] == out[*n])
                return k3rt_fail(err, K3RT_ERR_INVALID, "suite.seeds[%zu]: seed %lld is "
                                 "listed twice", i + 1, out[*n]);
        (*n)++;
    }
    return K3RT_OK;
}

/* Appends a copy of text. */
static int push_set(char ***list, int *n, const char *text, k3rt_error *err)
{
    char **grown = realloc(*list, (size_t)(*n + 2) * sizeof **list);
    if (!grown)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    *list = grown;
    grown[*n] = strdup(text);
    grown[*n + 1] = NULL;
    return grown[(*n)++] ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
}

static int push_seed(char ***list, int *n, long long seed, k3rt_error *err)
{
    char buf[48];
    snprintf(buf, sizeof buf, "train.seed=%lld", seed);
    return push_set(list, n, buf, err);
}

/* Variant `of` again under each further seed, after it: "<name>-seed<N>". */
static int add_replicas(ablate_suite *s, int of, const long long *seeds, int n,
                        k3rt_error *err)
{
    const ablate_variant *v = &s->variants[of];
    s->variants[of].seed = seeds[0];
    for (int k = 1; k < n; k++) {
        ablate_variant *r = &s->variants[s->n_variants++];
        char name[sizeof r->name + 32];
        snprintf(name, sizeof name, "%s-seed%lld", v->name, seeds[k]);
        if (strlen(name) >= sizeof r->name)
            return k3rt_fail(err, K3RT_ERR_INVALID, "suite: the name '%s' is too long for "
                             "its seed replicas' names", v->name);
        memcpy(r->name, name, strlen(name) + 1);
        r->seed = seeds[k];
        r->replica = 1;
        r->of = of;
        for (int i = 0; i < v->n_sets; i++)
            K3RT_TRY(push_set(&r->sets, &r->n_sets, v->sets[i], err));
        K3RT_TRY(push_seed(&r->sets, &r->n_sets, seeds[k], err));
    }
    return K3RT_OK;
}

/* `replicate`: "base" (default) or "all"; `given` (the command line's) over the suite's. */
static int replicate_of(const json_t *root, const char *given, int n_seeds, int *all,
                        k3rt_error *err)
{
    const json_t *v = json_object_get(root, "replicate");
    *all = 0;
    if (!v && !given)
        return K3RT_OK;
    const char *s = given ? given : json_string_value(v);
    if (!s || (strcmp(s, "base") && strcmp(s, "all")))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s expects \"base\" (the "
                         "base under each seed) or \"all\" (every variant under each seed), "
                         "got %s%s%s", given ? "--replicate" : "suite: key 'replicate'",
                         s ? "\"" : schema_json_kind(v), s ? s : "", s ? "\"" : "");
    if (!strcmp(s, "all") && n_seeds < 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "suite: replicate = \"all\" needs two or more "
                         "seeds in the suite, e.g. seeds = { 1, 2 }");
    *all = !strcmp(s, "all");
    return K3RT_OK;
}

static int build(ablate_suite *s, const json_t *root, const char *replicate, k3rt_error *err)
{
    static const char *const KEYS[] = {"name", "base", "base_name", "description", "set",
                                       "seeds", "replicate", "runs", "variants"};
    K3RT_TRY(schema_check_keys(root, KEYS, 9, "suite", err));
    fs_stem(s->name, sizeof s->name, s->path);
    K3RT_TRY(string_of(root, "name", "suite", s->name, sizeof s->name, 0, err));
    if (!valid_name(s->name))
        return k3rt_fail(err, K3RT_ERR_INVALID, "suite: name '%s' names a folder: use letters, "
                         "digits, '-', '_' and '.'", s->name);
    char base[1024], dir[1024];
    K3RT_TRY(string_of(root, "base", "suite", base, sizeof base, 1, err));
    if (base[0] == '/')
        snprintf(s->base, sizeof s->base, "%s", base);
    else
        fs_join(s->base, sizeof s->base, fs_dirname(dir, sizeof dir, s->path), base);
    K3RT_TRY(string_of(root, "description", "suite", s->description, sizeof s->description, 0,
                       err));
    K3RT_TRY(overrides_of(root, "suite", &s->sets, &s->n_sets, err));
    K3RT_TRY(string_of(root, "runs", "suite", s->runs, sizeof s->runs, 0, err));
    const json_t *vars = json_object_get(root, "variants");
    if (!json_is_array(vars) || !json_array_size(vars))
        return k3rt_fail(err, K3RT_ERR_INVALID, "suite: key 'variants' expects a non-empty list "
                         "of { name = \"...\", set = { ... } }, got %s", schema_json_kind(vars));
    long long seeds[MAX_SEEDS];
    int n_seeds;
    K3RT_TRY(seeds_of(root, seeds, &n_seeds, err));
    K3RT_TRY(replicate_of(root, replicate, n_seeds, &s->replicate_all, err));
    s->n_seeds = n_seeds;
    size_t per = n_seeds > 1 ? (size_t)n_seeds : 1;
    s->variants = calloc((json_array_size(vars) + 1) * per, sizeof *s->variants);
    if (!s->variants)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    ablate_variant *b = &s->variants[s->n_variants++];
    snprintf(b->name, sizeof b->name, "base");
    K3RT_TRY(string_of(root, "base_name", "suite", b->name, sizeof b->name, 0, err));
    if (!valid_name(b->name))
        return k3rt_fail(err, K3RT_ERR_INVALID, "suite: base_name '%s' names a folder: use "
                         "letters, digits, '-', '_' and '.'", b->name);
    /* The first seed for every run (after the suite's own overrides) */
    if (n_seeds) {
        K3RT_TRY(push_seed(&s->sets, &s->n_sets, seeds[0], err));
        K3RT_TRY(add_replicas(s, 0, seeds, n_seeds, err));
    }
    size_t i;
    json_t *v;
    json_array_foreach(vars, i, v) {
        char what[64];
        snprintf(what, sizeof what, "suite.variants[%zu]", i + 1);
        K3RT_TRY(add_variant(s, v, what, err));
        if (s->replicate_all)
            K3RT_TRY(add_replicas(s, s->n_variants - 1, seeds, n_seeds, err));
    }
    for (int a = 0; a < s->n_variants; a++)
        for (int b = 0; b < a; b++)
            if (!strcmp(s->variants[a].name, s->variants[b].name))
                return k3rt_fail(err, K3RT_ERR_INVALID, "suite: two runs are named '%s' (a "
                                 "variant's name is also a seed replica's)",
                                 s->variants[a].name);
    return K3RT_OK;
}

int suite_load(const char *path, const char *replicate, ablate_suite *s, k3rt_error *err)
{
    memset(s, 0, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", path);
    char *text;
    size_t len;
    K3RT_TRY(fs_read_file(path, &text, &len, err));
    sandbox *sb = calloc(1, sizeof *sb); /* at a fixed address: the allocator points to it */
    raw_doc raw = {0};
    char chunk[1100];
    snprintf(chunk, sizeof chunk, "@%s", path);
    job j = {text, len, chunk, &raw};
    int rc = sb ? sandbox_open(sb, NULL, path, err)
                : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc && len >= 4 && !memcmp(text, LUA_SIGNATURE, 4))
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: is a precompiled Lua chunk; suites are "
                       "loaded as source text only", path);
    registry none;
    memset(&none, 0, sizeof none);
    sugar_ctx sugar;
    memset(&sugar, 0, sizeof sugar);
    sugar.reg = &none;
    if (!rc)
        rc = sandbox_run(sb, install_sugar, &sugar, err);
    if (!rc)
        rc = sandbox_run(sb, evaluate, &j, err);
    if (!rc)
        rc = build(s, raw.root, replicate, err);
    if (rc && rc != K3RT_ERR_LIMIT && !strstr(err->msg, path))
        k3rt_error_prefix(err, "%s: ", path);
    raw_doc_free(&raw);
    if (sb)
        sandbox_close(sb);
    free(sb);
    free(text);
    if (rc)
        suite_free(s);
    return rc;
}

static void free_list(char **l, int n)
{
    for (int i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

void suite_free(ablate_suite *s)
{
    free_list(s->sets, s->n_sets);
    for (int i = 0; i < s->n_variants; i++)
        free_list(s->variants[i].sets, s->variants[i].n_sets);
    free(s->variants);
    memset(s, 0, sizeof *s);
}
