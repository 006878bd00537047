/* Metered library functions of the recipe sandbox (sandbox.h).
 *
 * The instruction hook sees only the Lua VM. These C functions could run for hours in one call
 * without a single VM instruction, so each is replaced by a wrapper that bounds the work up
 * front, then calls the original (kept as an upvalue):
 *   string.rep            n copies of an empty string (and separator) are "", at once; with
 *                         anything to copy the result is capped by the memory limit
 *   string.find/match/    Lua's matcher backtracks: a pattern with q quantified items (*, +,
 *   gmatch/gsub           -, ?), balances (%b) or back-references (%1-%9) may take up to
 *                         (n+1)^(q+1) x (pattern length + 1) steps on n bytes ((n+1) x (m+1)
 *                         for a plain search); a call whose bound is more than the instruction
 *                         budget left is refused
 *   table.move            e - f + 1 steps, charged to the budget (nils move without memory)
 *   table.concat/sort     charged j - i + 1 and n log2 n steps
 *   table.insert/remove/  plain tables only: a __len, __index or __newindex metamethod could
 *   unpack, and the above make the loop bounds and every element access anything
 *   xpcall                the message handler runs after the error has unwound, as an ordinary
 *                         call: Lua runs handlers with hooks off, which would escape the budget
 *                         and the clock
 */
#include <lauxlib.h>
#include <math.h>
#include <string.h>

#include "recipe/sandbox.h"

/* Calls the original function (upvalue 1) with this call's arguments. */
static int call_original(lua_State *L)
{
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

/* ---- string ------------------------------------------------------------------------------- */

static int meter_rep(lua_State *L)
{
    size_t l, lsep = 0;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || l + lsep == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    return call_original(L);
}

/* Skips one single-character class of a pattern (%x, [set], or a character). */
static size_t class_end(const char *p, size_t i, size_t lp)
{
    if (p[i] == '%')
        return i + 2 <= lp ? i + 2 : lp;
    if (p[i] != '[')
        return i + 1;
    i++;
    if (i < lp && p[i] == '^')
        i++;
    do { /* the first ']' of a set is a member */
        if (i < lp && p[i] == '%')
            i++;
        i++;
    } while (i < lp && p[i] != ']');
    return i < lp ? i + 1 : lp;
}

/* The worst-case step bound of matching pattern p (lp bytes) against n bytes; `anchors`:
 * whether a leading '^' anchors the match (not in gmatch, which tries every position). */
static double pattern_cost(const char *p, size_t lp, size_t n, int plain, int anchors)
{
    double per = (double)lp + 1, subject = (double)n + 1;
    if (plain)
        return subject * per;
    int anchored = anchors && lp > 0 && p[0] == '^';
    double cost = (anchored ? 1 : subject) * per;
    for (size_t i = anchored; i < lp;) {
        if (p[i] == '%' && i + 1 < lp && p[i + 1] == 'b') { /* %bxy */
            cost *= subject;
            i += 4;
            continue;
        }
        if (p[i] == '%' && i + 1 < lp && p[i + 1] >= '0' && p[i + 1] <= '9') {
            cost *= subject;
            i += 2;
            continue;
        }
        if (p[i] == '%' && i + 1 < lp && p[i + 1] == 'f') { /* %f[set]: one position */
            i = class_end(p, i + 2, lp);
            continue;
        }
        if (p[i] == '(' || p[i] == ')') {
            i++;
            continue;
        }
        i = class_end(p, i, lp);
        if (i < lp && (p[i] == '*' || p[i] == '+' || p[i] == '-')) {
            cost *= subject;
            i++;
        } else if (i < lp && p[i] == '?') {
            cost *= 2;
            i++;
        }
    }
    return cost;
}

/* find, match, gmatch, gsub: (s, pattern, ...); find's 4th argument is `plain`. */
static int meter_pattern(lua_State *L)
{
    size_t n, lp;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &lp);
    const char *what = lua_tostring(L, lua_upvalueindex(2));
    int plain = lua_toboolean(L, lua_upvalueindex(3)) && lua_toboolean(L, 4);
    sandbox_charge(L, pattern_cost(p, lp, n, plain, strcmp(what, "string.gmatch") != 0), what);
    return call_original(L);
}

