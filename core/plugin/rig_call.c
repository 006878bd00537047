/* The instance rig: the checked calls of token mixers and FFNs (rig.h). */
#include "plugin/rig.h"

#include <stdio.h>
#include <string.h>

/* An optional tensor: absent (ndim 0) or as expected. */
static int expect_opt(const rig *r, const k3rt_tensor *t, const char *what, int dtype, int ndim,
                      const int64_t *shape, k3rt_error *err)
{
    return t->ndim == 0 ? K3RT_OK : rig_expect(r, t, what, dtype, ndim, shape, err);
}

static int expect_act(const rig *r, const k3rt_tensor *t, const char *what, k3rt_error *err)
{
    const int64_t shape[3] = {r->B, r->T, r->d};
    return rig_expect(r, t, what, r->dtype, 3, shape, err);
}

static int expect_state(const rig *r, const k3rt_tensor *t, const char *what, k3rt_error *err)
{
    if (t->ndim == 0)
        return K3RT_OK;
    if (!r->state.state.ndim)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s given, but the plugin has no recurrent "
                         "state (no state_layout)", r->where, what);
    return rig_expect(r, t, what, r->state.state.dtype, r->state.state.ndim,
                      r->state.state.shape, err);
}

/* What every call of a bound instance needs: a shape, and the call on the create stream. */
static int ready(const rig *r, const char *call, k3rt_error *err)
{
    if (!r->B)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s before the buffers of a batch shape "
                         "were bound (rig_bind_shape / rig_alloc_shape)", r->where, call);
    if (rig_n_params(r) && !r->params)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s before the parameters were bound",
                         r->where, call);
    return K3RT_OK;
}

static int expect_docs(const rig *r, const k3rt_tensor *docs, k3rt_error *err)
{
    if (docs->ndim == 0)
        return K3RT_OK;
    if (r->kind == K3RT_KIND_ATTENTION && !(r->e->desc.caps & K3RT_CAP_DOCUMENTS))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: packed sequences (document offsets) "
                         "given, but the plugin does not declare K3RT_CAP_DOCUMENTS", r->where);
    const int64_t shape[1] = {-1};
    K3RT_TRY(rig_expect(r, docs, "doc_offsets", K3RT_I32, 1, shape, err));
    int64_t n = docs->shape[0], N = r->B * r->T;
    if (n < 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: doc_offsets needs at least 2 entries",
                         r->where);
    if (r->device != K3RT_DEVICE_CPU)
        return K3RT_OK;  /* values on a GPU are the data loader's promise */
    const int32_t *o = docs->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t prev = i ? o[i - 1] : -1;
        if (o[i] <= prev || o[i] > N || (i == 0 && o[i]) || (i == n - 1 && o[i] != N))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: doc_offsets[%lld] = %d: offsets must "
                             "rise from 0 to B*T = %lld", r->where, (long long)i, o[i],
                             (long long)N);
    }
    for (int64_t b = 1, i = 0; b < r->B; b++) {  /* o rises, so one pass finds every row */
        while (i < n && o[i] < b * r->T)
            i++;
        if (i == n || o[i] != b * r->T)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: doc_offsets lacks the row start %lld "
                             "(every batch row starts a document)", r->where,
                             (long long)(b * r->T));
    }
    return K3RT_OK;
}

/* The context-parallel prefixes a plugin asked for in context(). */
static int expect_prefixes(rig *r, const k3rt_tensor *x_prefix, const k3rt_tensor *kv_prefix,
                           k3rt_error *err)
{
    if (!x_prefix->ndim && !kv_prefix->ndim)
        return K3RT_OK;
    k3rt_context_needs need;
    K3RT_TRY(rig_context(r, &need, err));
    if (x_prefix->ndim) {
        if (!need.prefix_rows)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: x_prefix given, but the plugin asks "
                             "for no prefix rows", r->where);
        const int64_t shape[3] = {r->B, need.prefix_rows, r->d};
        K3RT_TRY(rig_expect(r, x_prefix, "x_prefix", r->dtype, 3, shape, err));
    }
    if (kv_prefix->ndim) {
        if (!need.kv_width)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: kv_prefix given, but the plugin "
                             "gathers no KV", r->where);
        const int64_t shape[3] = {r->B, -1, need.kv_width};
        K3RT_TRY(rig_expect(r, kv_prefix, "kv_prefix", r->dtype, 3, shape, err));
    }
    return K3RT_OK;
}

/* Fields of forward-style calls that the rig owns. */
static void fill_fwd(rig *r, k3rt_fwd_args *a)
{
    a->struct_size = sizeof *a;
    a->stream = r->stream;
    a->batch = r->B;
    a->seq = r->T;
    a->params = r->params;
    a->n_params = rig_n_params(r);
    a->deterministic = r->deterministic;
    a->saved = r->saved;
    a->n_saved = r->n_saved;
    a->workspace = r->ws;
    a->workspace_bytes = r->mem.workspace_bytes;
}

