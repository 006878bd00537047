/* k3rt ablate SUITE.lua [options] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ablate/ablate.h"
#include "cli/commands.h"
#include "util/log.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt ablate SUITE.lua [options]\n"
            "  trains the suite's base recipe and each variant (same seed and data order), then\n"
            "  writes OUT/table.{md,json} and OUT/loss_vs_flops.{svg,png}\n"
            "  --set KEY=VALUE      override a value in every variant, e.g. to scale a suite up:\n"
            "                       --set train.steps=5000 --set plan.device='\"cuda\"'\n"
            "  --out DIR            output folder (default: out/<suite name>)\n"
            "  --runs DIR           keep the runs in DIR, named by their recipe and command,\n"
            "                       so suites share the runs they have in common (over the\n"
            "                       suite's `runs`)\n"
            "  --jobs N             train N variants at once on the CPU, splitting its threads\n"
            "                       (GPU runs train one at a time)\n"
            "  --reuse              keep runs already finished with the same recipe and command\n"
            "  --dry-run            check and plan every variant, print them, train nothing\n"
            "  --plugin-path DIRS   extra plugin directories (':'-separated), searched first\n"
            "  --quiet              no progress lines and no table on stdout\n");
}

/* The command line, for the table's record of how it was made. */
static char *joined(int argc, char **argv)
{
    size_t n = 16;
    for (int i = 0; i < argc; i++)
        n += strlen(argv[i]) + 3;
    char *s = malloc(n);
    if (!s)
        return NULL;
    size_t at = (size_t)snprintf(s, n, "k3rt");
    for (int i = 0; i < argc; i++)
        at += (size_t)snprintf(s + at, n - at, strchr(argv[i], ' ') || strchr(argv[i], '"') ||
                                                       strchr(argv[i], '\'')
                                                   ? " '%s'"
                                                   : " %s",
                               argv[i]);
    return s;
}

int cmd_ablate(int argc, char **argv)
{
    ablate_options o;
    memset(&o, 0, sizeof o);
    o.jobs = 1;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    if (!sets)
        return 1;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(sets);
            return 0;
        } else if (!strcmp(a, "--set") && has_value) {
            sets[o.n_overrides++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[o.n_overrides++] = a + 6;
        } else if (!strcmp(a, "--out") && has_value) {
            o.out_root = argv[++i];
        } else if (!strcmp(a, "--runs") && has_value) {
            o.runs_dir = argv[++i];
        } else if (!strcmp(a, "--jobs") && has_value) {
            char *end;
            long j = strtol(argv[++i], &end, 10);
            bad = *end || j < 1 || j > 1024;
            if (bad)
                fprintf(stderr, "k3rt ablate: --jobs expects 1 to 1024, got '%s'\n", argv[i]);
            o.jobs = (int)j;
        } else if (!strcmp(a, "--dry-run")) {
            o.dry_run = 1;
        } else if (!strcmp(a, "--reuse")) {
            o.reuse = 1;
        } else if (!strcmp(a, "--plugin-path") && has_value) {
            o.plugin_path = argv[++i];
        } else if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
        } else if (a[0] == '-' || o.suite_path) {
            fprintf(stderr, "k3rt ablate: unexpected argument '%s'\n", a);
            bad = 1;
        } else {
            o.suite_path = a;
        }
    }
    if (bad || !o.suite_path) {
        usage(stderr);
        free(sets);
        return 2;
    }
    o.overrides = sets;
    char *cmd = joined(argc, argv);
    o.command = cmd;
    k3rt_error err = {0};
    int rc = ablate_main(&o, &err);
    free(cmd);
    free(sets);
    if (rc) {
        fprintf(stderr, "k3rt ablate: %s\n", err.msg);
        return 1;
    }
    return 0;
}
