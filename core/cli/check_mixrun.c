/* check-plugin: running one attention or moe instance (check_mix.h). */
#include <string.h>
#include <stdlib.h>

#include "cli/check_mix.h"

static void *dev_alloc(const mix_run *r, size_t bytes, k3rt_error *err)
{
    return k3rt_alloc(r->device, bytes ? bytes : 1, err);
}

static void dev_free(const mix_run *r, void *p)
{
    if (p)
        k3rt_free(r->device, p);
}

int mix_upload(mix_run *r, void *dev, const void *host, size_t bytes, k3rt_error *err)
{
    return ck_copy(r->mod.s, dev, r->device, host, K3RT_DEVICE_CPU, bytes, err);
}

/* Random host values of the run's dtype, uploaded to dev. */
static int upload_randn(mix_run *r, void *dev, int64_t n, double scale, k3rt_rng *rng,
                        k3rt_error *err)
{
    void *h = ck_alloc(r->dtype, n);
    if (!h)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    ck_randn(h, r->dtype, n, scale, rng);
    int rc = mix_upload(r, dev, h, (size_t)n * k3rt_dtype_size(r->dtype), err);
    free(h);
    return rc;
}

static int open_state(mix_run *r, k3rt_rng *rng, k3rt_error *err)
{
    const k3rt_tensor *layout = &r->mod.m.state.state;
    if (!layout->ndim)
        return K3RT_OK;
    r->state_n = k3rt_tensor_numel(layout);
    if (r->state_n < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "state_layout() gave an empty state");
    if (layout->dtype != r->dtype)
        return k3rt_fail(err, K3RT_ERR_INVALID, "state_layout() gave a %s state for a %s "
                         "instance", k3rt_dtype_name(layout->dtype), k3rt_dtype_name(r->dtype));
    size_t bytes = (size_t)r->state_n * k3rt_dtype_size(r->dtype);
    r->s_in = dev_alloc(r, bytes, err);
    r->s_out = r->s_in ? dev_alloc(r, bytes, err) : NULL;
    r->ds_out = r->s_out ? dev_alloc(r, bytes, err) : NULL;
    r->ds_in = r->ds_out ? dev_alloc(r, bytes, err) : NULL;
    if (!r->ds_in)
        return err->code ? err->code : K3RT_ERR_NOMEM;
    r->has_state = 1;
    r->use_state = 1;
    K3RT_TRY(upload_randn(r, r->s_in, r->state_n, 0.5, rng, err));
    return upload_randn(r, r->ds_out, r->state_n, 1.0, rng, err);
}

int mix_open(check_ctx *c, int dtype, int device, mix_run *r, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->dtype = dtype;
    r->device = device;
    r->kind = c->e->desc.kind;
    r->B = c->B, r->T = c->T, r->d = c->d, r->n = c->B * c->T * c->d;
    K3RT_TRY(ck_module_open(c, dtype, device, &r->mod, err));
    r->experts = r->mod.m.experts;
    r->top_k = r->mod.m.top_k;
    size_t bytes = (size_t)r->n * k3rt_dtype_size(dtype);
    r->x = dev_alloc(r, bytes, err);
    r->y = r->x ? dev_alloc(r, bytes, err) : NULL;
    r->dy = r->y ? dev_alloc(r, bytes, err) : NULL;
    r->dx = r->dy ? dev_alloc(r, bytes, err) : NULL;
    r->bias = r->dx ? dev_alloc(r, (size_t)(r->experts + 1) * sizeof(float), err) : NULL;
    if (!r->bias)
        return err->code ? err->code : K3RT_ERR_NOMEM;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, c->seed, 0xc4ec6ull);
    K3RT_TRY(upload_randn(r, r->x, r->n, 1.0, &rng, err));
    K3RT_TRY(upload_randn(r, r->dy, r->n, 1.0, &rng, err));
    float zero[1] = {0};
    for (int i = 0; i < r->experts; i++)
        K3RT_TRY(mix_upload(r, r->bias + i, zero, sizeof zero, err));
    return open_state(r, &rng, err);
}

void mix_close(mix_run *r)
{
    void *bufs[] = {r->x, r->y, r->dy, r->dx, r->bias, r->d_scores, r->s_in, r->s_out,
                    r->ds_out, r->ds_in};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dev_free(r, bufs[i]);
    ck_module_close(&r->mod);
    memset(r, 0, sizeof *r);
}

static k3rt_tensor act(const mix_run *r, void *data)
{
    return k3rt_tensor_view(data, r->dtype, r->device, 3, r->B, r->T, r->d, 0);
}

static k3rt_tensor state_view(const mix_run *r, void *data)
{
    k3rt_tensor t = r->mod.m.state.state;
    t.data = data;
    return t;
}

