/* The recipe sandbox's budgets, below everything else of the sandbox: the memory cap (the Lua
 * allocator), the instruction and time budget (the count hook, and the charges of the metered
 * library functions), and the limit error no pcall can catch. */
#include "recipe/sandbox.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/log.h"

#define HOOK_EVERY 1000 /* instructions between two budget checks */

void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    sandbox *sb = ud;
    size_t old = ptr ? osize : 0; /* for a new block osize encodes the object type */
    if (nsize == 0) {
        free(ptr);
        sb->used -= old;
        return NULL;
    }
    if (nsize > old && nsize - old > sb->limit - sb->used) {
        /* Lua collects garbage and retries once; failing again raises LUA_ERRMEM. */
        sb->over_memory = 1;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p)
        sb->used = sb->used - old + nsize;
    return p;
}

static sandbox *sandbox_of(lua_State *L)
{
    void *ud;
    lua_getallocf(L, &ud);
    return ud;
}

static void count_hook(lua_State *L, lua_Debug *ar);

void sandbox_start_counting(lua_State *L)
{
    lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
}

/* From now on every instruction raises, so a recipe that catches the error with pcall cannot
 * go on: its next instruction outside the pcall raises again. */
static void stop_everything(lua_State *L, sandbox *sb)
{
    if (!sb->over_budget)
        lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
    sb->over_budget = 1;
}

static void count_hook(lua_State *L, lua_Debug *ar)
{
    sandbox *sb = sandbox_of(L);
    sb->spent += HOOK_EVERY;
    if (lua_getinfo(L, "Sl", ar)) {
        snprintf(sb->last_src, sizeof sb->last_src, "%s", ar->short_src);
        sb->last_line = ar->currentline;
    }
    if (!sb->over_time && time_now() > sb->deadline)
        sb->over_time = 1;
    if (sb->spent > sb->budget || sb->over_time) {
        stop_everything(L, sb);
        /* Not luaL_error: inside a hook, level 1 would be the caller of the running line. */
        if (sb->over_time)
            lua_pushfstring(L, "%s:%d: recipe exceeded its time limit of %f s (an endless "
                            "loop?)", sb->last_src, sb->last_line, sb->seconds);
        else
            lua_pushfstring(L, "%s:%d: recipe exceeded its instruction budget of %I "
                            "instructions (an endless loop?)", sb->last_src, sb->last_line,
                            (lua_Integer)sb->budget);
        lua_error(L);
    }
}

void sandbox_limit_error(lua_State *L, const char *msg)
{
    stop_everything(L, sandbox_of(L));
    luaL_error(L, "%s", msg);
}

size_t sandbox_memory_left(lua_State *L)
{
    sandbox *sb = sandbox_of(L);
    return sb->limit - sb->used;
}

void sandbox_charge(lua_State *L, double work, const char *what)
{
    sandbox *sb = sandbox_of(L);
    if (!sb->over_time && time_now() > sb->deadline)
        sb->over_time = 1;
    double left = (double)(sb->budget - sb->spent);
    if (!sb->over_time && !sb->over_budget && work <= left) {
        sb->spent += (int64_t)work;
        return;
    }
    char msg[256];
    if (sb->over_time)
        snprintf(msg, sizeof msg, "%s: recipe exceeded its time limit of %g s", what,
                 sb->seconds);
    else
        snprintf(msg, sizeof msg, "%s: up to %.3g steps in one call, more than the %.0f left of "
                 "the recipe's instruction budget of %lld", what, work, left > 0 ? left : 0,
                 (long long)sb->budget);
    sandbox_limit_error(L, msg);
}
