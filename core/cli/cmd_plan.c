/* k3rt plan RECIPE.lua --gpus N [--gpu-mem 141GB] [--node-gpus 8] */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "plan/plan.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt plan RECIPE.lua --gpus N [options]\n"
            "  sizes the recipe's model on N GPUs without allocating it: total and active\n"
            "  parameters by component, FLOPs per token, memory per GPU under plan.{dp,ep,cp}\n"
            "  (dp x ep x cp must equal N), expert all-to-all and context-parallel state bytes\n"
            "  --gpus N             GPUs in the job (required)\n"
            "  --gpu-mem SIZE       memory per GPU, e.g. 141GB (default), 80GiB, 1.4e11\n"
            "  --node-gpus N        GPUs per node (default 8)\n"
            "  --set KEY=VALUE      override a recipe value, e.g. --set plan.ep=64\n"
            "  --json               print the plan as JSON\n"
            "  --plugin-path DIRS   extra plugin directories (':'-separated), searched first\n");
}

/* "141GB", "141G", "80GiB", "1.4e11" (bytes); 0 when malformed. */
static double parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    while (isspace((unsigned char)*end))
        end++;
    struct { const char *suffix; double scale; } units[] = {
        {"", 1},          {"B", 1},          {"KB", 1e3},          {"K", 1e3},
        {"MB", 1e6},      {"M", 1e6},        {"GB", 1e9},          {"G", 1e9},
        {"TB", 1e12},     {"T", 1e12},       {"KiB", 1024.0},      {"MiB", 1048576.0},
        {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix))
            return v > 0 ? v * units[i].scale : 0;
    return 0;
}

static int positive_int(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1 || v > 1 << 30)
        return 0;
    *out = (int)v;
    return 1;
}

int cmd_plan(int argc, char **argv)
{
    plan_options o;
    memset(&o, 0, sizeof o);
    o.gpu_mem = 141e9;
    o.node_gpus = 8;
    int json = 0;
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
        } else if (!strcmp(a, "--gpus") && has_value) {
            bad = !positive_int(argv[++i], &o.gpus);
        } else if (!strcmp(a, "--gpu-mem") && has_value) {
            o.gpu_mem = parse_size(argv[++i]);
            bad = !(o.gpu_mem > 0);
        } else if (!strcmp(a, "--node-gpus") && has_value) {
            bad = !positive_int(argv[++i], &o.node_gpus);
        } else if (!strcmp(a, "--set") && has_value) {
            sets[o.n_overrides++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[o.n_overrides++] = a + 6;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--plugin-path") && has_value) {
            o.plugin_path = argv[++i];
        } else if (a[0] == '-' || o.recipe_path) {
            fprintf(stderr, "k3rt plan: unexpected argument '%s'\n", a);
            bad = 2;
        } else {
            o.recipe_path = a;
        }
        if (bad == 1)
            fprintf(stderr, "k3rt plan: bad value '%s' for %s\n", argv[i], a);
    }
    if (!bad && (!o.recipe_path || !o.gpus)) {
        fprintf(stderr, "k3rt plan: %s\n", o.recipe_path ? "--gpus N is required"
                                                         : "a recipe is required");
        bad = 2;
    }
    if (bad) {
        usage(stderr);
        free(sets);
        return 2;
    }
    o.overrides = sets;
    plan_report r;
    k3rt_error err = {0};
    int rc = plan_compute(&o, &r, &err);
    free(sets);
    if (rc) {
        fprintf(stderr, "k3rt plan: %s\n", err.msg);
        return 1;
    }
    if (json) {
        json_t *j = plan_json(&r);
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(j);
        if (!text)
            return 1;
        printf("%s\n", text);
        free(text);
    } else {
        plan_print(stdout, &r);
    }
    return 0;
}
