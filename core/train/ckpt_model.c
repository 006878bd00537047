/* Rebuilding a model from a checkpoint (ckpt_model.h). */
#include "train/ckpt_model.h"

#include <string.h>

#include "train/checkpoint.h"
#include "train/safetensors.h"
#include "util/fs.h"

int ckpt_model_open(ckpt_model *c, const char *path, const char *plugin_path, int threads,
                    k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    K3RT_TRY(ckpt_resolve(path, c->dir, sizeof c->dir, err));
    K3RT_TRY(ckpt_read_manifest(c->dir, &c->manifest, err));
    c->doc = json_object_get(c->manifest, "config");
    const json_t *mdoc = json_object_get(c->doc, "model");
    if (!json_is_object(mdoc))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s/manifest.json: no config.model", c->dir);
    K3RT_TRY(registry_init(&c->reg, plugin_path, err));
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
                            json_object_get(c->doc, "train"), "seed")), 0};
    int rc = model_build(&c->m, model_doc, &c->reg, &mo, err);
    json_decref(model_doc);
    K3RT_TRY(rc);
    char file[1300];
    st_file *f;
    K3RT_TRY(st_open(fs_join(file, sizeof file, c->dir, "model.safetensors"), &f, err));
    for (int i = 0; i < c->m.n_params && !rc; i++) {
        const param_slot *p = &c->m.params[i];
        const st_entry *e = st_find(f, p->name);
        if (!e) {
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: missing parameter %s", file, p->name);
            break;
        }
        int same = e->ndim == p->param.ndim;
        for (int k = 0; same && k < e->ndim; k++)
            same = e->shape[k] == p->param.shape[k];
        if (!same || !k3rt_dtype_is_float(e->dtype))
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: parameter %s does not match the model "
                           "its manifest describes", file, p->name);
        else
            rc = k3rt_convert(p->param.data, p->param.dtype, e->data, e->dtype, p->numel, err);
    }
    st_close(f);
    return rc;
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
