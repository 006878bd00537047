/* Where a recipe trains (device_choice.h). */
#include "train/device_choice.h"

#include <stdio.h>
#include <string.h>

#include "plugin/registry.h"

static void add_missing(device_choice *out, size_t *at, const recipe *rec, const json_t *spec)
{
    const plugin_entry *e = spec ? recipe_spec_plugin(rec, spec) : NULL;
    if (e && !(e->desc.caps & K3RT_CAP_CUDA) && *at < sizeof out->missing)
        *at += (size_t)snprintf(out->missing + *at, sizeof out->missing - *at, "%s%s",
                                *at ? ", " : "", e->desc.name);
}

int device_choose(const recipe *rec, int gpus, device_choice *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    const json_t *doc = recipe_json(rec), *model = json_object_get(doc, "model");
    const json_t *plan = json_object_get(doc, "plan");
    const char *device = json_string_value(json_object_get(plan, "device"));
    json_int_t dp = json_integer_value(json_object_get(plan, "dp"));
    size_t at = 0;
    const char *letter;
    const json_t *mix;
    json_object_foreach((json_t *)json_object_get(model, "mixers"), letter, mix)
        add_missing(out, &at, rec, mix);
    const char *slots[] = {"ffn", "dense_ffn", "balancer", "residual"};
    for (int i = 0; i < 4; i++)
        add_missing(out, &at, rec, json_object_get(model, slots[i]));
    add_missing(out, &at, rec, json_object_get(doc, "optimizer"));
    int want_cuda = device && !strcmp(device, "cuda");
    int want_cpu = device && !strcmp(device, "cpu");
    if (want_cuda && gpus == 0)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.device = \"cuda\" but no CUDA device "
                         "is available to this build");
    if (want_cuda && at)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.device = \"cuda\" but these plugins "
                         "have no CUDA path: %s", out->missing);
    if (want_cuda && dp > 1)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.device = \"cuda\" with plan.dp = %d: "
                         "data parallelism across GPUs (NCCL) is not supported yet; use dp = 1",
                         (int)dp);
    out->cuda = want_cuda || (!want_cpu && gpus > 0 && !at && dp == 1);
    return K3RT_OK;
}
