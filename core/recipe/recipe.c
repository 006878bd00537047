/* Recipes: loading, --set overrides, validation, accessors and the on_step hook. */
#include "recipe/recipe.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/convert.h"
#include "recipe/overrides.h"
#include "recipe/sandbox.h"
#include "recipe/schema.h"
#include "recipe/sugar.h"
#include "train/ckpt_dir.h"
#include "util/fs.h"

struct recipe {
    sandbox sb; /* at a fixed address: the Lua allocator points to it */
    sugar_ctx sugar;
    registry *reg;
    char *text;
    size_t len;
    char *path;
    char hash[65];
    json_t *doc;
    int root_ref, on_step_ref;
    char on_step_pos[SANDBOX_POS_MAX];
};

static int install_sugar(lua_State *L)
{
    recipe *r = lua_touserdata(L, 1);
    sugar_install(L, &r->sugar);
    return 0;
}

static int run_chunk(lua_State *L)
{
    recipe *r = lua_touserdata(L, 1);
    char chunk[1100];
    snprintf(chunk, sizeof chunk, "@%s", r->path);
    if (sandbox_load(L, r->text, r->len, chunk) != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        sandbox_raise(L, "%s: the recipe must return a table (return k3.recipe{ ... }), got %s%s",
                      r->path, lua_isnil(L, -1) ? "nothing" : "a value of type ",
                      lua_isnil(L, -1) ? "" : luaL_typename(L, -1));
    r->root_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

typedef struct convert_job {
    recipe *r;
    raw_doc *raw;
    int ref; /* on_step: the result to convert */
} convert_job;

static int convert_root(lua_State *L)
{
    convert_job *j = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, j->r->root_ref);
    convert_recipe(L, -1, j->raw);
    return 0;
}

/* Converts and validates the recipe table. Messages start with the recipe position they
 * belong to, or with `blame` (the overrides) when those are known to be the cause. */
static int build(recipe *r, const char *blame, json_t **doc, k3rt_error *err)
{
    raw_doc raw = {0};
    convert_job j = {r, &raw, LUA_NOREF};
    int rc = sandbox_run(&r->sb, convert_root, &j, err);
    if (!raw.pos[0])
        snprintf(raw.pos, sizeof raw.pos, "%s:", r->path);
    char pos[SANDBOX_POS_MAX];
    snprintf(pos, sizeof pos, "%s", rc == K3RT_ERR_INVALID ? raw.pos : "");
    if (!rc) {
        char stem[256];
        fs_stem(stem, sizeof stem, r->path);
        rc = schema_build(&raw, r->reg, stem, doc, pos, err);
    }
    raw_doc_free(&raw);
    if (rc && rc != K3RT_ERR_LIMIT && (blame || pos[0]))
        k3rt_error_prefix(err, "%s ", blame ? blame : pos);
    return rc;
}

static int grab_on_step(lua_State *L)
{
    recipe *r = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->root_ref);
    lua_pushliteral(L, "on_step");
    lua_rawget(L, -2);
    if (!lua_isfunction(L, -1))
        return 0;
    lua_Debug ar;
    lua_pushvalue(L, -1);
    lua_getinfo(L, ">S", &ar);
    snprintf(r->on_step_pos, sizeof r->on_step_pos, "%s:%d:", ar.short_src, ar.linedefined);
    r->on_step_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Validation after overrides: when the recipe alone was valid, the overrides are to blame. */
static int validate(recipe *r, const char *const *overrides, int n, k3rt_error *err)
{
    int base_ok = 0;
    if (n > 0) {
        json_t *base = NULL;
        k3rt_error ignored = {0};
        base_ok = build(r, NULL, &base, &ignored) == K3RT_OK;
        json_decref(base);
        for (int i = 0; i < n; i++)
            K3RT_TRY(overrides_apply(&r->sb, r->reg, r->root_ref, overrides[i], err));
    }
    char blame[512] = "";
    for (int i = 0, at = 0; base_ok && i < n && at < (int)sizeof blame; i++)
        at += snprintf(blame + at, sizeof blame - (size_t)at, "%s--set %s%s", i ? " " : "",
                       overrides[i], i == n - 1 ? ":" : "");
    return build(r, base_ok ? blame : NULL, &r->doc, err);
}

static int load(recipe *r, const char *const *overrides, int n, const recipe_limits *limits,
                k3rt_error *err)
{
    r->root_ref = r->on_step_ref = LUA_NOREF;
    if (r->len >= 4 && !memcmp(r->text, LUA_SIGNATURE, 4))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: is a precompiled Lua chunk; recipes are "
                         "loaded as source text only", r->path);
    sha256_hex(r->text, r->len, r->hash);
    K3RT_TRY(sandbox_open(&r->sb, limits, r->path, err));
    fs_dirname(r->sugar.base_dir, sizeof r->sugar.base_dir, r->path);
    K3RT_TRY(sandbox_run(&r->sb, install_sugar, r, err));
    K3RT_TRY(sandbox_run(&r->sb, run_chunk, r, err));
    K3RT_TRY(validate(r, overrides, n, err));
    if (json_is_true(json_object_get(r->doc, "has_on_step")))
        K3RT_TRY(sandbox_run(&r->sb, grab_on_step, r, err));
    r->sugar.frozen = 1;
    return K3RT_OK;
}

