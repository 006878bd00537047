/* Where a recipe trains: the trainer's rule, which `k3rt ablate` asks too before it starts
 * its runs (two runs sharing one GPU would each measure half its speed).
 *
 * plan.device "cpu": the CPU. "cuda": the GPU, or an error when this build sees no CUDA
 * device, a plugin of the recipe has no CUDA path, or plan.dp > 1. "auto": the GPU when there
 * is one, every plugin has a CUDA path and dp = 1; the CPU otherwise. */
#ifndef K3RT_TRAIN_DEVICE_CHOICE_H
#define K3RT_TRAIN_DEVICE_CHOICE_H

#include <k3rt/errors.h>

#include "recipe/recipe.h"

typedef struct device_choice {
    int cuda;              /* 1: trains on cuda:0 */
    char missing[512];     /* the recipe's plugins without a CUDA path, ", "-separated */
} device_choice;

/* gpus: the CUDA devices this process sees (k3rt_cuda_device_count()). */
int device_choose(const recipe *rec, int gpus, device_choice *out, k3rt_error *err);

#endif
