/* Rebuilding a model from a checkpoint (ckpt_model.h). */
#include "train/ckpt_model.h"

#include <string.h>

#include "train/ckpt_dir.h"
#include "train/ckpt_manifest.h"
#include "train/ckpt_verify.h"
#include "recipe/recipe.h"
#include "train/train_internal.h"
#include "util/fs.h"

/* The model of c->doc (and the manifest's balancer in effect, when there is one) on a CPU
 * stream. */
static int build(ckpt_model *c, int threads, k3rt_error *err)
{
    const json_t *mdoc = json_object_get(c->doc, "model");
    K3RT_TRY(k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &c->stream, err));
    if (threads > 0)
        k3rt_stream_set_threads(c->stream, threads);
    json_t *model_doc = json_deep_copy(mdoc);
    const json_t *bal = json_object_get(c->manifest, "balancer");
    if (bal)
        json_object_set(model_doc, "balancer", (json_t *)bal);
    const json_t *plan = json_object_get(c->doc, "plan");
    const char *dtype = json_string_value(json_object_get(plan, "dtype"));
    model_options mo = {dtype && !strcmp(dtype, "f64") ? K3RT_F64 : K3RT_F32, K3RT_DEVICE_CPU,
                        c->stream, NULL,
                        (uint64_t)json_integer_value(json_object_get(
                            json_object_get(c->doc, "train"), "seed")), 0, NULL, NULL};
    int rc = model_build(&c->m, model_doc, &c->reg, &mo, err);
    json_decref(model_doc);
    return rc;
}

int ckpt_model_open(ckpt_model *c, const char *path, const plugin_sources *plugins, int threads,
                    k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    K3RT_TRY(ckpt_resolve(path, c->dir, sizeof c->dir, err));
    K3RT_TRY(ckpt_read_manifest(c->dir, &c->manifest, err));
    K3RT_TRY(registry_open(&c->reg, plugins, err));
    K3RT_TRY(ckpt_check_manifest(c->manifest, &c->reg, c->dir, err));
    c->doc = json_object_get(c->manifest, "config");
    K3RT_TRY(ckpt_verify(c->dir, c->manifest, err));
    K3RT_TRY(build(c, threads, err));
    /* The weights and every plugin state the forward depends on (a balancer's selection
     * bias changes the routing). */
    char file[1300];
    K3RT_TRY(ckpt_load_weights(&c->m, fs_join(file, sizeof file, c->dir, "model.safetensors"),
                               err));
    return ckpt_load_states(&c->m, NULL, fs_join(file, sizeof file, c->dir, "state.safetensors"),
                            err);
}

int ckpt_model_from_recipe(ckpt_model *c, const char *path, const plugin_sources *plugins,
                           int threads, k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", path);
    K3RT_TRY(registry_open(&c->reg, plugins, err));
    recipe *rec;
    K3RT_TRY(recipe_load(path, &c->reg, NULL, 0, NULL, &rec, err));
    c->manifest = json_pack("{s:O}", "config", recipe_json(rec));
    recipe_free(rec);
    if (!c->manifest)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    c->doc = json_object_get(c->manifest, "config");
    if (!json_string_value(json_object_get(json_object_get(c->doc, "train"), "init_weights")))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: train.init_weights names no weights file "
                         "(a recipe is evaluated with the weights it loads)", path);
    K3RT_TRY(build(c, threads, err));
    return load_init_weights(&c->m, c->doc, err);
}

void ckpt_model_close(ckpt_model *c)
{
    if (c->m.params)
        model_free(&c->m);
    k3rt_stream_destroy(c->stream);
    registry_free(&c->reg);
    json_decref(c->manifest);
    memset(c, 0, sizeof *c);
}
