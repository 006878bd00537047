/* A model rebuilt from a checkpoint (its manifest's validated recipe) with its weights
 * loaded: what `k3rt eval` and `k3rt sample` work on. */
#ifndef K3RT_CKPT_MODEL_H
#define K3RT_CKPT_MODEL_H

#include "model/model.h"
#include "plugin/named.h"
#include "train/data.h"

typedef struct ckpt_model {
    registry reg;
    k3rt_stream *stream;
    model m;
    json_t *manifest;   /* the checkpoint's manifest */
    const json_t *doc;  /* its "config" (the validated recipe document) */
    int device, dtype;  /* where the model runs, in which compute dtype */
    char dir[1200];
} ckpt_model;

/* path: a checkpoint directory or a run's checkpoints root (newest complete checkpoint).
 * device: "cpu", "cuda", or "auto" (the GPU when there is one and every plugin of the model has
 * a CUDA path); NULL follows the recipe's plan.device. On the GPU the compute dtype is the
 * recipe's plan.dtype (auto: bf16). */
int ckpt_model_open(ckpt_model *c, const char *path, const plugin_sources *plugins, int threads,
                    const char *device, k3rt_error *err);
/* path: a recipe whose train.init_weights names the weights (what `k3rt import` writes);
 * device as for ckpt_model_open. */
int ckpt_model_from_recipe(ckpt_model *c, const char *path, const plugin_sources *plugins,
                           int threads, const char *device, k3rt_error *err);
void ckpt_model_close(ckpt_model *c);

/* grad_dump.c (`k3rt eval --grads`): one training forward and backward on the micro-batch the
 * checkpoint's next step takes first from train, written to path as safetensors: `tokens`,
 * `targets` [B, T] i32, `loss` [2] f64 (mean token loss, auxiliary loss), `grad.<param>`
 * for every parameter and `routing.layers.<i>.selected` [B*T, top_k] i32. */
int grad_dump(ckpt_model *c, const token_stream *train, const char *path, k3rt_error *err);

#endif