static int check_fwd(rig *r, const k3rt_fwd_args *a, const char *call, int need_y,
                     k3rt_error *err)
{
    char what[64];
    K3RT_TRY(ready(r, call, err));
    snprintf(what, sizeof what, "%s: x", call);
    K3RT_TRY(expect_act(r, &a->x, what, err));
    if (need_y) {
        snprintf(what, sizeof what, "%s: y", call);
        K3RT_TRY(expect_act(r, &a->y, what, err));
    }
    K3RT_TRY(expect_docs(r, &a->doc_offsets, err));
    if (r->kind == K3RT_KIND_ATTENTION) {
        if (a->bias.ndim || a->routing)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a selection bias or routing given to "
                             "a token mixer", r->where);
        K3RT_TRY(expect_state(r, &a->state_in, "state_in", err));
        K3RT_TRY(expect_state(r, &a->state_out, "state_out", err));
        return expect_prefixes(r, &a->x_prefix, &a->kv_prefix, err);
    }
    if (a->state_in.ndim || a->state_out.ndim || a->x_prefix.ndim || a->kv_prefix.ndim)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a recurrent state or context prefix given "
                         "to an FFN", r->where);
    const int64_t e[1] = {r->experts};
    if (a->bias.ndim && !r->experts)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a selection bias given to a dense FFN",
                         r->where);
    return expect_opt(r, &a->bias, "bias", K3RT_F32, 1, e, err);
}

/* What a routed MoE's forward must report when asked. */
static int check_routing(const rig *r, const k3rt_routing *g, k3rt_error *err)
{
    const int64_t N = r->B * r->T, scores[2] = {N, r->experts}, sel[2] = {N, r->top_k};
    const int64_t counts[1] = {r->experts}, offsets[1] = {r->experts + 1};
    int rc = rig_expect(r, &g->scores, "routing.scores", K3RT_F32, 2, scores, err);
    if (!rc)
        rc = rig_expect(r, &g->selected, "routing.selected", K3RT_I32, 2, sel, err);
    if (!rc)
        rc = rig_expect(r, &g->counts, "routing.counts", K3RT_I64, 1, counts, err);
    if (!rc)
        rc = expect_opt(r, &g->offsets, "routing.offsets", K3RT_I64, 1, offsets, err);
    if (rc)
        k3rt_error_prefix(err, "forward reported bad routing: ");
    return rc;
}

static int forward_fn(rig *r, const k3rt_fwd_args *a, k3rt_error *err)
{
    return r->kind == K3RT_KIND_MOE ? r->e->vt.moe.forward(r->self, a, err)
                                    : r->e->vt.attention.forward(r->self, a, err);
}

static int expect_mixer(const rig *r, const char *call, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_ATTENTION && r->kind != K3RT_KIND_MOE)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s called on a %s plugin", r->where, call,
                         k3rt_kind_name(r->kind));
    return K3RT_OK;
}

int rig_forward(rig *r, k3rt_fwd_args *a, k3rt_error *err)
{
    K3RT_TRY(expect_mixer(r, "forward", err));
    fill_fwd(r, a);
    K3RT_TRY(check_fwd(r, a, "forward", 1, err));
    if (a->routing) {
        memset(a->routing, 0, sizeof *a->routing);
        a->routing->struct_size = sizeof *a->routing;
    }
    K3RT_TRY(rig_fail(r, forward_fn(r, a, err), err));
    if (!a->routing || r->experts == 0)
        return K3RT_OK;
    k3rt_routing *g = a->routing;  /* what the host knows, it fills in */
    g->batch = r->B, g->seq = r->T, g->experts = r->experts, g->top_k = r->top_k;
    g->bias = a->bias;
    return check_routing(r, g, err);
}

int rig_decode(rig *r, k3rt_fwd_args *a, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_ATTENTION || !r->e->vt.attention.decode)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no decode()", r->where);
    fill_fwd(r, a);
    if (r->T != 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: decode takes one token per sequence; the "
                         "bound shape has seq %lld", r->where, (long long)r->T);
    K3RT_TRY(check_fwd(r, a, "decode", 1, err));
    return rig_fail(r, r->e->vt.attention.decode(r->self, a, err), err);
}

