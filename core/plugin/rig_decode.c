/* The instance rig: a token mixer's incremental decoding (rig.h), through the plugin's cache
 * (decode_step, ABI 2.2) or, for a plugin that only has the ABI 2.0 decode(), through its
 * recurrent state held by the rig. */
#include "plugin/rig.h"

#include <string.h>

int rig_can_decode(const rig *r)
{
    return r->kind == K3RT_KIND_ATTENTION &&
           (r->e->vt.attention.decode_step || r->e->vt.attention.decode);
}

static int no_decode(const rig *r, k3rt_error *err)
{
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no incremental decoding "
                     "(neither decode_step nor decode)", r->where);
}

int rig_cache_create(rig *r, int64_t batch, int64_t capacity, rig_cache *c, k3rt_error *err)
{
    memset(c, 0, sizeof *c);
    if (!rig_can_decode(r))
        return no_decode(r, err);
    if (batch < 1 || capacity < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: decoding cache for %lld sequences of "
                         "%lld tokens (both must be >= 1)", r->where, (long long)batch,
                         (long long)capacity);
    c->B = batch;
    const k3rt_attention_vtable *v = &r->e->vt.attention;
    if (v->decode_step) {
        k3rt_cache_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.stream = r->stream;
        a.batch = batch;
        a.capacity = capacity;
        int rc = rig_fail(r, v->cache_create(r->self, &a, &c->plugin, err), err);
        if (!rc && !c->plugin)
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: cache_create gave no cache", r->where);
        return rc;
    }
    /* decode(): the state between two steps lives in the state_layout's tensors */
    k3rt_state_layout l;
    memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    K3RT_TRY(rig_fail(r, v->state_layout(r->self, batch, &l, err), err));
    size_t bytes = k3rt_tensor_bytes(&l.state);
    for (int i = 0; i < 2; i++)
        if (!(c->state[i] = k3rt_alloc(r->device, bytes ? bytes : 1, err))) {
            rig_cache_destroy(r, c);
            return rig_fail(r, err && err->code ? err->code : K3RT_ERR_NOMEM, err);
        }
    return K3RT_OK;
}

static int step_legacy(rig *r, rig_cache *c, k3rt_tensor x, k3rt_tensor y, k3rt_error *err)
{
    if (r->B != c->B || r->T != 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: decode() needs the buffers bound at %lld "
                         "x 1, they are at %lld x %lld", r->where, (long long)c->B,
                         (long long)r->B, (long long)r->T);
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.x = x, a.y = y;
    if (c->pos > 0) { /* the first token starts from the zero state, as forward's absent one */
        a.state_in = r->state.state;
        a.state_in.data = c->state[c->cur];
    }
    a.state_out = r->state.state;
    a.state_out.data = c->state[1 - c->cur];
    K3RT_TRY(rig_decode(r, &a, err));
    c->cur = 1 - c->cur;
    return K3RT_OK;
}

int rig_decode_step(rig *r, rig_cache *c, k3rt_tensor x, k3rt_tensor y, k3rt_error *err)
{
    if (!rig_can_decode(r))
        return no_decode(r, err);
    if (!c->plugin && !c->state[0])
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: decode step without a cache "
                         "(rig_cache_create)", r->where);
    if (rig_n_params(r) && !r->params)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: decode step before the parameters were "
                         "bound", r->where);
    const int64_t shape[3] = {c->B, 1, r->d};
    K3RT_TRY(rig_expect(r, &x, "decode: x", r->dtype, 3, shape, err));
    K3RT_TRY(rig_expect(r, &y, "decode: y", r->dtype, 3, shape, err));
    if (!c->plugin)
        K3RT_TRY(step_legacy(r, c, x, y, err));
    else {
        k3rt_decode_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.stream = r->stream;
        a.batch = c->B;
        a.pos = c->pos;
        a.x = x, a.y = y;
        a.params = r->params;
        a.n_params = rig_n_params(r);
        K3RT_TRY(rig_fail(r, r->e->vt.attention.decode_step(r->self, c->plugin, &a, err), err));
    }
    c->pos++;
    return K3RT_OK;
}

void rig_cache_destroy(rig *r, rig_cache *c)
{
    if (c->plugin && r->e->vt.attention.cache_destroy)
        r->e->vt.attention.cache_destroy(r->self, c->plugin);
    for (int i = 0; i < 2; i++)
        if (c->state[i])
            k3rt_free(r->device, c->state[i]);
    memset(c, 0, sizeof *c);
}
