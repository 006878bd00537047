/* What the activation manager (model/actman.h) and the planner (plan/plan_act.h) share without
 * a model: the glob over tensor class names and the fp8 storage format (the policy names are
 * the recipe's, recipe/act_keys.h).
 *
 * A saved tensor class is "<slot>.<tag>.<part>": slot `mixer` (tag: the pattern letter, as in
 * "mixer.K.activations") or `ffn` (tag: the plugin, "ffn.latent_moe.saved"); part is the name
 * the plugin's saved() declared, or "saved" for a plugin that declares one raw block. */
#ifndef K3RT_MODEL_ACT_POLICY_H
#define K3RT_MODEL_ACT_POLICY_H

#include <stdint.h>

#include "recipe/act_keys.h"

/* 1 when name matches pattern: '*' any run of characters (dots included), '?' one. */
int act_glob(const char *pattern, const char *name);
/* fp8 storage: e4m3 codes, then one f32 scale (amax / 448) per tile of ACT_FP8_TILE
 * consecutive elements. A tile of zeros has scale 0 and decodes to zeros. */
#define ACT_FP8_TILE 128
int64_t act_fp8_bytes(int64_t numel);
/* src: numel values of dtype (K3RT_F32 or K3RT_F64, host memory) -> dst (act_fp8_bytes). */
void act_fp8_store(const void *src, int dtype, int64_t numel, void *dst);
void act_fp8_load(const void *src, int64_t numel, void *dst, int dtype);

#endif
