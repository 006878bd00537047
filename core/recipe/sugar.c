/* The k3 table: plugin spec constructors, k3.plugin, k3.none, k3.recipe. */
#define _GNU_SOURCE /* realpath */
#include "recipe/sugar.h"

#include <lauxlib.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/named.h"
#include "util/fs.h"

/* Registry keys (their addresses). Writable so that no two can share an address. */
static char SPECS_KEY, RECIPES_KEY, NONE_KEY, SPEC_MT_KEY;

static void copy_trimmed(char *buf, size_t len, const char *s)
{
    snprintf(buf, len, "%s", s ? s : "");
    size_t n = strlen(buf);
    while (n && buf[n - 1] == ' ') /* luaL_where ends in ": " */
        buf[--n] = '\0';
}

/* Pushes a new spec: a copy of the option table at cfg (nil or absent: no options). */
static int push_spec(lua_State *L, int cfg, const char *name, const char *path)
{
    if (!lua_isnoneornil(L, cfg) && !lua_istable(L, cfg))
        return luaL_error(L, "k3.%s expects a table of options, got a %s value", name,
                          luaL_typename(L, cfg));
    lua_newtable(L);
    int t = lua_gettop(L);
    if (lua_istable(L, cfg)) {
        lua_pushnil(L);
        while (lua_next(L, cfg)) {
            if (lua_type(L, -2) != LUA_TSTRING)
                return luaL_error(L, "k3.%s: option names must be strings, got a %s key", name,
                                  luaL_typename(L, -2));
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, t);
        }
    }
    lua_rawgetp(L, LUA_REGISTRYINDEX, &SPEC_MT_KEY);
    lua_setmetatable(L, t);

    lua_rawgetp(L, LUA_REGISTRYINDEX, &SPECS_KEY);
    lua_pushvalue(L, t);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, name);
    lua_setfield(L, -2, "name");
    if (path) {
        lua_pushstring(L, path);
        lua_setfield(L, -2, "path");
    }
    luaL_where(L, 1); /* the recipe line that called the constructor */
    lua_setfield(L, -2, "pos");
    lua_rawset(L, -3);
    lua_settop(L, t);
    return 1;
}

static int sugar_call(lua_State *L)
{
    return push_spec(L, 1, lua_tostring(L, lua_upvalueindex(1)), NULL);
}

static int looks_like_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 3 && !strcmp(s + n - 3, ".so"));
}

/* k3.plugin("path/to/libx.so", {...}) loads by path (relative to the recipe's folder);
 * k3.plugin("name", {...}) reaches a registered plugin whose name the sugar cannot carry. */
static int k3_plugin(lua_State *L)
{
    sugar_ctx *c = lua_touserdata(L, lua_upvalueindex(1));
    const char *what = luaL_checkstring(L, 1);
    k3rt_error err = {0};
    if (looks_like_path(what)) {
        char joined[2048], full[PATH_MAX];
        if (what[0] == '/')
            snprintf(joined, sizeof joined, "%s", what);
        else
            fs_join(joined, sizeof joined, c->base_dir, what);
        /* One canonical path, so the engine's registry_load_file finds this very entry. */
        if (!realpath(joined, full))
            snprintf(full, sizeof full, "%s", joined);
        const plugin_entry *e = c->frozen ? registry_find_file(c->reg, full, 0) : NULL;
        if (c->frozen && !e)
            return luaL_error(L, "k3.plugin: %s is not loaded, and plugin files load only "
                              "while the recipe loads (its top level and --set), never from "
                              "on_step mid-run; load it at the top of the recipe", full);
        if (!e && registry_load_file(c->reg, full, &e, &err) != K3RT_OK)
            return luaL_error(L, "k3.plugin: %s", err.msg);
        char name[64], path[1024];
        snprintf(name, sizeof name, "%s", e->desc.name);
        snprintf(path, sizeof path, "%s", e->path);
        return push_spec(L, 2, name, path);
    }
    if (!registry_find(c->reg, what, 0)) {
        registry_not_found(c->reg, what, 0, "k3.plugin", &err);
        return luaL_error(L, "%s", err.msg);
    }
    return push_spec(L, 2, what, NULL);
}

/* k3.recipe{...}: marks the table with the position of the call, for the messages of the
 * validation that follows once --set overrides are applied. */
static int k3_recipe(lua_State *L)
{
    if (!lua_istable(L, 1))
        return luaL_error(L, "k3.recipe expects a table, got a %s value", luaL_typename(L, 1));
    lua_settop(L, 1);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &RECIPES_KEY);
    lua_pushvalue(L, 1);
    luaL_where(L, 1);
    lua_rawset(L, -3);
    lua_settop(L, 1);
    return 1;
}

