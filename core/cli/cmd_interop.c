/* k3rt export CHECKPOINT --hf DIR [--dtype bf16|f32] [--shard-size SIZE]
 * k3rt import DIR --recipe OUT.lua [--out WEIGHTS_DIR]
 * k3rt import DIR --out RUN_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <k3rt/tensor.h>

#include "cli/commands.h"
#include "interop/hf_export.h"
#include "train/trainer.h"
#include "util/fs.h"

static void export_usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt export CHECKPOINT --hf DIR [options]\n"
            "  writes a Hugging Face folder (config.json in the Kimi-Linear layout,\n"
            "  model.safetensors or shards with model.safetensors.index.json) from a checkpoint;\n"
            "  names and layouts come from hf_names.json beside the plugins (docs/interop.md)\n"
            "  --dtype bf16|f32      tensor type (default bf16)\n"
            "  --shard-size BYTES    largest shard, e.g. 5e9 (default) or 2000000\n"
            "  --names FILE          the name table (default: hf_names.json beside the plugins)\n"
            "  --plugin-path DIRS    extra plugin directories (':'-separated), searched first\n");
}

static void import_usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt import DIR --recipe OUT.lua [--out WEIGHTS_DIR]\n"
            "       k3rt import DIR --out RUN_DIR\n"
            "  reads a Hugging Face folder in the Kimi-Linear layout and writes k3rt weights\n"
            "  (WEIGHTS_DIR/model.safetensors, default: DIR/k3rt) and a recipe whose\n"
            "  train.init_weights loads them: `k3rt eval OUT.lua` scores them, `k3rt train\n"
            "  OUT.lua` fine-tunes them. Without --recipe, RUN_DIR becomes a run folder:\n"
            "  RUN_DIR/import/{model.safetensors,recipe.lua} and the checkpoint\n"
            "  RUN_DIR/checkpoints/step_00000000 (the weights, fresh optimizer state), which\n"
            "  `k3rt eval RUN_DIR/checkpoints` scores and `k3rt train RUN_DIR/import/recipe.lua\n"
            "  --out RUN_DIR --resume` trains on from\n"
            "  --names FILE          the name table (default: hf_names.json beside the plugins)\n"
            "  --plugin-path DIRS    extra plugin directories (':'-separated), searched first\n");
}

/* The options both share; returns 1 when argv[*i] was one of them. */
static int common_arg(int argc, char **argv, int *i, hf_options *o)
{
    if (*i + 1 >= argc)
        return 0;
    if (!strcmp(argv[*i], "--names"))
        o->names = argv[++*i];
    else if (!strcmp(argv[*i], "--plugin-path"))
        o->plugin_path = argv[++*i];
    else
        return 0;
    return 1;
}

static int finish(const char *cmd, int rc, const k3rt_error *err)
{
    if (rc) {
        fprintf(stderr, "k3rt %s: %s\n", cmd, err->msg);
        return 1;
    }
    return 0;
}

int cmd_export(int argc, char **argv)
{
    hf_options o = {0};
    o.dtype = K3RT_BF16;
    o.shard_bytes = 5000000000LL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            export_usage(stdout);
            return 0;
        } else if (common_arg(argc, argv, &i, &o)) {
        } else if (!strcmp(a, "--hf") && has) {
            o.out = argv[++i];
        } else if (!strcmp(a, "--dtype") && has) {
            const char *d = argv[++i];
            if (strcmp(d, "bf16") && strcmp(d, "f32")) {
                fprintf(stderr, "k3rt export: --dtype expects bf16 or f32, got '%s'\n", d);
                return 2;
            }
            o.dtype = !strcmp(d, "bf16") ? K3RT_BF16 : K3RT_F32;
        } else if (!strcmp(a, "--shard-size") && has) {
            char *end;
            double v = strtod(argv[++i], &end);
            if (*end || !(v >= 1)) {
                fprintf(stderr, "k3rt export: --shard-size expects bytes >= 1, got '%s'\n",
                        argv[i]);
                return 2;
            }
            o.shard_bytes = (int64_t)v;
        } else if (a[0] != '-' && !o.src) {
            o.src = a;
        } else {
            fprintf(stderr, "k3rt export: unexpected argument '%s'\n", a);
            export_usage(stderr);
            return 2;
        }
    }
    if (!o.src || !o.out) {
        export_usage(stderr);
        return 2;
    }
    k3rt_error err = {0};
    return finish("export", hf_export(&o, &err), &err);
}

/* k3rt import DIR --out RUN_DIR: the weights and recipe under RUN_DIR/import, then the
 * trainer's own checkpoint writer saves step 0 of a run of that recipe (every manifest field,
 * fresh plugin and optimizer state) and stops before the first step. */
static int import_run(hf_options *o)
{
    char weights[2048], recipe[2048];
    snprintf(weights, sizeof weights, "%s/import", o->out);
    snprintf(recipe, sizeof recipe, "%s/import/recipe.lua", o->out);
    const char *run_dir = o->out;
    char ckpts[2048];
    snprintf(ckpts, sizeof ckpts, "%s/checkpoints", run_dir);
    if (fs_exists(weights) || fs_exists(ckpts)) {
        fprintf(stderr, "k3rt import: %s already holds %s; --out RUN_DIR makes a new run "
                "folder: choose another\n", run_dir, fs_exists(weights) ? "import/" :
                "checkpoints/");
        return 1;
    }
    o->out = weights;
    o->recipe_out = recipe;
    k3rt_error err = {0};
    int rc = hf_import(o, &err);
    if (rc)
        return finish("import", rc, &err);
    train_options t = {0};
    t.recipe_path = recipe;
    t.out_dir = run_dir;
    t.plugins.dirs = o->plugin_path;
    t.save_start = 1;
    t.quiet = 1;
    t.no_sample = 1;
    train_result res;
    rc = train_main(&t, &res, &err);
    if (!rc) {
        printf("wrote the checkpoint %s/checkpoints/step_00000000\n", run_dir);
        return 0;
    }
    fprintf(stderr, "k3rt import: %s\n  (no checkpoint written; the weights and recipe are in "
            "%s: fix the recipe, e.g. its data, and `k3rt train` it)\n", err.msg, weights);
    return 1;
}

int cmd_import(int argc, char **argv)
{
    hf_options o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            import_usage(stdout);
            return 0;
        } else if (common_arg(argc, argv, &i, &o)) {
        } else if (!strcmp(a, "--recipe") && has) {
            o.recipe_out = argv[++i];
        } else if (!strcmp(a, "--out") && has) {
            o.out = argv[++i];
        } else if (a[0] != '-' && !o.src) {
            o.src = a;
        } else {
            fprintf(stderr, "k3rt import: unexpected argument '%s'\n", a);
            import_usage(stderr);
            return 2;
        }
    }
    if (!o.src || (!o.recipe_out && !o.out)) {
        import_usage(stderr);
        return 2;
    }
    if (!o.recipe_out)
        return import_run(&o);
    char dflt[2048];
    if (!o.out) {
        snprintf(dflt, sizeof dflt, "%s/k3rt", o.src);
        o.out = dflt;
    }
    k3rt_error err = {0};
    return finish("import", hf_import(&o, &err), &err);
}
