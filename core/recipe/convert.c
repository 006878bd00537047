/* Lua tables to raw JSON (and JSON metrics back to Lua). Tables are read raw: no metamethod
 * of the recipe runs while C walks them. */
#include "recipe/convert.h"

#include <lauxlib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32
#define PATH_LEN 512
#define NODE_BYTES 64 /* what jansson holds per value, about */

void raw_doc_free(raw_doc *d)
{
    json_decref(d->root);
    free(d->specs);
    memset(d, 0, sizeof *d);
}

const raw_spec *raw_doc_spec(const raw_doc *d, const json_t *obj)
{
    for (int i = 0; i < d->n_specs; i++)
        if (d->specs[i].obj == obj)
            return &d->specs[i];
    return NULL;
}

static const char *shown(const char *path) { return *path ? path : "the recipe"; }

static void child_path(char *out, const char *path, const char *key, lua_Integer index)
{
    if (key)
        snprintf(out, PATH_LEN, "%s%s%s", path, *path ? "." : "", key);
    else
        snprintf(out, PATH_LEN, "%s[%lld]", path, (long long)index);
}

static void add_spec(lua_State *L, raw_doc *d, const json_t *obj, const spec_info *info)
{
    if (d->n_specs == d->cap_specs) {
        int cap = d->cap_specs ? d->cap_specs * 2 : 16;
        raw_spec *p = realloc(d->specs, (size_t)cap * sizeof *p);
        if (!p) {
            sandbox_raise(L, "out of memory while reading the recipe");
            return;
        }
        d->specs = p;
        d->cap_specs = cap;
    }
    d->specs[d->n_specs].obj = obj;
    d->specs[d->n_specs].info = *info;
    d->n_specs++;
}

/* Counts bytes of JSON against what is left of the memory cap. */
static void charge(lua_State *L, raw_doc *d, size_t bytes, const char *path)
{
    d->bytes += bytes + NODE_BYTES;
    if (d->bytes <= sandbox_memory_left(L))
        return;
    char msg[PATH_LEN + 256];
    snprintf(msg, sizeof msg, "%s: recipe exceeded its memory limit while being converted to "
             "JSON (%zu bytes so far; a string or table shared by many keys is copied once per "
             "key)", shown(path), d->bytes);
    sandbox_limit_error(L, msg);
}

/* Stores v under parent (key, or appended when key is NULL); jansson takes v either way. */
static void attach(lua_State *L, raw_doc *d, json_t *parent, const char *key, json_t *v,
                   const char *path)
{
    if (!v) {
        sandbox_raise(L, "%s: out of memory while reading the recipe", shown(path));
        return;
    }
    size_t bytes = (key ? strlen(key) : 0) + (json_is_string(v) ? json_string_length(v) : 0);
    int rc = key ? json_object_set_new(parent, key, v) : json_array_append_new(parent, v);
    if (rc)
        sandbox_raise(L, "%s: the key is not valid UTF-8 text", shown(path));
    charge(L, d, bytes, path); /* after: the tree owns v, so a raise frees it with the rest */
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void put(lua_State *L, int idx, raw_doc *d, json_t *parent, const char *key,
                const char *path, int depth);

/* Fills obj from the string keys of the table at idx, in sorted order. */
static void fill_object(lua_State *L, int idx, raw_doc *d, json_t *obj, const char *path,
                        int depth, int top)
{
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            sandbox_raise(L, "%s: has a %s key where option names are expected", shown(path),
                          luaL_typename(L, -1));
        n++;
    }
    if (n == 0)
        return;
    /* Scratch owned by Lua, so an error below leaks nothing. */
    const char **keys = lua_newuserdatauv(L, (size_t)n * sizeof *keys, 0);
    int k = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (strlen(s) != len)
            sandbox_raise(L, "%s: a key contains a NUL byte", shown(path));
        keys[k++] = s;
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_str);
    for (int i = 0; i < n; i++) {
        char child[PATH_LEN];
        child_path(child, path, keys[i], 0);
        lua_pushstring(L, keys[i]);
        lua_rawget(L, idx);
        if (top && !strcmp(keys[i], "on_step")) {
            if (!lua_isfunction(L, -1))
                sandbox_raise(L, "on_step: expected a function(step, metrics), got a %s value",
                              luaL_typename(L, -1));
            d->has_on_step = 1;
        } else {
            put(L, lua_gettop(L), d, obj, keys[i], child, depth + 1);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* A table with keys 1..n becomes a list; {} stays an (empty) object, which schema.c also
 * accepts where a list is expected. */
static int list_length(lua_State *L, int idx, const char *path)
{
    lua_Integer n_int = 0, max = 0;
    int n_str = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TSTRING) {
            n_str++;
        } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
            n_int++;
            if (lua_tointeger(L, -1) > max)
                max = lua_tointeger(L, -1);
        } else {
            sandbox_raise(L, "%s: has a %s key; recipe tables use names or list positions",
                          shown(path), luaL_typename(L, -1));
        }
    }
    if (n_int && n_str)
        sandbox_raise(L, "%s: mixes list items and named keys", shown(path));
    if (n_int && max != n_int)
        sandbox_raise(L, "%s: list has holes (%lld items, highest position %lld)", shown(path),
                      (long long)n_int, (long long)max);
    return (int)n_int;
}

