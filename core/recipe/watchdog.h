/* The recipe sandbox's clock of last resort: a thread that ends the process when one entry
 * into Lua runs past a hard deadline.
 *
 * The sandbox stops recipe code itself, cleanly, at its time limit: the instruction hook and
 * the metered C functions read the clock (sandbox.c, sandbox_lib.c). Code the hook never
 * sees — a C function that loops, a path nobody has found yet — cannot be interrupted safely
 * inside the process (unwinding out of the middle of a C call can leave a lock held or the Lua
 * state inconsistent). So this thread, which depends on nothing the recipe can reach, ends
 * the process instead: it writes one line to stderr and exits with status 1. Chosen over
 * evaluating recipes in a child process under RLIMIT_CPU because on_step runs in the middle of
 * training with state that must persist from call to call, and RLIMIT_CPU would count the
 * training's own CPU time (it is per process). Checkpoints are committed atomically, so ending
 * the process loses nothing committed. */
#ifndef K3RT_RECIPE_WATCHDOG_H
#define K3RT_RECIPE_WATCHDOG_H

#include <k3rt/errors.h>

typedef struct watchdog watchdog;

int watchdog_start(watchdog **out, k3rt_error *err);
/* From now until watchdog_disarm: at `deadline` (time_now() seconds) the process ends with
 * `message` (copied). */
void watchdog_arm(watchdog *w, double deadline, const char *message);
void watchdog_disarm(watchdog *w);
void watchdog_stop(watchdog *w);

#endif
