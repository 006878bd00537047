/* The recipe sandbox: state, allocator, instruction hook, environment, protected calls. */
#include "recipe/sandbox.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#define DEFAULT_MEMORY ((size_t)64 << 20)
#define DEFAULT_INSTRUCTIONS ((int64_t)100000000)
#define DEFAULT_SECONDS 10.0
#define WATCHDOG_GRACE(s) ((s) > 2 ? (s) : 2) /* the watchdog acts at limit + this */

static const char ENV_KEY = 0; /* registry key (its address) of the environment table */

/* Base functions a recipe may use: everything but load, loadfile, dofile, collectgarbage and
 * require (the package library is never opened); setmetatable is wrapped below. */
static const char *const BASE_WHITELIST[] = {
    "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "print",
    "rawequal", "rawget", "rawlen", "rawset", "select", "setmetatable", "tonumber",
    "tostring", "type", "xpcall", "_VERSION",
};

/* The message handler of lua.c: a string message gets a traceback; other error objects are
 * described by their __tostring or their type. */
static int msgh(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
            msg = lua_tostring(L, -1);
        else
            msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* Keeps the message and, when the error passed through more than one recipe frame, those
 * frames of the traceback; C frames and the single frame the message already names are
 * noise to a recipe author. */
static void trim_traceback(const char *full, char *out, size_t len)
{
    const char *tb = strstr(full, "\nstack traceback:");
    if (!tb) {
        snprintf(out, len, "%s", full);
        return;
    }
    snprintf(out, len, "%.*s", (int)(tb - full), full);
    const char *frames[16];
    int lens[16], n = 0;
    for (const char *p = strchr(tb + 1, '\n'); p && n < 16;) {
        p++;
        while (*p == '\t' || *p == ' ')
            p++;
        const char *end = strchr(p, '\n');
        int l = end ? (int)(end - p) : (int)strlen(p);
        if (l > 0 && strncmp(p, "[C]", 3) && strncmp(p, "(...tail calls...)", 18)) {
            frames[n] = p;
            lens[n++] = l;
        }
        p = end;
    }
    if (n < 2)
        return;
    size_t at = strlen(out);
    at += (size_t)snprintf(out + at, at < len ? len - at : 0, "\nstack traceback:");
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "\n\t%.*s", lens[i], frames[i]);
}

static void memory_message(const sandbox *sb, k3rt_error *err)
{
    char amount[64];
    if (sb->limit % ((size_t)1 << 20) == 0)
        snprintf(amount, sizeof amount, "%zu MiB", sb->limit >> 20);
    else
        snprintf(amount, sizeof amount, "%zu bytes", sb->limit);
    if (sb->last_line > 0)
        k3rt_fail(err, K3RT_ERR_LIMIT,
                  "%s: recipe exceeded its memory limit of %s (last seen running %s:%d)",
                  sb->name, amount, sb->last_src, sb->last_line);
    else
        k3rt_fail(err, K3RT_ERR_LIMIT, "%s: recipe exceeded its memory limit of %s", sb->name,
                  amount);
}

int sandbox_run(sandbox *sb, lua_CFunction fn, void *ud, k3rt_error *err)
{
    lua_State *L = sb->L;
    lua_settop(L, 0);
    sb->spent = 0;
    if (sb->over_budget)
        sandbox_start_counting(L);
    sb->over_memory = sb->over_budget = sb->over_time = 0;
    sb->last_src[0] = '\0';
    sb->last_line = 0;
    sb->deadline = time_now() + sb->seconds;
    char stuck[400];
    snprintf(stuck, sizeof stuck, "k3rt: %s: recipe code ran %g s past its time limit of %g s "
             "inside a call the sandbox cannot interrupt; the process stops here", sb->name,
             WATCHDOG_GRACE(sb->seconds), sb->seconds);
    watchdog_arm(sb->wd, sb->deadline + WATCHDOG_GRACE(sb->seconds), stuck);
    lua_pushcfunction(L, msgh);
    lua_pushcfunction(L, fn);
    lua_pushlightuserdata(L, ud);
    int st = lua_pcall(L, 1, 0, 1);
    watchdog_disarm(sb->wd);
    int rc = K3RT_OK;
    if (st == LUA_ERRMEM || (st == LUA_ERRERR && sb->over_memory)) {
        memory_message(sb, err);
        rc = K3RT_ERR_LIMIT;
    } else if (st != LUA_OK) {
        const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(no message)";
        char trimmed[K3RT_ERROR_MSG_MAX];
        trim_traceback(msg, trimmed, sizeof trimmed);
        rc = sb->over_budget ? K3RT_ERR_LIMIT : K3RT_ERR_INVALID;
        k3rt_fail(err, rc, "%s", trimmed);
    }
    lua_settop(L, 0);
    return rc;
}