/* k3.none is JSON null as a value; called, k3.none{} is the built-in `none` balancer. */
static int none_call(lua_State *L)
{
    sugar_ctx *c = lua_touserdata(L, lua_upvalueindex(1));
    if (!registry_find(c->reg, "none", 0))
        return luaL_error(L, "k3.none{}: the registry has no plugin named 'none'");
    return push_spec(L, 2, "none", NULL);
}

/* k3.<unknown>: a misspelt plugin name fails where it is used, with the nearest name
 * (rawget(k3, name) tests for a plugin without failing). */
static int k3_missing(lua_State *L)
{
    sugar_ctx *c = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = lua_tostring(L, 2);
    if (!name)
        return luaL_error(L, "k3 has no field of type %s", luaL_typename(L, 2));
    char where[96];
    snprintf(where, sizeof where, "k3.%s", name);
    k3rt_error err = {0};
    registry_not_found(c->reg, name, 0, where, &err);
    return luaL_error(L, "%s", err.msg);
}

static int none_tostring(lua_State *L)
{
    lua_pushliteral(L, "k3.none");
    return 1;
}

static int spec_tostring(lua_State *L)
{
    spec_info info;
    if (!sugar_spec_info(L, 1, &info))
        return luaL_error(L, "not a spec");
    lua_pushfstring(L, "k3.%s{...}", info.name);
    return 1;
}

static void new_weak_table(lua_State *L, void *key)
{
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}

static int reserved(const char *name)
{
    return !strcmp(name, "recipe") || !strcmp(name, "plugin") || !strcmp(name, "none");
}

void sugar_install(lua_State *L, sugar_ctx *ctx)
{
    new_weak_table(L, &SPECS_KEY);
    new_weak_table(L, &RECIPES_KEY);
    lua_createtable(L, 0, 2);
    lua_pushliteral(L, "k3.spec");
    lua_setfield(L, -2, "__metatable");
    lua_pushcfunction(L, spec_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &SPEC_MT_KEY);

    lua_newtable(L);
    int k3 = lua_gettop(L);
    lua_newuserdatauv(L, 0, 0);
    lua_createtable(L, 0, 3);
    lua_pushliteral(L, "k3.none");
    lua_setfield(L, -2, "__metatable");
    lua_pushcfunction(L, none_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushlightuserdata(L, ctx);
    lua_pushcclosure(L, none_call, 1);
    lua_setfield(L, -2, "__call");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &NONE_KEY);
    lua_setfield(L, k3, "none");
    lua_pushcfunction(L, k3_recipe);
    lua_setfield(L, k3, "recipe");
    lua_pushlightuserdata(L, ctx);
    lua_pushcclosure(L, k3_plugin, 1);
    lua_setfield(L, k3, "plugin");

    for (int i = 0; i < ctx->reg->n; i++) {
        const char *name = ctx->reg->entries[i].desc.name;
        if (reserved(name))
            continue;
        int taken = lua_getfield(L, k3, name) != LUA_TNIL; /* a name of two kinds */
        lua_pop(L, 1);
        if (taken)
            continue;
        lua_pushstring(L, name);
        lua_pushcclosure(L, sugar_call, 1);
        lua_setfield(L, k3, name);
    }
    lua_createtable(L, 0, 1);
    lua_pushlightuserdata(L, ctx);
    lua_pushcclosure(L, k3_missing, 1);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, k3);
    sandbox_push_env(L);
    lua_pushvalue(L, k3);
    lua_setfield(L, -2, "k3");
    lua_settop(L, k3 - 1);
}

int sugar_spec_info(lua_State *L, int idx, spec_info *info)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return 0;
    lua_rawgetp(L, LUA_REGISTRYINDEX, &SPECS_KEY);
    lua_pushvalue(L, idx);
    lua_rawget(L, -2);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 2);
        return 0;
    }
    lua_getfield(L, -1, "name");
    snprintf(info->name, sizeof info->name, "%s", lua_tostring(L, -1));
    lua_getfield(L, -2, "path");
    snprintf(info->path, sizeof info->path, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "");
    lua_getfield(L, -3, "pos");
    copy_trimmed(info->pos, sizeof info->pos, lua_tostring(L, -1));
    lua_pop(L, 5);
    return 1;
}

int sugar_is_none(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    lua_rawgetp(L, LUA_REGISTRYINDEX, &NONE_KEY);
    int same = lua_rawequal(L, idx, -1);
    lua_pop(L, 1);
    return same;
}

void sugar_recipe_pos(lua_State *L, int idx, char *buf, size_t len)
{
    idx = lua_absindex(L, idx);
    buf[0] = '\0';
    lua_rawgetp(L, LUA_REGISTRYINDEX, &RECIPES_KEY);
    lua_pushvalue(L, idx);
    lua_rawget(L, -2);
    if (lua_type(L, -1) == LUA_TSTRING)
        copy_trimmed(buf, len, lua_tostring(L, -1));
    lua_pop(L, 2);
}
