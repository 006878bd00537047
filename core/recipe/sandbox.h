/* The recipe sandbox: one Lua state per recipe with a byte-capped allocator, an instruction
 * budget, a wall-clock limit and a whitelisted environment. Every entry into Lua goes through
 * sandbox_run, a protected call with a traceback handler, so no error can reach lua_atpanic.
 *
 * Limits per entry into Lua (recipe_limits): the instruction hook counts VM instructions and
 * reads the clock; C functions that could loop for long in one call are metered
 * (sandbox_lib.c: string.rep, the pattern functions, the table library, xpcall's handler) and
 * charge or refuse their work up front; and a watchdog thread (watchdog.h) ends the process
 * if an entry still runs past its time limit plus a grace period, whatever it is doing. */
#ifndef K3RT_RECIPE_SANDBOX_H
#define K3RT_RECIPE_SANDBOX_H

#include <stdint.h>
#include <lua.h>
#include <k3rt/errors.h>

#include "recipe/recipe.h"
#include "recipe/watchdog.h"

#define SANDBOX_POS_MAX 192 /* "file:line:" positions kept for messages */

typedef struct sandbox {
    lua_State *L;
    size_t used, limit;     /* bytes held by Lua and the cap */
    int64_t budget, spent;  /* VM instructions per entry and those spent in this entry */
    double seconds, deadline; /* time limit per entry; time_now() at which this one ends */
    int over_memory, over_budget, over_time;
    watchdog *wd;
    char last_src[64];      /* where the count hook last saw the VM, for memory messages */
    int last_line;
    char name[256];         /* the recipe, for messages without a line */
} sandbox;

/* Creates the state and its environment. sb must stay at a fixed address until
 * sandbox_close (the allocator points to it). */
int sandbox_open(sandbox *sb, const recipe_limits *limits, const char *name, k3rt_error *err);
void sandbox_close(sandbox *sb);

/* Calls fn(L) protected, with ud as its single argument (a light userdata), the instruction
 * budget reset and the stack emptied before and after. A Lua error becomes err: the message,
 * plus a stack traceback of the recipe's own frames when there is more than one. */
int sandbox_run(sandbox *sb, lua_CFunction fn, void *ud, k3rt_error *err);

/* Inside a protected call: loads text as a chunk named chunkname ("@file" or "=name"), text
 * only, with the sandbox environment as its _ENV. Pushes the function and returns LUA_OK, or
 * pushes the error message and returns the load status. */
int sandbox_load(lua_State *L, const char *text, size_t len, const char *chunkname);
/* Pushes the sandbox environment table. */
void sandbox_push_env(lua_State *L);
/* The Lua allocator under the sandbox's memory cap (ud: the sandbox; sandbox_budget.c). */
void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* Counts every HOOK_EVERY instructions against the budget and the clock from now on. */
void sandbox_start_counting(lua_State *L);
/* Inside a C function of the sandbox: counts `work` steps (the iterations the function is
 * about to run) against the instruction budget and reads the clock; raises the limit error,
 * naming `what`, when the work does not fit in what is left or the time is up. */
void sandbox_charge(lua_State *L, double work, const char *what);
/* Raises msg (with the calling recipe line) as a limit error: the entry fails with
 * K3RT_ERR_LIMIT and no pcall can go on. */
void sandbox_limit_error(lua_State *L, const char *msg);
/* Bytes left under the memory cap. */
size_t sandbox_memory_left(lua_State *L);
/* Installs the metered replacements into the string and table libraries and the
 * environment's xpcall (sandbox_lib.c; inside open_env). */
void sandbox_meter_libs(lua_State *L, int env);

/* Raises a Lua error with a formatted message and no position added. */
int sandbox_raise(lua_State *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
