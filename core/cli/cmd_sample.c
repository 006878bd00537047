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
    const char *path = NULL, *prompt = NULL;
    long long bytes = -1, seed = -1, top_k = -1;
    double temperature = -1;
    plugin_sources plugins = {0};
    for (int i = 1, pa; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: k3rt sample CHECKPOINT [--bytes N] [--temperature T] [--top-k K]\n"
                   "                  [--seed S] [--prompt TEXT] [--plugin-path DIRS]\n"
                   "                  [--plugin PATH]...\n"
                   "Defaults come from the recipe's `sample` section.\n" CLI_PLUGIN_USAGE);
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
    int rc = ckpt_model_open(&c, path, &plugins, 0, &err);
    json_t *cfg = rc ? NULL : json_deep_copy(json_object_get(c.doc, "sample"));
    if (!rc && !cfg)
        cfg = json_object();
    if (cfg) {
        if (bytes >= 0) json_object_set_new(cfg, "bytes", json_integer(bytes));
        if (temperature >= 0) json_object_set_new(cfg, "temperature", json_real(temperature));
        if (top_k >= 0) json_object_set_new(cfg, "top_k", json_integer(top_k));
        if (seed >= 0) json_object_set_new(cfg, "seed", json_integer(seed));
        if (prompt) json_object_set_new(cfg, "prompt", json_string(prompt));
    }
    char *text = NULL;
    if (!rc)
        rc = sample_text(&c.m,
                         json_integer_value(json_object_get(json_object_get(c.doc, "plan"),
                                                            "seq_len")),
                         cfg, &text, &err);
    if (!rc)
        printf("%s\n", text);
    free(text);
    json_decref(cfg);
    ckpt_model_close(&c);
    if (rc) {
        fprintf(stderr, "k3rt sample: %s\n", err.msg);
        return 1;
    }
    return 0;
}