static int load_text(char *text, size_t len, const char *name, registry *reg,
                     const char *const *overrides, int n, const recipe_limits *limits,
                     recipe **out, k3rt_error *err)
{
    recipe *r = calloc(1, sizeof *r);
    char *path = strdup(name);
    if (!r || !path) {
        free(r);
        free(path);
        free(text);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", name);
    }
    r->text = text;
    r->len = len;
    r->path = path;
    r->reg = r->sugar.reg = reg;
    int rc = load(r, overrides, n, limits, err);
    if (rc) {
        recipe_free(r);
        return rc;
    }
    *out = r;
    return K3RT_OK;
}

int recipe_load(const char *path, registry *reg, const char *const *overrides, int n_overrides,
                const recipe_limits *limits, recipe **out, k3rt_error *err)
{
    *out = NULL;
    if (!path || !reg || n_overrides < 0 || (n_overrides && !overrides))
        return k3rt_fail(err, K3RT_ERR_INVALID, "recipe_load: bad arguments");
    char *text;
    size_t len;
    K3RT_TRY(fs_read_file(path, &text, &len, err));
    return load_text(text, len, path, reg, overrides, n_overrides, limits, out, err);
}

int recipe_load_string(const char *text, const char *name, registry *reg,
                       const char *const *overrides, int n_overrides,
                       const recipe_limits *limits, recipe **out, k3rt_error *err)
{
    *out = NULL;
    if (!text || !name || !reg || n_overrides < 0 || (n_overrides && !overrides))
        return k3rt_fail(err, K3RT_ERR_INVALID, "recipe_load_string: bad arguments");
    char *copy = strdup(text);
    if (!copy)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", name);
    return load_text(copy, strlen(copy), name, reg, overrides, n_overrides, limits, out, err);
}

void recipe_free(recipe *r)
{
    if (!r)
        return;
    sandbox_close(&r->sb);
    json_decref(r->doc);
    free(r->text);
    free(r->path);
    free(r);
}

const json_t *recipe_json(const recipe *r) { return r->doc; }
const char *recipe_text(const recipe *r) { return r->text; }
const char *recipe_hash(const recipe *r) { return r->hash; }
const char *recipe_path(const recipe *r) { return r->path; }

const plugin_entry *recipe_spec_plugin(const recipe *r, const json_t *spec)
{
    if (!r || !json_is_object(spec))
        return NULL;
    const char *name = json_string_value(json_object_get(spec, "plugin"));
    const char *path = json_string_value(json_object_get(spec, "path"));
    const char *kind = json_string_value(json_object_get(spec, "kind"));
    if (!name)
        return NULL;
    int k = 0;
    for (int i = 1; kind && i < K3RT_KIND_COUNT_; i++)
        if (!strcmp(kind, k3rt_kind_name(i)))
            k = i;
    return schema_resolve(r->reg, name, path, k);
}

typedef struct step_job {
    recipe *r;
    int64_t step;
    const json_t *metrics;
    int result_ref;
} step_job;

static int call_on_step(lua_State *L)
{
    step_job *j = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, j->r->on_step_ref);
    lua_pushinteger(L, (lua_Integer)j->step);
    convert_push_json(L, j->metrics);
    lua_call(L, 2, 1);
    j->result_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static int convert_result(lua_State *L)
{
    convert_job *j = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, j->ref);
    luaL_unref(L, LUA_REGISTRYINDEX, j->ref);
    convert_value(L, -1, j->raw, "on_step result");
    return 0;
}

int recipe_on_step(recipe *r, int64_t step, const json_t *metrics, json_t **changes,
                   k3rt_error *err)
{
    *changes = NULL;
    if (r->on_step_ref == LUA_NOREF)
        return K3RT_OK;
    step_job sj = {r, step, metrics, LUA_NOREF};
    K3RT_TRY(sandbox_run(&r->sb, call_on_step, &sj, err));
    raw_doc raw = {0};
    convert_job cj = {r, &raw, sj.result_ref};
    char pos[SANDBOX_POS_MAX];
    snprintf(pos, sizeof pos, "%s", r->on_step_pos);
    int rc = sandbox_run(&r->sb, convert_result, &cj, err);
    snprintf(raw.pos, sizeof raw.pos, "%s", r->on_step_pos);
    if (!rc)
        rc = schema_changes(&raw, r->reg, changes, pos, err);
    raw_doc_free(&raw);
    if (rc && rc != K3RT_ERR_LIMIT)
        k3rt_error_prefix(err, "%s ", pos);
    return rc;
}
