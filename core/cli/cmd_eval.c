/* k3rt eval CHECKPOINT: validation loss of a checkpoint on its recipe's data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/plugin_args.h"
#include "train/ckpt_model.h"
#include "train/train_internal.h"

static int tok_is_shards(const json_t *data)
{
    const char *tok = json_string_value(json_object_get(data, "tokenizer"));
    return tok && !strcmp(tok, "shards");
}

int cmd_eval(int argc, char **argv)
{
    const char *path = NULL;
    const char *grads = NULL, *device = "cpu";
    long long windows = 0;
    plugin_sources plugins = {0};
    for (int i = 1, pa; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: k3rt eval CHECKPOINT [--windows N] [--grads FILE] [--device D] "
                   "[--plugin-path DIRS] [--plugin PATH]...\n"
                   "CHECKPOINT is a checkpoint directory or a run's checkpoints directory "
                   "(the newest complete one is used), or a recipe (.lua) whose\n"
                   "train.init_weights names the weights (k3rt import writes one).\n"
                   "--grads FILE: instead, one training forward and backward on the micro-batch "
                   "the next step would take first; writes the batch, the loss, every "
                   "parameter's gradient and the expert choices to FILE (safetensors).\n"
                   "--device auto|cpu|cuda: where the model runs (default cpu; on the GPU in\n"
                   "the recipe's plan.dtype, as training runs it).\n"
                   CLI_PLUGIN_USAGE);
            return 0;
        } else if (!strcmp(argv[i], "--windows") && i + 1 < argc) {
            windows = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--grads") && i + 1 < argc) {
            grads = argv[++i];
        } else if ((pa = cli_device_arg("eval", argc, argv, &i, &device)) != 0) {
            if (pa < 0)
                return 2;
        } else if ((pa = cli_plugin_arg(argc, argv, &i, &plugins)) != 0) {
            if (pa < 0)
                return 2;
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            fprintf(stderr, "k3rt eval: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: k3rt eval CHECKPOINT\n");
        return 2;
    }
    k3rt_error err = {0};
    ckpt_model c;
    token_stream train = {0}, val = {0};
    size_t len = strlen(path);
    int rc = len > 4 && !strcmp(path + len - 4, ".lua")
                 ? ckpt_model_from_recipe(&c, path, &plugins, 0, device, &err)
                 : ckpt_model_open(&c, path, &plugins, 0, device, &err);
    const json_t *data = rc ? NULL : json_object_get(c.doc, "data");
    const json_t *plan = rc ? NULL : json_object_get(c.doc, "plan");
    if (!rc && grads) {
        if (tok_is_shards(data))
            rc = data_load_shard(json_string_value(json_object_get(data, "train")), &train, &err);
        else
            rc = data_load_bytes(json_string_value(json_object_get(data, "path")),
                                 json_number_value(json_object_get(data, "val_fraction")),
                                 &train, &val, &err);
        if (!rc)
            rc = grad_dump(&c, &train, grads, &err);
    } else if (!rc) {
        if (tok_is_shards(data))
            rc = data_load_shard(json_string_value(json_object_get(data, "val")), &val, &err);
        else
            rc = data_load_bytes(json_string_value(json_object_get(data, "path")),
                                 json_number_value(json_object_get(data, "val_fraction")),
                                 &train, &val, &err);
    }
    if (!rc && !grads)
        rc = data_check_val(&val, json_string_value(json_object_get(data, tok_is_shards(data)
                                                                              ? "val" : "path")),
                            &err);
    double acc[2] = {0, 0};
    if (!rc && !grads)
        rc = eval_windows(&c.m, &val, json_integer_value(json_object_get(plan, "micro_batch")),
                          json_integer_value(json_object_get(plan, "seq_len")), 0, 1, windows,
                          json_is_true(json_object_get(data, "packed_documents")), acc, &err);
    if (!rc && !grads)
        printf("%s: validation loss %.4f nats/token over %.0f tokens\n", c.dir,
               acc[0] / acc[1], acc[1]);
    token_stream_free(&train);
    token_stream_free(&val);
    ckpt_model_close(&c);
    if (rc) {
        fprintf(stderr, "k3rt eval: %s\n", err.msg);
        return 1;
    }
    return 0;
}
