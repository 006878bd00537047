/* k3rt plot RUN_DIR... [--out FILE.svg] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "plot/runs_plot.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt plot RUN_DIR... [--out FILE.svg]\n"
            "  draws the runs' training and validation loss against tokens and against\n"
            "  training FLOPs, and MaxVio per MoE layer against the step (runs with MoE\n"
            "  layers), from each RUN_DIR/metrics.jsonl, as panels of one SVG\n"
            "  --out FILE.svg       where to write it (default: runs.svg)\n");
}

int cmd_plot(int argc, char **argv)
{
    const char *out = "runs.svg";
    const char **dirs = calloc((size_t)argc, sizeof *dirs);
    if (!dirs)
        return 1;
    int n = 0, bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(dirs);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "k3rt plot: unexpected argument '%s'\n", argv[i]);
            bad = 1;
        } else {
            dirs[n++] = argv[i];
        }
    }
    if (bad || !n) {
        usage(stderr);
        free(dirs);
        return 2;
    }
    k3rt_error err = {0};
    int rc = runs_plot_write(dirs, n, out, &err);
    free(dirs);
    if (rc) {
        fprintf(stderr, "k3rt plot: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s (%d run%s)\n", out, n, n > 1 ? "s" : "");
    return 0;
}
