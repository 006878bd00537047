/* k3rt check-plugin PATH|NAME: the conformance harness for plugins of every kind. Loads the
 * plugin as the host does (refusals name the file and both ABI versions), then runs the checks
 * of its kind (check_*.c) and prints one line per check and a verdict; exits 1 when any check
 * failed, 2 on a usage error. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/check.h"
#include "cli/commands.h"

typedef void (*ck_group_fn)(check_ctx *c);

typedef struct ck_settings {
    int fork;      /* run each group in a child process */
    int timeout;   /* seconds per group */
} ck_settings;

static void run_inline(check_ctx *c, ck_group_fn fn)
{
    k3rt_error err = {0};
    if (k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &c->cpu, &err)) {
        ck_error(c, "setup", &err);
        return;
    }
    k3rt_stream_set_threads(c->cpu, c->threads);
    fn(c);
    k3rt_stream_destroy(c->cpu);
    c->cpu = NULL;
}

static int read_all(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got == len;
}

/* Runs fn in a child; its counts come back through a pipe. A child that dies is a failure of
 * the group, named by its signal. */
static void run_group(check_ctx *c, const char *name, ck_group_fn fn, const ck_settings *s)
{
    if (!s->fork) {
        run_inline(c, fn);
        return;
    }
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) != 0) {
        run_inline(c, fn);
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        run_inline(c, fn);
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        alarm((unsigned)s->timeout);
        check_ctx local = *c;
        local.passed = local.failed = local.skipped = 0;
        run_inline(&local, fn);
        int counts[3] = {local.passed, local.failed, local.skipped};
        fflush(stdout);
        ssize_t w = write(fd[1], counts, sizeof counts);
        _exit(w == (ssize_t)sizeof counts ? 0 : 3);
    }
    close(fd[1]);
    int counts[3] = {0, 0, 0}, status = 0;
    int got = read_all(fd[0], counts, sizeof counts);
    close(fd[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (got) {
        c->passed += counts[0], c->failed += counts[1], c->skipped += counts[2];
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            return;
    }
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        ck_report(c, CK_FAIL, name, "did not finish within %d s (--timeout)", s->timeout);
    else if (WIFSIGNALED(status))
        ck_report(c, CK_FAIL, name, "the plugin crashed: signal %d (%s); run with --no-fork "
                  "under a debugger to see where", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        ck_report(c, CK_FAIL, name, "the checks exited with status %d",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt check-plugin PATH|NAME [options]\n"
            "Conformance checks of one plugin of any kind; exits 1 when a check fails.\n"
            "  --config JSON|@file   plugin options (default {}: every option at its default)\n"
            "  --batch B --seq T --d-model D   shapes of the checks (default 2, 8, 16)\n"
            "  --layers L            residual: decoder layers of the toy stack (default 2)\n"
            "  --experts E --top-k K balancer: the simulated MoE layer (default 8, 2)\n"
            "  --tol X               finite differences: largest relative error (1e-5)\n"
            "  --fd-eps H            finite differences: step (1e-4, 5-point stencil)\n"
            "  --samples N           finite differences: entries per tensor (8)\n"
            "  --cuda-tol X          CPU vs CUDA: largest relative rms (1e-4)\n"
            "  --seed N --threads N  (default 1, 2)\n"
            "  --timeout S           seconds per group of checks (default 300)\n"
            "  --no-fork             run in-process (for a debugger)\n"
            "  --plugin-path DIRS    where to look a NAME up\n");
}

static void header(const check_ctx *c, const char *path)
{
    const k3rt_plugin_descriptor *d = &c->e->desc;
    char caps[192], *cfg = json_dumps(c->config, JSON_COMPACT | JSON_SORT_KEYS);
    plugin_caps_str(c->e, 1, caps, sizeof caps);
    printf("k3rt check-plugin %s\n", path);
    printf("  plugin  %s %s: %s, ABI %u.%u (host %d.%d)\n", d->name, d->version ? d->version : "?",
           k3rt_kind_name(d->kind), d->abi_major, d->abi_minor, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    printf("  caps    %s\n", caps[0] ? caps : "(none)");
    printf("  config  %s\n", cfg ? cfg : "{}");
    if (d->kind == K3RT_KIND_BALANCER)
        printf("  shapes  %lld tokens a micro-batch, top-%d of %d experts\n",
               (long long)(c->B * c->T), c->top_k, c->experts);
    else if (d->kind != K3RT_KIND_OPTIMIZER)
        printf("  shapes  B=%lld T=%lld d=%lld%s; seed %llu, %d threads\n", (long long)c->B,
               (long long)c->T, (long long)c->d,
               d->kind == K3RT_KIND_RESIDUAL ? ", 2 sublayers a layer" : "",
               (unsigned long long)c->seed, c->threads);
    free(cfg);
}

static void run_checks(check_ctx *c, const ck_settings *s)
{
    run_group(c, "descriptor", ck_descriptor, s);
    run_group(c, "config", ck_config, s);
    switch (c->e->desc.kind) {
    case K3RT_KIND_ATTENTION:
    case K3RT_KIND_MOE:
        run_group(c, "flops", ck_flops, s);
        run_group(c, "mixer", ck_mixer, s);
        run_group(c, "decode", ck_decode, s);
        run_group(c, "cuda", ck_mixer_cuda, s);
        run_group(c, "decode cuda", ck_decode_cuda, s);
        break;
    case K3RT_KIND_RESIDUAL:
        run_group(c, "flops", ck_flops, s);
        run_group(c, "residual", ck_residual, s);
        break;
    case K3RT_KIND_BALANCER: run_group(c, "balancer", ck_balancer, s); break;
    case K3RT_KIND_OPTIMIZER: run_group(c, "optimizer", ck_optimizer, s); break;
    }
}

static int load(const char *target, const char *plugin_path, registry *reg,
                const plugin_entry **e, k3rt_error *err)
{
    memset(reg, 0, sizeof *reg);
    if (strchr(target, '/') || strstr(target, ".so"))
        return registry_load_file(reg, target, e, err);
    K3RT_TRY(registry_init(reg, plugin_path, err));
    *e = registry_find(reg, target, 0);
    return *e ? K3RT_OK : registry_not_found(reg, target, 0, "k3rt check-plugin", err);
}

int cmd_check_plugin(int argc, char **argv)
{
    check_ctx c;
    memset(&c, 0, sizeof c);
    c.B = 2, c.T = 8, c.d = 16, c.vocab = 32, c.layers = 2, c.experts = 8, c.top_k = 2;
    c.seed = 1, c.tol = 1e-5, c.fd_eps = 1e-4, c.cuda_tol = 1e-4, c.samples = 8, c.threads = 2;
    ck_settings s = {1, 300};
    const char *target = NULL, *config = NULL, *plugin_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-fork")) {
            s.fork = 0;
            continue;
        } else if (a[0] != '-' && !target) {
            target = a;
            continue;
        } else if (!v) {
            fprintf(stderr, "k3rt check-plugin: unexpected argument '%s'\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--plugin-path")) plugin_path = v;
        else if (!strcmp(a, "--batch")) c.B = atoll(v);
        else if (!strcmp(a, "--seq")) c.T = atoll(v);
        else if (!strcmp(a, "--d-model")) c.d = atoll(v);
        else if (!strcmp(a, "--layers")) c.layers = atoi(v);
        else if (!strcmp(a, "--experts")) c.experts = atoi(v);
        else if (!strcmp(a, "--top-k")) c.top_k = atoi(v);
        else if (!strcmp(a, "--tol")) c.tol = atof(v);
        else if (!strcmp(a, "--fd-eps")) c.fd_eps = atof(v);
        else if (!strcmp(a, "--samples")) c.samples = atoi(v);
        else if (!strcmp(a, "--cuda-tol")) c.cuda_tol = atof(v);
        else if (!strcmp(a, "--seed")) c.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--threads")) c.threads = atoi(v);
        else if (!strcmp(a, "--timeout")) s.timeout = atoi(v);
        else {
            fprintf(stderr, "k3rt check-plugin: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!target || c.B < 1 || c.T < 1 || c.d < 1 || c.layers < 1 || c.samples < 1 ||
        c.threads < 1 || s.timeout < 1 || !(c.tol > 0) || !(c.fd_eps > 0) || !(c.cuda_tol > 0)) {
        usage(stderr);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    k3rt_error err = {0};
    json_t *cfg = NULL;
    if (cli_load_config(config, &cfg, &err)) {
        fprintf(stderr, "k3rt check-plugin: %s\n", err.msg);
        return 2;
    }
    c.config = cfg;
    registry reg;
    if (load(target, plugin_path, &reg, &c.e, &err)) {
        printf("k3rt check-plugin %s\n", target);
        ck_report(&c, CK_FAIL, "load", "%s", err.msg);
    } else {
        header(&c, c.e->path);
        run_checks(&c, &s);
    }
    printf("result: %s (%d passed, %d failed, %d skipped)\n", c.failed ? "FAIL" : "PASS",
           c.passed, c.failed, c.skipped);
    registry_free(&reg);
    json_decref(cfg);
    return c.failed ? 1 : 0;
}
