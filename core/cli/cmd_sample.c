/* k3rt sample CHECKPOINT: text from a trained model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/plugin_args.h"
#include "train/ckpt_model.h"
#include "train/train_internal.h"

int cmd_sample(int argc, char **argv)
{
    const char *path = NULL, *prompt = NULL, *device = NULL;
    int recompute = 0;
    long long bytes = -1, seed = -1, top_k = -1;
    double temperature = -1;
    plugin_sources plugins = {0};
    for (int i = 1, pa; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: k3rt sample CHECKPOINT [--bytes N] [--temperature T] [--top-k K]\n"
                   "                  [--seed S] [--prompt TEXT] [--device auto|cpu|cuda]\n"
                   "                  [--recompute] [--plugin-path DIRS] [--plugin PATH]...\n"
                   "Defaults come from the recipe's `sample` section. The model runs where the\n"
                   "recipe's plan.device says (auto: the GPU when there is one and every plugin\n"
                   "has a CUDA path) unless --device says otherwise. Tokens are decoded one at\n"
                   "a time with each mixer's cache, the context being the whole text (past\n"
                   "plan.seq_len too); --recompute, or a mixer without a cache, runs the model\n"
                   "over the last seq_len bytes for every byte instead.\n" CLI_PLUGIN_USAGE);
            return 0;
        } else if (!strcmp(a, "--bytes") && i + 1 < argc) {
            bytes = atoll(argv[++i]);
        } else if (!strcmp(a, "--temperature") && i + 1 < argc) {
            temperature = atof(argv[++i]);
        } else if (!strcmp(a, "--top-k") && i + 1 < argc) {
            top_k = atoll(argv[++i]);
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            seed = atoll(argv[++i]);
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            prompt = argv[++i];
        } else if ((pa = cli_device_arg("sample", argc, argv, &i, &device)) != 0) {
            if (pa < 0)
                return 2;
        } else if (!strcmp(a, "--recompute")) {
            recompute = 1;
        } else if ((pa = cli_plugin_arg(argc, argv, &i, &plugins)) != 0) {
            if (pa < 0)
                return 2;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "k3rt sample: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: k3rt sample CHECKPOINT [options]\n");
        return 2;
    }
    k3rt_error err = {0};
    ckpt_model c;
    int rc = ckpt_model_open(&c, path, &plugins, 0, device, &err);
    json_t *cfg = rc ? NULL : json_deep_copy(json_object_get(c.doc, "sample"));
    if (!rc && !cfg)
        cfg = json_object();
    if (cfg) {
        if (bytes >= 0) json_object_set_new(cfg, "bytes", json_integer(bytes));
        if (temperature >= 0) json_object_set_new(cfg, "temperature", json_real(temperature));
        if (top_k >= 0) json_object_set_new(cfg, "top_k", json_integer(top_k));
        if (seed >= 0) json_object_set_new(cfg, "seed", json_integer(seed));
        if (prompt) json_object_set_new(cfg, "prompt", json_string(prompt));
        if (recompute) json_object_set_new(cfg, "recompute", json_true());
    }
    char *text = NULL;
    sample_stats st;
    int64_t seq_len = rc ? 0 : json_integer_value(json_object_get(json_object_get(c.doc, "plan"),
                                                                  "seq_len"));
    if (!rc)
        rc = sample_text(&c.m, seq_len, cfg, &text, &st, &err);
    if (!rc) {
        char dev[64] = "cpu";
        if (c.device != K3RT_DEVICE_CPU)
            k3rt_device_name(c.device, dev, sizeof dev, NULL);
        printf("%s\n", text);
        fflush(stdout);
        /* the text alone goes to stdout (pipes); how it was made to stderr */
        fprintf(stderr, "k3rt sample: %lld bytes in %.2f s: %.1f tokens/s on %s (%s), %s%s%s\n",
                (long long)st.tokens, st.seconds, st.seconds > 0 ? st.tokens / st.seconds : 0.0,
                dev, k3rt_dtype_name(c.dtype),
                st.cached ? "cached decode" : "sliding context recomputed per byte",
                st.cached ? "" : ": ", st.cached ? "" : st.why);
        if (st.cached && st.context > seq_len)
            fprintf(stderr, "k3rt sample: the context grew to %lld bytes, past plan.seq_len = "
                    "%lld (the longest the model trained on): the caches keep all of it\n",
                    (long long)st.context, (long long)seq_len);
    }
    free(text);
    json_decref(cfg);
    ckpt_model_close(&c);
    if (rc) {
        fprintf(stderr, "k3rt sample: %s\n", err.msg);
        return 1;
    }
    return 0;
}
