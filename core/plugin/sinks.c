/* Sinks through which plugins declare parameters and saved activations and hand over state
 * and statistics. */
#include "plugin/sinks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int k3rt_param_sink_add(k3rt_param_sink *sink, const k3rt_param_decl *decl, k3rt_error *err)
{
    if (!decl || decl->struct_size < offsetof(k3rt_param_decl, flags))
        return k3rt_fail(err, K3RT_ERR_ABI, "declare_params: parameter declaration too small");
    if (!decl->name || !*decl->name)
        return k3rt_fail(err, K3RT_ERR_INVALID, "declare_params: a parameter has no name");
    if (decl->ndim < 1 || decl->ndim > K3RT_MAX_DIMS)
        return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s: ndim %d outside 1..4",
                         decl->name, decl->ndim);
    for (int i = 0; i < decl->ndim; i++)
        if (decl->shape[i] <= 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s: dimension %d is %lld",
                             decl->name, i, (long long)decl->shape[i]);
    if (decl->role <= 0 || decl->role >= K3RT_ROLE_COUNT_)
        return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s: unknown role %d", decl->name,
                         decl->role);
    if (decl->role == K3RT_ROLE_HEAD_MATRIX &&
        (decl->ndim != 2 || decl->heads < 1 || decl->head_axis < 0 || decl->head_axis > 1 ||
         decl->shape[decl->head_axis] % decl->heads != 0))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "parameter %s: a head matrix needs 2 dims and heads dividing the "
                         "split axis", decl->name);
    if (decl->role == K3RT_ROLE_EXPERT_MATRIX &&
        (decl->ndim != 3 || decl->experts != decl->shape[0]))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "parameter %s: an expert matrix is [experts, out, in] with experts "
                         "equal to the first dimension", decl->name);
    /* A residual declares one relative name per layer (decl->layer tells them apart). */
    for (int i = 0; i < sink->n; i++)
        if (!strcmp(sink->items[i].name, decl->name) && sink->items[i].decl.layer == decl->layer)
            return k3rt_fail(err, K3RT_ERR_INVALID, "parameter %s declared twice", decl->name);
    if (sink->n == sink->cap) {
        int cap = sink->cap ? sink->cap * 2 : 16;
        param_sink_item *p = realloc(sink->items, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "declare_params: out of memory");
        sink->items = p;
        sink->cap = cap;
        for (int i = 0; i < sink->n; i++)  /* the names moved with the items */
            sink->items[i].decl.name = sink->items[i].name;
    }
    param_sink_item *it = &sink->items[sink->n++];
    memset(&it->decl, 0, sizeof it->decl);
    memcpy(&it->decl, decl, decl->struct_size < sizeof it->decl ? decl->struct_size
                                                                 : sizeof it->decl);
    it->decl.struct_size = sizeof it->decl;
    snprintf(it->name, sizeof it->name, "%s", decl->name);
    it->decl.name = it->name;
    return K3RT_OK;
}

int k3rt_tensor_sink_add(k3rt_tensor_sink *sink, const char *name, k3rt_tensor t, int reduce,
                         k3rt_error *err)
{
    if (!name || !*name)
        return k3rt_fail(err, K3RT_ERR_INVALID, "a state or statistic tensor has no name");
    if (sink->n == sink->cap) {
        int cap = sink->cap ? sink->cap * 2 : 16;
        tensor_sink_item *p = realloc(sink->items, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "tensor sink: out of memory");
        sink->items = p;
        sink->cap = cap;
    }
    tensor_sink_item *it = &sink->items[sink->n++];
    snprintf(it->name, sizeof it->name, "%s", name);
    it->t = t;
    it->reduce = reduce;
    return K3RT_OK;
}

int k3rt_saved_sink_add(k3rt_saved_sink *sink, const k3rt_saved_decl *decl, k3rt_error *err)
{
    if (!decl || decl->struct_size < offsetof(k3rt_saved_decl, recompute_flops))
        return k3rt_fail(err, K3RT_ERR_ABI, "saved: declaration too small");
    if (!decl->name || !*decl->name)
        return k3rt_fail(err, K3RT_ERR_INVALID, "saved: a part has no name");
    if (decl->bytes < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "saved part %s: %lld bytes", decl->name,
                         (long long)decl->bytes);
    if ((decl->flags & K3RT_SAVED_GEMM_ONLY) && !k3rt_dtype_is_float(decl->dtype))
        return k3rt_fail(err, K3RT_ERR_INVALID, "saved part %s: GEMM_ONLY needs a float dtype",
                         decl->name);
    if (decl->flags & ~(uint32_t)(K3RT_SAVED_GEMM_ONLY | K3RT_SAVED_RECOMPUTE))
        return k3rt_fail(err, K3RT_ERR_INVALID, "saved part %s: unknown flags 0x%x", decl->name,
                         decl->flags);
    if (sink->n == sink->cap) {
        int cap = sink->cap ? sink->cap * 2 : 8;
        saved_sink_item *p = realloc(sink->items, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "saved: out of memory");
        sink->items = p;
        sink->cap = cap;
        for (int i = 0; i < sink->n; i++)  /* the names moved with the items */
            sink->items[i].decl.name = sink->items[i].name;
    }
    saved_sink_item *it = &sink->items[sink->n++];
    memset(&it->decl, 0, sizeof it->decl);
    memcpy(&it->decl, decl, decl->struct_size < sizeof it->decl ? decl->struct_size
                                                                 : sizeof it->decl);
    it->decl.struct_size = sizeof it->decl;
    snprintf(it->name, sizeof it->name, "%s", decl->name);
    it->decl.name = it->name;
    return K3RT_OK;
}

