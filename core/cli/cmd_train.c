/* k3rt train RECIPE.lua [options] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/plugin_args.h"
#include "plot/heatmap.h"
#include "plot/loss_chart.h"
#include "train/trainer.h"
#include "util/log.h"

/* The run's charts, drawn by core/plot (the engine draws nothing itself). */
static int draw_loss(void *user, const char *path, const char *title, const loss_history *h,
                     k3rt_error *err)
{
    (void)user;
    return loss_chart_write_svg(h, title, path, err);
}

static int draw_depth_weights(void *user, const char *path, const train_matrix *m,
                              k3rt_error *err)
{
    (void)user;
    heatmap_spec spec = {m->title, m->row_title, m->col_title, m->row_labels, m->col_labels,
                         m->lo, m->hi};
    return heatmap_write_svg(path, m->values, m->rows, m->cols, &spec, err);
}

static const train_charts CHARTS = {NULL, draw_loss, draw_depth_weights};

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt train RECIPE.lua [options]\n"
            "  --set KEY=VALUE      override a recipe value (Lua expression), e.g.\n"
            "                       --set model.ffn.top_k=8 --set optimizer.lr=1e-3\n"
            "  --resume             continue the run in OUT from its newest usable checkpoint\n"
            "  --force              start afresh in an OUT that holds another run's\n"
            "                       checkpoints, removing them (refused without it)\n"
            "  --out DIR            output directory (default: the recipe's `out`)\n"
            "  --dry-run            print parameters, optimizer rules and memory, then stop\n"
            CLI_PLUGIN_USAGE
            "  --quiet              no progress lines\n"
            "  --no-sample          skip the text sample at the end\n"
            "  --stop-after STEP    checkpoint and stop after STEP (resume later with --resume)\n"
            "  --profile N          time N steps, after 2 warm-up steps, per module instance\n"
            "                       and direction (forward, backward) and per engine part\n"
            "                       (data, embedding, norms, head+loss, statistics,\n"
            "                       communication, gradient norm, optimizer), plus the gap to\n"
            "                       the step's wall time; prints the table once and writes it\n"
            "                       into metrics.jsonl as {\"step\", \"profile\"}; the run then\n"
            "                       continues as without it (same numbers). CUDA events on a\n"
            "                       GPU (read after each profiled step), the host clock on the\n"
            "                       CPU; shared ops are inside their callers' parts; rank 0's\n"
            "                       view; a run shorter than N + 2 steps warms up less\n");
}

int cmd_train(int argc, char **argv)
{
    train_options o;
    memset(&o, 0, sizeof o);
    o.charts = &CHARTS;
    const char **sets = calloc((size_t)argc, sizeof *sets);
    if (!sets)
        return 1;
    for (int i = 1, pa; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(sets);
            return 0;
        } else if (!strcmp(a, "--set") && i + 1 < argc) {
            sets[o.n_overrides++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[o.n_overrides++] = a + 6;
        } else if (!strcmp(a, "--resume")) {
            o.resume = 1;
        } else if (!strcmp(a, "--force")) {
            o.force = 1;
        } else if (!strcmp(a, "--out") && i + 1 < argc) {
            o.out_dir = argv[++i];
        } else if (!strcmp(a, "--dry-run")) {
            o.dry_run = 1;
        } else if ((pa = cli_plugin_arg(argc, argv, &i, &o.plugins)) != 0) {
            if (pa < 0) {
                free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            log_set_level(LOG_QUIET);
        } else if (!strcmp(a, "--stop-after") && i + 1 < argc) {
            o.stop_after = atoll(argv[++i]);
        } else if (!strcmp(a, "--profile") && i + 1 < argc) {
            char *end;
            o.profile = strtoll(argv[++i], &end, 10);
            if (*end || o.profile < 1) {
                fprintf(stderr, "k3rt train: --profile takes a number of steps >= 1, not '%s'\n",
                        argv[i]);
                free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--no-sample")) {
            o.no_sample = 1;
        } else if (a[0] == '-' || o.recipe_path) {
            fprintf(stderr, "k3rt train: unexpected argument '%s'\n", a);
            usage(stderr);
            free(sets);
            return 2;
        } else {
            o.recipe_path = a;
        }
    }
    if (!o.recipe_path) {
        usage(stderr);
        free(sets);
        return 2;
    }
    o.overrides = sets;
    k3rt_error err = {0};
    train_result res;
    int rc = train_main(&o, &res, &err);
    free(sets);
    if (rc) {
        fprintf(stderr, "k3rt train: %s\n", err.msg);
        return 1;
    }
    if (!o.dry_run && !o.quiet && res.rank == 0)
        printf("done: %lld steps in %.1f s, final train loss %.4f, validation loss %.4f\n",
               (long long)res.steps_done, res.seconds, res.final_train_loss, res.final_val_loss);
    return 0;
}