int rig_backward(rig *r, k3rt_bwd_args *a, k3rt_error *err)
{
    K3RT_TRY(expect_mixer(r, "backward", err));
    K3RT_TRY(ready(r, "backward", err));
    a->struct_size = sizeof *a;
    a->stream = r->stream;
    a->batch = r->B;
    a->seq = r->T;
    a->params = r->params;
    a->grads = r->grads;
    a->n_params = rig_n_params(r);
    a->deterministic = r->deterministic;
    a->saved = r->saved;
    a->n_saved = r->n_saved;
    a->workspace = r->ws;
    a->workspace_bytes = r->mem.workspace_bytes;
    K3RT_TRY(expect_act(r, &a->x, "backward: x", err));
    K3RT_TRY(expect_act(r, &a->dy, "backward: dy", err));
    K3RT_TRY(expect_act(r, &a->dx, "backward: dx", err));
    K3RT_TRY(expect_docs(r, &a->doc_offsets, err));
    if (r->kind == K3RT_KIND_ATTENTION) {
        K3RT_TRY(expect_state(r, &a->state_in, "state_in", err));
        K3RT_TRY(expect_state(r, &a->d_state_out, "d_state_out", err));
        K3RT_TRY(expect_state(r, &a->d_state_in, "d_state_in", err));
        K3RT_TRY(expect_prefixes(r, &a->x_prefix, &a->kv_prefix, err));
        if (a->d_x_prefix.ndim && !a->x_prefix.ndim)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: d_x_prefix without x_prefix",
                             r->where);
        if (a->d_x_prefix.ndim)
            K3RT_TRY(rig_expect(r, &a->d_x_prefix, "d_x_prefix", r->dtype, 3,
                                a->x_prefix.shape, err));
        if (a->d_kv_prefix.ndim && !a->kv_prefix.ndim)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: d_kv_prefix without kv_prefix",
                             r->where);
        if (a->d_kv_prefix.ndim)
            K3RT_TRY(rig_expect(r, &a->d_kv_prefix, "d_kv_prefix", r->dtype, 3,
                                a->kv_prefix.shape, err));
    } else {
        const int64_t ds[2] = {r->B * r->T, r->experts};
        if (a->d_scores.ndim && !r->experts)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: router-score gradients given to a "
                             "dense FFN", r->where);
        K3RT_TRY(expect_opt(r, &a->d_scores, "d_scores", K3RT_F32, 2, ds, err));
    }
    int rc = r->kind == K3RT_KIND_MOE ? r->e->vt.moe.backward(r->self, a, err)
                                      : r->e->vt.attention.backward(r->self, a, err);
    return rig_fail(r, rc, err);
}

/* A [B, HV, ...] summary tensor against the layout. */
static int expect_summary(const rig *r, const k3rt_tensor *t, const k3rt_tensor *layout,
                          const char *what, k3rt_error *err)
{
    return rig_expect(r, t, what, layout->dtype, layout->ndim, layout->shape, err);
}

int rig_cp_summary(rig *r, k3rt_fwd_args *a, k3rt_tensor m, k3rt_tensor b, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_ATTENTION || !r->e->vt.attention.cp_summary)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no cp_summary()",
                         r->where);
    fill_fwd(r, a);
    K3RT_TRY(check_fwd(r, a, "cp_summary", 0, err));
    K3RT_TRY(expect_summary(r, &m, &r->state.summary_m, "summary m", err));
    K3RT_TRY(expect_summary(r, &b, &r->state.summary_b, "summary b", err));
    return rig_fail(r, r->e->vt.attention.cp_summary(r->self, a, m, b, err), err);
}

int rig_cp_compose(rig *r, k3rt_tensor m1, k3rt_tensor b1, k3rt_tensor m2, k3rt_tensor b2,
                   k3rt_tensor m, k3rt_tensor b, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_ATTENTION || !r->e->vt.attention.cp_compose)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no cp_compose()",
                         r->where);
    K3RT_TRY(ready(r, "cp_compose", err));
    const k3rt_tensor *ms[3] = {&m1, &m2, &m}, *bs[3] = {&b1, &b2, &b};
    static const char *const mn[3] = {"m1", "m2", "m"}, *const bn[3] = {"b1", "b2", "b"};
    for (int i = 0; i < 3; i++) {
        K3RT_TRY(expect_summary(r, ms[i], &r->state.summary_m, mn[i], err));
        K3RT_TRY(expect_summary(r, bs[i], &r->state.summary_b, bn[i], err));
    }
    return rig_fail(r, r->e->vt.attention.cp_compose(r->self, r->stream, m1, b1, m2, b2, m, b,
                                                     err), err);
}

int rig_context(rig *r, k3rt_context_needs *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (r->kind != K3RT_KIND_ATTENTION || !r->e->vt.attention.context)
        return K3RT_OK;
    int rc = r->e->vt.attention.context(r->self, out);
    if (!rc && (out->prefix_rows < 0 || out->kv_width < 0))
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: context() gave negative sizes", r->where);
    return rig_fail(r, rc, err);
}
