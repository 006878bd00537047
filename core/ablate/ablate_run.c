/* The variants' training runs: one child `k3rt train` each, up to `jobs` at once, its output
 * in <run folder>/train.log. A finished run leaves <run folder>/ablate.json with its command
 * and identity (the hash of its resolved recipe and its command, --out left out), so --reuse
 * can skip it when neither changed — in a shared run folder, whichever suite trained it. */
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
#include "train/ckpt_dir.h"
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
static json_t *child_args(const ablate_ctx *c, const variant_run *r, const char *dir)
{
    json_t *a = json_array();
    json_array_append_new(a, json_string("train"));
    json_array_append_new(a, json_string(c->suite.base));
    if (c->threads > 0) {
        char t[64];
        snprintf(t, sizeof t, "plan.threads=%d", c->threads);
        json_array_append_new(a, json_string("--set"));
        json_array_append_new(a, json_string(t));
    }
    for (int k = 0; k < r->n_sets; k++) {
        json_array_append_new(a, json_string("--set"));
        json_array_append_new(a, json_string(r->sets[k]));
    }
    json_array_append_new(a, json_string("--out"));
    json_array_append_new(a, json_string(dir));
    /* The run's folder is ablate's: a new run there replaces the previous one. */
    json_array_append_new(a, json_string("--force"));
    json_array_append_new(a, json_string("--no-sample"));
    if (c->o->plugin_path) {
        json_array_append_new(a, json_string("--plugin-path"));
        json_array_append_new(a, json_string(c->o->plugin_path));
    }
    return a;
}

/* A run's identity: its resolved recipe and its command, wherever its folder is. */
static int run_key(const ablate_ctx *c, variant_run *r, k3rt_error *err)
{
    json_t *a = child_args(c, r, "");
    char *args = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    if (!args)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    size_t len = strlen(args) + sizeof r->recipe_sha + 2;
    char *text = malloc(len);
    if (text)
        snprintf(text, len, "%s\n%s", r->recipe_sha, args);
    free(args);
    if (!text)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    sha256_hex(text, strlen(text), r->key);
    free(text);
    return K3RT_OK;
}

int ablate_prepare_runs(ablate_ctx *c, k3rt_error *err)
{
    for (int i = 0; i < c->n; i++) {
        variant_run *r = &c->runs[i];
        K3RT_TRY(run_key(c, r, err));
        if (c->runs_dir) {
            /* 16 hex digits: 64 bits, far from colliding among one folder's runs */
            char name[17];
            snprintf(name, sizeof name, "%.16s", r->key);
            fs_join(r->dir, sizeof r->dir, c->runs_dir, name);
            for (int k = 0; k < i; k++)
                if (!strcmp(c->runs[k].key, r->key))
                    return k3rt_fail(err, K3RT_ERR_INVALID, "variants '%s' and '%s' are the "
                                     "same run (the same recipe and command): drop one",
                                     c->runs[k].v->name, r->v->name);
        } else {
            fs_join(r->dir, sizeof r->dir, c->root, r->v->name);
        }
        r->args = child_args(c, r, r->dir);
        if (!r->args)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    return K3RT_OK;
}

/* A finished run of the same identity in the run's folder (its training time kept). */
static int reusable(variant_run *r)
{
    char path[2400];
    fs_join(path, sizeof path, r->dir, "ablate.json");
    json_t *prev = json_load_file(path, 0, NULL);
    const char *key = json_string_value(json_object_get(prev, "key"));
    int same = key && !strcmp(key, r->key);
    if (same)
        r->seconds = json_number_value(json_object_get(prev, "seconds"));
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

/* A run about to train again is not finished until it finishes: should it fail, a previous
 * ablate.json of the same identity must not let --reuse take its folder. */
static int forget(const variant_run *r, k3rt_error *err)
{
    char path[2400];
    fs_join(path, sizeof path, r->dir, "ablate.json");
    if (unlink(path) != 0 && errno != ENOENT)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return K3RT_OK;
}

/* Records how the child ended; a clean exit leaves ablate.json for --reuse. */
static int finish(variant_run *r, int status, k3rt_error *err)
{
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        char path[2400];
        fs_join(path, sizeof path, r->dir, "ablate.json");
        json_t *rec = json_pack("{s:s, s:s, s:O, s:f}", "key", r->key, "recipe_sha256",
                                r->recipe_sha, "args", r->args, "seconds", r->seconds);
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
    int jobs = c->jobs;
    slot *slots = calloc((size_t)jobs, sizeof *slots);
    int rc = slots ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int next = 0, running = 0;
    while (!rc && (next < c->n || running)) {
        while (!rc && running < jobs && next < c->n) {
            variant_run *r = &c->runs[next];
            if (c->o->reuse && reusable(r)) {
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
                rc = forget(r, err);
            if (!rc)
                rc = spawn(exe, r, r->args, &slots[s].pid, err);
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
                rc = finish(r, status, err);
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
    free(slots);
    return rc;
}