int sandbox_raise(lua_State *L, const char *fmt, ...)
{
    char msg[K3RT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lua_pushstring(L, msg);
    return lua_error(L);
}

void sandbox_push_env(lua_State *L) { lua_rawgetp(L, LUA_REGISTRYINDEX, &ENV_KEY); }

int sandbox_load(lua_State *L, const char *text, size_t len, const char *chunkname)
{
    int st = luaL_loadbufferx(L, text, len, chunkname, "t");
    if (st != LUA_OK)
        return st;
    sandbox_push_env(L);
    if (!lua_setupvalue(L, -2, 1)) /* a main chunk's first upvalue is always _ENV */
        lua_pop(L, 1);
    return LUA_OK;
}

/* setmetatable without finalizers: Lua runs __gc with hooks off, so a looping finalizer
 * would escape the instruction budget (and could run inside lua_close). */
static int safe_setmetatable(lua_State *L)
{
    if (lua_istable(L, 2)) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: recipes cannot set __gc finalizers");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* Libraries are opened into Lua's own global table, which no recipe can reach; the
 * environment gets copies of the whitelisted entries. */
static int open_env(lua_State *L)
{
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    int globals = lua_gettop(L);
    lua_newtable(L);
    int env = lua_gettop(L);
    for (size_t i = 0; i < sizeof BASE_WHITELIST / sizeof BASE_WHITELIST[0]; i++) {
        lua_getfield(L, globals, BASE_WHITELIST[i]);
        lua_setfield(L, env, BASE_WHITELIST[i]);
    }
    lua_getfield(L, globals, "setmetatable");
    lua_pushcclosure(L, safe_setmetatable, 1);
    lua_setfield(L, env, "setmetatable");
    lua_pushvalue(L, env);
    lua_setfield(L, env, LUA_GNAME);

    /* The string table is also the __index of the string metatable, so removing dump here
     * removes ("x"):dump() too. */
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 0);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_setfield(L, env, LUA_STRLIBNAME);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 0);
    lua_setfield(L, env, LUA_TABLIBNAME);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 0);
    lua_setfield(L, env, LUA_UTF8LIBNAME);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 0);
    /* Lua seeds math.random from the clock; a recipe must mean the same thing every run. */
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 0);
    lua_call(L, 1, 0);
    lua_setfield(L, env, LUA_MATHLIBNAME);

    sandbox_meter_libs(L, env);
    lua_pushvalue(L, env);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &ENV_KEY);
    return 0;
}

int sandbox_open(sandbox *sb, const recipe_limits *limits, const char *name, k3rt_error *err)
{
    memset(sb, 0, sizeof *sb);
    snprintf(sb->name, sizeof sb->name, "%s", name);
    sb->limit = limits && limits->memory_bytes ? limits->memory_bytes : DEFAULT_MEMORY;
    sb->budget = limits && limits->instructions > 0 ? limits->instructions
                                                     : DEFAULT_INSTRUCTIONS;
    sb->seconds = limits && limits->seconds > 0 ? limits->seconds : DEFAULT_SECONDS;
    K3RT_TRY(watchdog_start(&sb->wd, err));
    sb->L = lua_newstate(sandbox_alloc, sb);
    if (!sb->L)
        return k3rt_fail(err, K3RT_ERR_LIMIT, "%s: cannot create a Lua state within the "
                         "memory limit of %zu bytes", name, sb->limit);
    sandbox_start_counting(sb->L);
    return sandbox_run(sb, open_env, NULL, err);
}

void sandbox_close(sandbox *sb)
{
    if (sb->L) {
        sb->spent = 0; /* finalizers the recipe set run now, under a fresh budget */
        lua_close(sb->L);
        sb->L = NULL;
    }
    watchdog_stop(sb->wd);
    sb->wd = NULL;
}
