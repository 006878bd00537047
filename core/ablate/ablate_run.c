/* The variants' training runs: one child `k3rt train` each, up to `jobs` at once, its output
 * in <variant>/train.log. A finished run leaves <variant>/ablate.json with its command, so
 * --reuse can skip it when the command is unchanged. */
#define _GNU_SOURCE /* readlink */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ablate/ablate_internal.h"
#include "backend/backend.h"
#include "util/fs.h"
#include "util/log.h"

extern char **environ;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The child's arguments as a JSON array of strings (argv[0] left out: it is this binary). */
static json_t *child_args(const ablate_ctx *c, const variant_run *r, int threads)
{
    json_t *a = json_array();
    json_array_append_new(a, json_string("train"));
    json_array_append_new(a, json_string(c->suite.base));
    if (threads > 0) {
        char t[64];
        snprintf(t, sizeof t, "plan.threads=%d", threads);
        json_array_append_new(a, json_string("--set"));
        json_array_append_new(a, json_string(t));
    }
    for (int k = 0; k < r->n_sets; k++) {
        json_array_append_new(a, json_string("--set"));
        json_array_append_new(a, json_string(r->sets[k]));
    }
    json_array_append_new(a, json_string("--out"));
    json_array_append_new(a, json_string(r->dir));
    /* The variant's folder is the suite's: a new run there replaces the previous one. */
    json_array_append_new(a, json_string("--force"));
    json_array_append_new(a, json_string("--no-sample"));
    if (c->o->plugin_path) {
        json_array_append_new(a, json_string("--plugin-path"));
        json_array_append_new(a, json_string(c->o->plugin_path));
    }
    return a;
}

static int reusable(const variant_run *r, const json_t *args)
{
    char path[2400];
    fs_join(path, sizeof path, r->dir, "ablate.json");
    json_t *prev = json_load_file(path, 0, NULL);
    int same = prev && json_equal(json_object_get(prev, "args"), args);
    json_decref(prev);
    return same;
}

static int spawn(const char *exe, const variant_run *r, const json_t *args, pid_t *pid,
                 k3rt_error *err)
{
    size_t n = json_array_size(args);
    char **argv = calloc(n + 2, sizeof *argv);
    if (!argv)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    argv[0] = (char *)exe;
    for (size_t i = 0; i < n; i++)
        argv[i + 1] = (char *)json_string_value(json_array_get(args, i));
    char log_path[2400];
    fs_join(log_path, sizeof log_path, r->dir, "train.log");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int e = posix_spawn(pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    if (e)
        return k3rt_fail(err, K3RT_ERR_IO, "variant '%s': cannot start %s: %s", r->v->name, exe,
                         strerror(e));
    return K3RT_OK;
}

/* Records how the child ended; a clean exit leaves ablate.json for --reuse. */
static int finish(variant_run *r, int status, const json_t *args, k3rt_error *err)
{
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        char path[2400];
        fs_join(path, sizeof path, r->dir, "ablate.json");
        json_t *rec = json_pack("{s:O, s:f}", "args", args, "seconds", r->seconds);
        char *text = rec ? json_dumps(rec, JSON_INDENT(2)) : NULL;
        json_decref(rec);
        int rc = text ? fs_write_atomic(path, text, strlen(text), err)
                      : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        free(text);
        return rc;
    }
    r->failed = 1;
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    snprintf(r->failure, sizeof r->failure, WIFEXITED(status) ? "exit status %d"
                                                              : "killed by signal %d",
             WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return K3RT_OK;
}

typedef struct slot {
    pid_t pid;
    int run;
    double t0;
} slot;

int ablate_run_all(ablate_ctx *c, k3rt_error *err)
{
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return k3rt_fail(err, K3RT_ERR_IO, "cannot find the k3rt executable (/proc/self/exe)");
    exe[len] = '\0';
    int jobs = c->o->jobs > 0 ? c->o->jobs : 1;
    /* Concurrent CPU runs share the cores instead of each taking all of them. */
    int threads = jobs > 1 ? k3rt_cpu_threads() / jobs : 0;
    threads = jobs > 1 && threads < 1 ? 1 : threads;
    json_t **args = calloc((size_t)c->n, sizeof *args);
    slot *slots = calloc((size_t)jobs, sizeof *slots);
    int rc = args && slots ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int next = 0, running = 0;
    while (!rc && (next < c->n || running)) {
        while (!rc && running < jobs && next < c->n) {
            variant_run *r = &c->runs[next];
            args[next] = child_args(c, r, threads);
            if (c->o->reuse && reusable(r, args[next])) {
                r->reused = 1;
                if (!c->o->quiet)
                    log_info("[%d/%d] %s: reusing the finished run in %s", next + 1, c->n,
                             r->v->name, r->dir);
                next++;
                continue;
            }
            int s = 0;
            while (slots[s].pid)
                s++;
            rc = fs_mkdirs(r->dir, err);
            if (!rc)
                rc = spawn(exe, r, args[next], &slots[s].pid, err);
            if (rc)
                break;
            slots[s].run = next;
            slots[s].t0 = now();
            if (!c->o->quiet)
                log_info("[%d/%d] %s: training (log: %s/train.log)", next + 1, c->n, r->v->name,
                         r->dir);
            running++;
            next++;
        }
        if (rc || !running)
            continue;
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno != EINTR)
                rc = k3rt_fail(err, K3RT_ERR_IO, "waiting for a variant: %s", strerror(errno));
            continue;
        }
        for (int s = 0; s < jobs; s++)
            if (slots[s].pid == pid) {
                variant_run *r = &c->runs[slots[s].run];
                r->seconds = now() - slots[s].t0;
                rc = finish(r, status, args[slots[s].run], err);
                if (!c->o->quiet)
                    log_info("%s: %s after %.0f s", r->v->name, r->failed ? r->failure
                                                                       : "finished", r->seconds);
                slots[s].pid = 0;
                running--;
            }
    }
    /* On an error of our own, wait for the children already started. */
    for (int s = 0; slots && s < jobs; s++)
        if (slots[s].pid)
            waitpid(slots[s].pid, NULL, 0);
    for (int i = 0; args && i < c->n; i++)
        json_decref(args[i]);
    free(args);
    free(slots);
    return rc;
}