void mix_fwd_args(mix_run *r, int training, k3rt_fwd_args *out)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = act(r, r->x);
    a.y = act(r, r->y);
    if (r->has_state) {
        if (r->use_state)
            a.state_in = state_view(r, r->s_in);
        a.state_out = state_view(r, r->s_out);
    }
    if (r->experts > 0) {
        a.bias = k3rt_tensor_view(r->bias, K3RT_F32, r->device, 1, r->experts, 0, 0, 0);
        a.routing = &r->routing;
    }
    *out = a;
}

int mix_forward(mix_run *r, int training, k3rt_error *err)
{
    k3rt_fwd_args a;
    mix_fwd_args(r, training, &a);
    K3RT_TRY(rig_forward(&r->mod.m, &a, err));
    return k3rt_stream_sync(r->mod.s, err);
}

int mix_backward(mix_run *r, k3rt_error *err)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act(r, r->x);
    a.dy = act(r, r->dy);
    a.dx = act(r, r->dx);
    if (r->has_state && r->use_state) {
        a.state_in = state_view(r, r->s_in);
        a.d_state_out = state_view(r, r->ds_out);
        a.d_state_in = state_view(r, r->ds_in);
    }
    if (r->d_scores)
        a.d_scores = k3rt_tensor_view(r->d_scores, K3RT_F32, r->device, 2, r->B * r->T,
                                      r->experts, 0, 0);
    K3RT_TRY(rig_backward(&r->mod.m, &a, err));
    return k3rt_stream_sync(r->mod.s, err);
}

int mix_reset(mix_run *r, k3rt_error *err)
{
    size_t bytes = (size_t)r->n * k3rt_dtype_size(r->dtype);
    for (int i = 0; i < r->mod.p.n; i++)
        K3RT_TRY(k3rt_memset(r->mod.s, r->mod.p.grad_dev[i].data, r->device, 0,
                             k3rt_tensor_bytes(&r->mod.p.grad_dev[i]), err));
    K3RT_TRY(k3rt_memset(r->mod.s, r->y, r->device, 0xFF, bytes, err));
    K3RT_TRY(k3rt_memset(r->mod.s, r->dx, r->device, 0xFF, bytes, err));
    K3RT_TRY(rig_fill_buffers(&r->mod.m, 0xFF, err));
    if (r->has_state) {
        size_t sb = (size_t)r->state_n * k3rt_dtype_size(r->dtype);
        K3RT_TRY(k3rt_memset(r->mod.s, r->s_out, r->device, 0xFF, sb, err));
        K3RT_TRY(k3rt_memset(r->mod.s, r->ds_in, r->device, 0xFF, sb, err));
    }
    return k3rt_stream_sync(r->mod.s, err);
}

/* The routing views stay valid until the backward; copy them right after the forward. */
static int add_routing(mix_run *r, ck_blobs *out, k3rt_error *err)
{
    const k3rt_routing *g = &r->routing;
    const k3rt_tensor *t[3] = {&g->selected, &g->counts, &g->scores};
    const char *names[3] = {"routing.selected", "routing.counts", "routing.scores"};
    for (int i = 0; i < 3; i++)
        if (k3rt_tensor_present(t[i]))
            K3RT_TRY(ck_blobs_add(out, names[i], t[i]->dtype, k3rt_tensor_numel(t[i]),
                                  t[i]->data, t[i]->device, r->mod.s, err));
    return K3RT_OK;
}

int mix_collect(mix_run *r, ck_blobs *out, k3rt_error *err)
{
    K3RT_TRY(mix_reset(r, err));
    K3RT_TRY(mix_forward(r, 1, err));
    K3RT_TRY(ck_blobs_add(out, "y", r->dtype, r->n, r->y, r->device, r->mod.s, err));
    if (r->has_state)
        K3RT_TRY(ck_blobs_add(out, "state_out", r->dtype, r->state_n, r->s_out, r->device,
                              r->mod.s, err));
    if (r->experts > 0)
        K3RT_TRY(add_routing(r, out, err));
    K3RT_TRY(mix_backward(r, err));
    return mix_add_grads(r, out, err);
}

int mix_add_grads(mix_run *r, ck_blobs *out, k3rt_error *err)
{
    K3RT_TRY(ck_blobs_add(out, "grad.x", r->dtype, r->n, r->dx, r->device, r->mod.s, err));
    if (r->has_state && r->use_state)
        K3RT_TRY(ck_blobs_add(out, "grad.state_in", r->dtype, r->state_n, r->ds_in, r->device,
                              r->mod.s, err));
    for (int i = 0; i < r->mod.p.n; i++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", rig_param(&r->mod.m, i)->name);
        K3RT_TRY(ck_blobs_add(out, name, r->mod.p.grad_dtype,
                              k3rt_tensor_numel(&r->mod.p.grad_dev[i]),
                              r->mod.p.grad_dev[i].data, r->device, r->mod.s, err));
    }
    return K3RT_OK;
}
