/* --set a.b.c=value: evaluate the value in the sandbox, walk the path, store it. */
#include "recipe/overrides.h"

#include <ctype.h>
#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/schema.h"
#include "recipe/sugar.h"

#define MAX_COMPS 8
#define MAX_NAMES 260

typedef struct job {
    registry *reg;
    int root_ref;
    const char *arg;
} job;

static int is_identifier(const char *s)
{
    if (!isalpha((unsigned char)*s) && *s != '_')
        return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return 0;
    return 1;
}

static int all_digits(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* Evaluates "return <value>" and leaves the result on the stack; returns 1 for `nil`, which
 * removes the key. */
static int evaluate(lua_State *L, const char *arg, const char *path, const char *value)
{
    char chunk[600];
    snprintf(chunk, sizeof chunk, "=--set %s", path);
    const char *code = lua_pushfstring(L, "return %s", value);
    if (sandbox_load(L, code, strlen(code), chunk) != LUA_OK)
        sandbox_raise(L, "%s (values are Lua expressions: 8, 1e-3, true, \"text\" with the "
                      "quotes protected from the shell, k3.NAME{...})", lua_tostring(L, -1));
    lua_call(L, 0, 1);
    if (!lua_isnil(L, -1))
        return 0;
    if (!strcmp(value, "nil"))
        return 1;
    if (is_identifier(value))
        sandbox_raise(L, "--set %s: '%s' is not a value; a string needs quotes, e.g. "
                      "--set '%s=\"%s\"'", arg, value, path, value);
    return sandbox_raise(L, "--set %s: the value evaluated to nil (write nil to remove the "
                         "key)", arg);
}

/* Valid names below the container at comps[0..depth) whose table is at cur; `label` names
 * the container in messages. Returns a count or SCHEMA_*. */
static int names_at(lua_State *L, registry *reg, const char *const *comps, int depth, int cur,
                    const char **names, char *label, size_t len)
{
    int kind;
    int r = schema_names(comps, depth, names, MAX_NAMES, &kind);
    if (r != SCHEMA_SPEC)
        return r;
    spec_info info;
    if (!sugar_spec_info(L, cur, &info))
        return SCHEMA_MAP; /* not a spec: validation will say so */
    const plugin_entry *e = schema_resolve(reg, info.name, info.path, kind);
    if (!e)
        e = schema_resolve(reg, info.name, info.path, 0);
    size_t at = strlen(label);
    snprintf(label + at, len - at, " (%s)", info.name);
    return e ? schema_plugin_names(e, names, MAX_NAMES) : SCHEMA_MAP;
}

/* Pushes the key comps[depth] in the container at cur, after checking it is valid there. */
static void push_key(lua_State *L, const char *arg, const char *key, int r,
                     const char **names, const char *label)
{
    if (r == SCHEMA_LEAF)
        sandbox_raise(L, "--set %s: %s is not a table; nothing can be set inside it", arg,
                      label);
    if (r == SCHEMA_LIST) {
        if (!all_digits(key))
            sandbox_raise(L, "--set %s: %s is a list; name an item by its position (%s.1)", arg,
                          label, label);
        lua_pushinteger(L, atoll(key));
        return;
    }
    if (r >= 0) {
        int known = 0;
        for (int i = 0; i < r && !known; i++)
            known = !strcmp(key, names[i]);
        if (!known) {
            k3rt_error e = {0};
            schema_unknown_key(label, key, names, r, &e);
            sandbox_raise(L, "--set %s: %s", arg, e.msg);
        }
    }
    lua_pushstring(L, key);
}

static int apply(lua_State *L)
{
    job *j = lua_touserdata(L, 1);
    const char *arg = j->arg, *eq = strchr(arg, '=');
    char path[512];
    if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof path)
        sandbox_raise(L, "--set %s: expected key.path=value, e.g. --set model.ffn.top_k=8", arg);
    const char *start = arg, *end = eq;
    while (start < end && isspace((unsigned char)*start))
        start++;
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    snprintf(path, sizeof path, "%.*s", (int)(end - start), start);
    const char *value = eq + 1;
    while (isspace((unsigned char)*value))
        value++;
    char comp_buf[512];
    snprintf(comp_buf, sizeof comp_buf, "%s", path);
    const char *comps[MAX_COMPS];
    int n = 0;
    for (char *p = comp_buf, *dot; p; p = dot ? dot + 1 : NULL) {
        dot = strchr(p, '.');
        if (dot)
            *dot = '\0';
        if (!*p || n == MAX_COMPS)
            sandbox_raise(L, "--set %s: '%s' is not a key path (names joined by dots)", arg,
                          path);
        comps[n++] = p;
    }
    int remove = evaluate(L, arg, path, value);
    int v = lua_gettop(L);

    lua_rawgeti(L, LUA_REGISTRYINDEX, j->root_ref);
    int cur = lua_gettop(L);
    char label[640] = "top level";
    for (int i = 0; i < n; i++) {
        const char *names[MAX_NAMES];
        int r = names_at(L, j->reg, comps, i, cur, names, label, sizeof label);
        push_key(L, arg, comps[i], r, names, label);
        int key = lua_gettop(L);
        snprintf(label, sizeof label, "%.*s", (int)(comps[i] + strlen(comps[i]) - comp_buf),
                 path);
        if (i == n - 1) {
            lua_pushvalue(L, key);
            if (remove)
                lua_pushnil(L);
            else
                lua_pushvalue(L, v);
            lua_rawset(L, cur);
            break;
        }
        lua_pushvalue(L, key);
        lua_rawget(L, cur);
        if (lua_isnil(L, -1)) {
            /* Sections, maps and lists may be created; items and specs must be given whole. */
            int kind, below = schema_names(comps, i + 1, names, MAX_NAMES, &kind);
            if (r == SCHEMA_MAP || r == SCHEMA_LIST ||
                (below < 0 && below != SCHEMA_MAP && below != SCHEMA_LIST))
                sandbox_raise(L, "--set %s: %s is not set in the recipe; give it whole "
                              "(e.g. --set '%s=%s')", arg, label, label,
                              below == SCHEMA_SPEC ? "k3.NAME{...}" : "{...}");
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, key);
            lua_pushvalue(L, -2);
            lua_rawset(L, cur);
        } else if (!lua_istable(L, -1)) {
            sandbox_raise(L, "--set %s: %s is a %s, not a table", arg, label,
                          luaL_typename(L, -1));
        }
        cur = lua_gettop(L);
    }
    return 0;
}

int overrides_apply(sandbox *sb, registry *reg, int root_ref, const char *arg, k3rt_error *err)
{
    job j = {reg, root_ref, arg};
    return sandbox_run(sb, apply, &j, err);
}