/* ---- table -------------------------------------------------------------------------------- */

static void plain_table(lua_State *L, int arg, const char *what)
{
    luaL_checktype(L, arg, LUA_TTABLE);
    if (lua_getmetatable(L, arg))
        luaL_error(L, "%s: recipes pass plain tables to the table library (this one has a "
                   "metatable)", what);
}

static int meter_table(lua_State *L)
{
    const char *what = lua_tostring(L, lua_upvalueindex(2));
    plain_table(L, 1, what);
    if (!strcmp(what, "table.move")) {
        lua_Integer f = luaL_checkinteger(L, 2), e = luaL_checkinteger(L, 3);
        luaL_checkinteger(L, 4);
        if (!lua_isnoneornil(L, 5))
            plain_table(L, 5, what);
        if (e >= f)
            sandbox_charge(L, (double)e - (double)f + 1, what);
    } else if (!strcmp(what, "table.concat")) {
        lua_Integer i = luaL_optinteger(L, 3, 1);
        lua_Integer j = lua_isnoneornil(L, 4) ? (lua_Integer)lua_rawlen(L, 1)
                                              : luaL_checkinteger(L, 4);
        if (j >= i)
            sandbox_charge(L, (double)j - (double)i + 1, what);
    } else if (!strcmp(what, "table.sort")) {
        double n = (double)lua_rawlen(L, 1);
        sandbox_charge(L, n > 1 ? n * ceil(log2(n)) : 1, what);
    }
    return call_original(L);
}

/* ---- xpcall ------------------------------------------------------------------------------- */

/* xpcall(f, handler, ...): pcall, then the handler on the error value, hooks on. */
static int meter_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 1);
    for (int i = 3; i <= n; i++)
        lua_pushvalue(L, i);
    int base = n + 1;
    if (lua_pcall(L, n >= 2 ? n - 2 : 0, LUA_MULTRET, 0) == LUA_OK) {
        lua_pushboolean(L, 1);
        lua_insert(L, base);
        return lua_gettop(L) - base + 1;
    }
    lua_pushvalue(L, 2);
    lua_insert(L, -2);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        lua_pushliteral(L, "error in error handling");
    }
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
}

/* Replaces lib[name] by fn with upvalues (original, "lib.name", flag). */
static void wrap(lua_State *L, int lib, const char *libname, const char *name,
                 lua_CFunction fn, int flag)
{
    lua_getfield(L, lib, name);
    lua_pushfstring(L, "%s.%s", libname, name);
    lua_pushboolean(L, flag);
    lua_pushcclosure(L, fn, 3);
    lua_setfield(L, lib, name);
}

void sandbox_meter_libs(lua_State *L, int env)
{
    lua_getfield(L, env, "string");
    int str = lua_gettop(L);
    wrap(L, str, "string", "rep", meter_rep, 0);
    wrap(L, str, "string", "find", meter_pattern, 1);
    static const char *const patterns[] = {"match", "gmatch", "gsub"};
    for (int i = 0; i < 3; i++)
        wrap(L, str, "string", patterns[i], meter_pattern, 0);
    lua_getfield(L, env, "table");
    int tab = lua_gettop(L);
    static const char *const tables[] = {"move", "concat", "sort", "insert", "remove",
                                         "unpack"};
    for (int i = 0; i < 6; i++)
        wrap(L, tab, "table", tables[i], meter_table, 0);
    lua_pushcfunction(L, meter_xpcall);
    lua_setfield(L, env, "xpcall");
    lua_pop(L, 2);
}
