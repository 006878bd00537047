/* k3rt export CHECKPOINT --hf DIR [--dtype bf16|f32] [--shard-size SIZE]
 * k3rt import DIR --recipe OUT.lua [--out WEIGHTS_DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <k3rt/tensor.h>

#include "cli/commands.h"
#include "interop/hf_export.h"

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
            "  reads a Hugging Face folder in the Kimi-Linear layout and writes k3rt weights\n"
            "  (WEIGHTS_DIR/model.safetensors, default: DIR/k3rt) and a recipe whose\n"
            "  train.init_weights loads them: `k3rt eval OUT.lua` scores them, `k3rt train\n"
            "  OUT.lua` fine-tunes them\n"
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
    if (!o.src || !o.recipe_out) {
        import_usage(stderr);
        return 2;
    }
    char dflt[2048];
    if (!o.out) {
        snprintf(dflt, sizeof dflt, "%s/k3rt", o.src);
        o.out = dflt;
    }
    k3rt_error err = {0};
    return finish("import", hf_import(&o, &err), &err);
}
