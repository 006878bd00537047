/* The recipe `k3rt import` writes: the model document as Lua (k3.NAME{...} for every module,
 * all of its options spelt out), the plan and data of the run that exported it when
 * config.json's k3rt block names them (else placeholders to edit), AdamW,
 * train.init_weights naming the imported weights and train.init_state the imported module state
 * (the balancers' biases) when there is one. */
#ifndef K3RT_INTEROP_HF_RECIPE_H
#define K3RT_INTEROP_HF_RECIPE_H

#include <jansson.h>
#include <k3rt/errors.h>

/* k3: config.json's "k3rt" object or NULL; state: NULL when there is none; src: the folder
 * imported (for the comment). */
int hf_write_recipe(const char *path, const json_t *model, const json_t *k3,
                    const char *weights, const char *state, const char *src, k3rt_error *err);

#endif
