/* Rebuilding a model from a checkpoint (ckpt_model.h). */
#include "train/ckpt_model.h"

#include <string.h>

#include "train/ckpt_dir.h"
#include "train/ckpt_manifest.h"
#include "train/ckpt_verify.h"
#include "recipe/recipe.h"
#include "train/train_internal.h"
#include "util/fs.h"

/* Adds the plugin of spec to missing when it has no CUDA path. */
static void note_no_cuda(registry *reg, const json_t *spec, int kind, char *missing, size_t len,
                         size_t *at)
{
    const plugin_entry *e = NULL;
    k3rt_error ignored;
    if (!spec || json_is_null(spec) || model_resolve_spec(reg, spec, kind, "model", &e, &ignored))
        return;  /* a spec that does not resolve fails when the model is built */
    if (!(e->desc.caps & K3RT_CAP_CUDA) && *at < len)
        *at += (size_t)snprintf(missing + *at, len - *at, "%s%s", *at ? ", " : "",
                                e->desc.name);
}

/* The plugins of a model document without a CUDA path, named into missing ("" when none). */
static void cuda_missing(registry *reg, const json_t *model_doc, char *missing, size_t len)
{
    size_t at = 0;
    missing[0] = '\0';
    const json_t *spec;
    const char *letter;
    json_object_foreach((json_t *)json_object_get(model_doc, "mixers"), letter, spec)
        note_no_cuda(reg, spec, K3RT_KIND_ATTENTION, missing, len, &at);
    note_no_cuda(reg, json_object_get(model_doc, "dense_ffn"), K3RT_KIND_MOE, missing, len, &at);
    note_no_cuda(reg, json_object_get(model_doc, "ffn"), K3RT_KIND_MOE, missing, len, &at);
    note_no_cuda(reg, json_object_get(model_doc, "balancer"), K3RT_KIND_BALANCER, missing, len,
                 &at);
    note_no_cuda(reg, json_object_get(model_doc, "residual"), K3RT_KIND_RESIDUAL, missing, len,
                 &at);
}

/* Where the model runs: `want` is "cpu", "cuda" or "auto" (NULL: the recipe's plan.device);
 * "auto" takes the GPU when there is one and every plugin has a CUDA path. The dtype is the
 * recipe's plan.dtype where that device has it (auto: bf16 on the GPU, f32 on the CPU). */
static int choose_device(ckpt_model *c, const json_t *model_doc, const char *want,
                         k3rt_error *err)
{
    const json_t *plan = json_object_get(c->doc, "plan");
    const char *dtype = json_string_value(json_object_get(plan, "dtype"));
    if (!want)
        want = json_string_value(json_object_get(plan, "device"));
    char missing[512];
    cuda_missing(&c->reg, model_doc, missing, sizeof missing);
    int gpus = k3rt_cuda_device_count();
    c->device = K3RT_DEVICE_CPU;
    if (want && !strcmp(want, "cuda")) {
        if (gpus == 0)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "device cuda: no CUDA device is "
                             "available to this build");
        if (missing[0])
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "device cuda: these plugins have no "
                             "CUDA path: %s", missing);
        c->device = 0;
    } else if ((!want || !strcmp(want, "auto")) && gpus > 0 && !missing[0]) {
        c->device = 0;
    }
    int cuda = c->device != K3RT_DEVICE_CPU;
    c->dtype = cuda ? (dtype && !strcmp(dtype, "f32") ? K3RT_F32 : K3RT_BF16)
                    : (dtype && !strcmp(dtype, "f64") ? K3RT_F64 : K3RT_F32);
    return K3RT_OK;
}

/* The model of c->doc (and the manifest's balancer in effect, when there is one) on the
 * device `want` asks for (choose_device). */
static int build(ckpt_model *c, int threads, const char *want, k3rt_error *err)
{
    const json_t *mdoc = json_object_get(c->doc, "model");
    json_t *model_doc = json_deep_copy(mdoc);
    if (!model_doc)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    const json_t *bal = json_object_get(c->manifest, "balancer");
    if (bal)
        json_object_set(model_doc, "balancer", (json_t *)bal);
    int rc = choose_device(c, model_doc, want, err);
    if (!rc)
        rc = k3rt_stream_create(c->device, K3RT_STREAM_COMPUTE, &c->stream, err);
    if (!rc && threads > 0)
        k3rt_stream_set_threads(c->stream, threads);
    model_options mo = {c->dtype, c->device, c->stream, NULL,
                        (uint64_t)json_integer_value(json_object_get(
                            json_object_get(c->doc, "train"), "seed")), 0, NULL, NULL};
    if (!rc)
        rc = model_build(&c->m, model_doc, &c->reg, &mo, err);
    json_decref(model_doc);
    return rc;
}

int ckpt_model_open(ckpt_model *c, const char *path, const plugin_sources *plugins, int threads,
                    const char *device, k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    K3RT_TRY(ckpt_resolve(path, c->dir, sizeof c->dir, err));
    K3RT_TRY(ckpt_read_manifest(c->dir, &c->manifest, err));
    K3RT_TRY(registry_open(&c->reg, plugins, err));
    K3RT_TRY(ckpt_check_manifest(c->manifest, &c->reg, c->dir, err));
    c->doc = json_object_get(c->manifest, "config");
    K3RT_TRY(ckpt_verify(c->dir, c->manifest, err));
    K3RT_TRY(build(c, threads, device, err));
    /* The weights and every plugin state the forward depends on (a balancer's selection
     * bias changes the routing). */
    char file[1300];
    K3RT_TRY(ckpt_load_weights(&c->m, fs_join(file, sizeof file, c->dir, "model.safetensors"),
                               err));
    return ckpt_load_states(&c->m, NULL, fs_join(file, sizeof file, c->dir, "state.safetensors"),
                            err);
}

int ckpt_model_from_recipe(ckpt_model *c, const char *path, const plugin_sources *plugins,
                           int threads, const char *device, k3rt_error *err)
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
    K3RT_TRY(build(c, threads, device, err));
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