static void put_table(lua_State *L, int idx, raw_doc *d, json_t *parent, const char *key,
                      const char *path, int depth)
{
    if (depth > MAX_DEPTH)
        sandbox_raise(L, "%s: tables nested deeper than %d levels (does a table contain "
                      "itself?)", shown(path), MAX_DEPTH);
    luaL_checkstack(L, 8, "recipe tables nested too deeply");
    spec_info info;
    if (sugar_spec_info(L, idx, &info)) {
        json_t *obj = json_object();
        attach(L, d, parent, key, obj, path);
        add_spec(L, d, obj, &info);
        fill_object(L, idx, d, obj, path, depth, 0);
        return;
    }
    int n = list_length(L, idx, path);
    if (n == 0) {
        json_t *obj = json_object();
        attach(L, d, parent, key, obj, path);
        fill_object(L, idx, d, obj, path, depth, 0);
        return;
    }
    json_t *arr = json_array();
    attach(L, d, parent, key, arr, path);
    for (int i = 1; i <= n; i++) {
        char child[PATH_LEN];
        child_path(child, path, NULL, i);
        lua_rawgeti(L, idx, i);
        put(L, lua_gettop(L), d, arr, NULL, child, depth + 1);
        lua_pop(L, 1);
    }
}

static void put(lua_State *L, int idx, raw_doc *d, json_t *parent, const char *key,
                const char *path, int depth)
{
    switch (lua_type(L, idx)) {
    case LUA_TNIL:
        return;
    case LUA_TBOOLEAN:
        attach(L, d, parent, key, json_boolean(lua_toboolean(L, idx)), path);
        return;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            attach(L, d, parent, key, json_integer((json_int_t)lua_tointeger(L, idx)), path);
        } else {
            double x = (double)lua_tonumber(L, idx);
            if (!isfinite(x))
                sandbox_raise(L, "%s: %g is not a finite number", shown(path), x);
            attach(L, d, parent, key, json_real(x), path);
        }
        return;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        json_t *v = json_stringn(s, n);
        if (!v)
            sandbox_raise(L, "%s: the string is not valid UTF-8 text", shown(path));
        attach(L, d, parent, key, v, path);
        return;
    }
    case LUA_TTABLE:
        put_table(L, idx, d, parent, key, path, depth);
        return;
    case LUA_TUSERDATA:
        if (sugar_is_none(L, idx)) {
            attach(L, d, parent, key, json_null(), path);
            return;
        }
        break;
    case LUA_TFUNCTION:
        sandbox_raise(L, "%s: a function cannot be part of a recipe (only the top-level "
                      "on_step may be one)", shown(path));
        return;
    default:
        break;
    }
    sandbox_raise(L, "%s: a %s value cannot be part of a recipe", shown(path),
                  luaL_typename(L, idx));
}

void convert_recipe(lua_State *L, int idx, raw_doc *d)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        sandbox_raise(L, "the recipe must return a table (return k3.recipe{ ... }), got a %s "
                      "value", luaL_typename(L, idx));
    spec_info info;
    if (sugar_spec_info(L, idx, &info))
        sandbox_raise(L, "the recipe must return a table of sections, got a plugin spec "
                      "(k3.%s)", info.name);
    sugar_recipe_pos(L, idx, d->pos, sizeof d->pos);
    d->root = json_object();
    if (!d->root)
        sandbox_raise(L, "out of memory while reading the recipe");
    fill_object(L, idx, d, d->root, "", 0, 1);
}

void convert_value(lua_State *L, int idx, raw_doc *d, const char *path)
{
    idx = lua_absindex(L, idx);
    if (lua_isnil(L, idx))
        return;
    json_t *holder = json_array();
    d->root = holder;
    if (!holder)
        sandbox_raise(L, "out of memory while reading %s", path);
    put(L, idx, d, holder, NULL, path, 0);
    d->root = json_incref(json_array_get(holder, 0));
    json_decref(holder);
}

static void push_json(lua_State *L, const json_t *v, int depth)
{
    luaL_checkstack(L, 4, "metrics nested too deeply");
    const char *key;
    json_t *item;
    size_t i;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        lua_createtable(L, 0, (int)json_object_size(v));
        if (depth < MAX_DEPTH)
            json_object_foreach((json_t *)v, key, item) {
                push_json(L, item, depth + 1);
                lua_setfield(L, -2, key);
            }
        return;
    case JSON_ARRAY:
        lua_createtable(L, (int)json_array_size(v), 0);
        if (depth < MAX_DEPTH)
            json_array_foreach(v, i, item) {
                push_json(L, item, depth + 1);
                lua_rawseti(L, -2, (lua_Integer)i + 1);
            }
        return;
    case JSON_STRING:
        lua_pushlstring(L, json_string_value(v), json_string_length(v));
        return;
    case JSON_INTEGER:
        lua_pushinteger(L, (lua_Integer)json_integer_value(v));
        return;
    case JSON_REAL:
        lua_pushnumber(L, json_real_value(v));
        return;
    case JSON_TRUE:
    case JSON_FALSE:
        lua_pushboolean(L, json_is_true(v));
        return;
    case JSON_NULL:
        lua_pushnil(L);
        return;
    }
    lua_pushnil(L);
}

void convert_push_json(lua_State *L, const json_t *v)
{
    if (v)
        push_json(L, v, 0);
    else
        lua_pushnil(L);
}
