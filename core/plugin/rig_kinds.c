/* The instance rig: the checked calls of residuals, balancers and optimizers (rig.h). */
#include "plugin/rig.h"

#include <math.h>
#include <string.h>

/* ---- residual ------------------------------------------------------------------------------ */

typedef int (*residual_fn)(void *, const k3rt_residual_args *, k3rt_error *);

static residual_fn residual_at(const rig *r, rig_residual_call call)
{
    const k3rt_residual_vtable *v = &r->e->vt.residual;
    residual_fn fns[RIG_RESIDUAL_CALLS_] = {
        v->begin, v->mix, v->push, v->finish, v->finish_backward, v->push_backward,
        v->mix_backward, v->begin_backward, v->op_forward, v->op_backward, v->mix_norm,
        v->mix_norm_backward};
    return call >= 0 && call < RIG_RESIDUAL_CALLS_ ? fns[call] : NULL;
}

static const char *const residual_names[RIG_RESIDUAL_CALLS_] = {
    "begin", "mix", "push", "finish", "finish_backward", "push_backward", "mix_backward",
    "begin_backward", "op_forward", "op_backward", "mix_norm", "mix_norm_backward"};

int rig_has_residual(const rig *r, rig_residual_call call)
{
    return r->kind == K3RT_KIND_RESIDUAL && residual_at(r, call) != NULL;
}

static int is_backward(rig_residual_call call)
{
    return call == RIG_FINISH_BACKWARD || call == RIG_PUSH_BACKWARD || call == RIG_MIX_BACKWARD ||
           call == RIG_BEGIN_BACKWARD || call == RIG_OP_BACKWARD || call == RIG_MIX_NORM_BACKWARD;
}

/* The sublayers each call may name: begin 0, the output aggregation S, the rest 0 .. S-1
 * (op mode: 0 .. S). */
static int sublayer_ok(const rig *r, rig_residual_call call, int s)
{
    int S = r->n_sublayers;
    switch (call) {
    case RIG_BEGIN:
    case RIG_BEGIN_BACKWARD: return s == 0;
    case RIG_FINISH:
    case RIG_FINISH_BACKWARD: return s == S;
    case RIG_OP_FORWARD:
    case RIG_OP_BACKWARD: return s >= 0 && s <= S;
    default: return s >= 0 && s < S;
    }
}

static int check_op(const rig *r, const k3rt_residual_args *a, int backward, k3rt_error *err)
{
    if (a->n_sources < 0 || (a->n_sources && !a->sources) ||
        (!a->n_sources && !a->partial.ndim))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: an op call needs a source or a partial "
                         "sum", r->where);
    const int64_t shape[3] = {r->B, r->T, r->d};
    for (int j = 0; j < a->n_sources; j++) {
        char what[48];
        snprintf(what, sizeof what, "sources[%d]", j);
        K3RT_TRY(rig_expect(r, &a->sources[j], what, r->dtype, 3, shape, err));
        if (backward) {
            if (!a->d_sources)
                return k3rt_fail(err, K3RT_ERR_INVALID, "%s: op_backward needs d_sources",
                                 r->where);
            snprintf(what, sizeof what, "d_sources[%d]", j);
            K3RT_TRY(rig_expect(r, &a->d_sources[j], what, r->dtype, 3, shape, err));
        }
    }
    if (a->partial.ndim) {
        K3RT_TRY(rig_expect(r, &a->partial, "partial", r->dtype, 3, shape, err));
        if (backward)
            K3RT_TRY(rig_expect(r, &a->d_partial, "d_partial", r->dtype, 3, shape, err));
    }
    return K3RT_OK;
}

static int check_norm(const rig *r, const k3rt_residual_args *a, int backward, k3rt_error *err)
{
    const int64_t g[1] = {r->d}, act[3] = {r->B, r->T, r->d}, rows[1] = {r->B * r->T};
    K3RT_TRY(rig_expect(r, &a->norm_gain, "norm_gain", r->dtype, 1, g, err));
    K3RT_TRY(rig_expect(r, &a->rstd, "rstd", r->grad_dtype, 1, rows, err));
    if (!(a->norm_eps > 0) || !isfinite(a->norm_eps))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: norm_eps must be > 0, got %g", r->where,
                         a->norm_eps);
    if (!backward)
        return rig_expect(r, &a->normed, "normed", r->dtype, 3, act, err);
    K3RT_TRY(rig_expect(r, &a->norm_gain_grad, "norm_gain_grad", r->grad_dtype, 1, g, err));
    return rig_expect(r, &a->sublayer_input, "sublayer_input", r->dtype, 3, act, err);
}

int rig_residual(rig *r, rig_residual_call call, k3rt_residual_args *a, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_RESIDUAL)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: residual call on a %s plugin", r->where,
                         k3rt_kind_name(r->kind));
    residual_fn fn = residual_at(r, call);
    if (!fn)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the plugin has no %s()", r->where,
                         call >= 0 && call < RIG_RESIDUAL_CALLS_ ? residual_names[call] : "?");
    if (!r->B)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s before the buffers of a batch shape "
                         "were bound", r->where, residual_names[call]);
    if (rig_n_params(r) && !r->params)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s before the parameters were bound",
                         r->where, residual_names[call]);
    int backward = is_backward(call);
    a->struct_size = sizeof *a;
    a->stream = r->stream;
    a->batch = r->B;
    a->seq = r->T;
    a->n_sublayers = r->n_sublayers;
    a->params = r->params;
    a->grads = backward ? r->grads : NULL;
    a->n_params = rig_n_params(r);
    a->deterministic = r->deterministic;
    a->saved = r->saved;
    a->n_saved = r->n_saved;
    a->workspace = r->ws;
    a->workspace_bytes = r->mem.workspace_bytes;
    if (!sublayer_ok(r, call, a->sublayer))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s of sublayer %d (the model has %d "
                         "sublayers)", r->where, residual_names[call], a->sublayer,
                         r->n_sublayers);
    char what[64];
    snprintf(what, sizeof what, "%s: t", residual_names[call]);
    const int64_t act[3] = {r->B, r->T, r->d};
    K3RT_TRY(rig_expect(r, &a->t, what, r->dtype, 3, act, err));
    if (call == RIG_OP_FORWARD || call == RIG_OP_BACKWARD)
        K3RT_TRY(check_op(r, a, backward, err));
    if (call == RIG_MIX_NORM || call == RIG_MIX_NORM_BACKWARD)
        K3RT_TRY(check_norm(r, a, backward, err));
    if (call == RIG_MIX_BACKWARD)
        K3RT_TRY(rig_expect(r, &a->sublayer_input, "mix_backward: sublayer_input (what mix "
                            "wrote in the forward)", r->dtype, 3, act, err));
    return rig_fail(r, fn(r->self, a, err), err);
}

/* ---- balancer ------------------------------------------------------------------------------ */

static int expect_balancer(const rig *r, const char *call, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_BALANCER)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s called on a %s plugin", r->where, call,
                         k3rt_kind_name(r->kind));
    return K3RT_OK;
}

/* A routing from the layer this balancer serves (its MoE's rig checked the tensors). */
static int expect_routing(const rig *r, const k3rt_routing *g, k3rt_error *err)
{
    if (!g || g->experts != r->experts || g->top_k != r->top_k || g->batch < 1 || g->seq < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: routing of %d experts top-%d, but the "
                         "balancer serves %d experts top-%d", r->where, g ? g->experts : 0,
                         g ? g->top_k : 0, r->experts, r->top_k);
    const int64_t N = g->batch * g->seq, scores[2] = {N, r->experts}, sel[2] = {N, r->top_k};
    const int64_t counts[1] = {r->experts};
    K3RT_TRY(rig_expect(r, &g->scores, "routing.scores", K3RT_F32, 2, scores, err));
    K3RT_TRY(rig_expect(r, &g->selected, "routing.selected", K3RT_I32, 2, sel, err));
    K3RT_TRY(rig_expect(r, &g->counts, "routing.counts", K3RT_I64, 1, counts, err));
    if (r->device != K3RT_DEVICE_CPU)
        return K3RT_OK;  /* on a GPU the values are the MoE's promise */
    const int32_t *s = g->selected.data;
    for (int64_t i = 0; i < N * r->top_k; i++)
        if (s[i] < 0 || s[i] >= r->experts)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: routing.selected[%lld] = %d is outside "
                             "[0, %d)", r->where, (long long)i, s[i], r->experts);
    return K3RT_OK;
}

int rig_bias(rig *r, k3rt_tensor *out, k3rt_error *err)
{
    K3RT_TRY(expect_balancer(r, "bias", err));
    memset(out, 0, sizeof *out);
    K3RT_TRY(rig_fail(r, r->e->vt.balancer.bias(r->self, out, err), err));
    const int64_t e[1] = {r->experts};
    K3RT_TRY(rig_expect(r, out, "bias() result", K3RT_F32, 1, e, err));
    return K3RT_OK;
}

int rig_observe(rig *r, const k3rt_routing *routing, k3rt_error *err)
{
    K3RT_TRY(expect_balancer(r, "observe", err));
    if (!r->e->vt.balancer.observe)
        return K3RT_OK;
    K3RT_TRY(expect_routing(r, routing, err));
    return rig_fail(r, r->e->vt.balancer.observe(r->self, r->stream, routing, err), err);
}

int rig_has_aux_loss(const rig *r)
{
    return r->kind == K3RT_KIND_BALANCER &&
           (r->e->vt.balancer.aux_loss != NULL || r->e->vt.balancer.aux_loss_add != NULL);
}

/* The checks both forms of the auxiliary loss share. */
static int expect_aux(const rig *r, const char *call, int present,
                      const k3rt_routing *routing, const k3rt_tensor *d_scores, k3rt_error *err)
{
    K3RT_TRY(expect_balancer(r, call, err));
    if (!present)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: the balancer has no %s()", r->where,
                         call);
    K3RT_TRY(expect_routing(r, routing, err));
    const int64_t ds[2] = {routing->batch * routing->seq, r->experts};
    return rig_expect(r, d_scores, "d_scores", K3RT_F32, 2, ds, err);
}

int rig_aux_loss(rig *r, const k3rt_routing *routing, double scale, double *loss,
                 k3rt_tensor d_scores, k3rt_error *err)
{
    *loss = 0;
    K3RT_TRY(expect_aux(r, "aux_loss", r->e->vt.balancer.aux_loss != NULL, routing, &d_scores,
                        err));
    return rig_fail(r, r->e->vt.balancer.aux_loss(r->self, r->stream, routing, scale, loss,
                                                  d_scores, err), err);
}

int rig_aux_loss_add(rig *r, const k3rt_routing *routing, double scale, k3rt_tensor loss_sum,
                     double *host_sum, k3rt_tensor d_scores, k3rt_error *err)
{
    if (!r->e->vt.balancer.aux_loss_add) {  /* an ABI 2.0 balancer: the host value */
        double loss;
        K3RT_TRY(rig_aux_loss(r, routing, scale, &loss, d_scores, err));
        *host_sum += loss;
        return K3RT_OK;
    }
    K3RT_TRY(expect_aux(r, "aux_loss_add", 1, routing, &d_scores, err));
    const int64_t one[1] = {1};
    K3RT_TRY(rig_expect(r, &loss_sum, "loss_sum", K3RT_F64, 1, one, err));
    return rig_fail(r, r->e->vt.balancer.aux_loss_add(r->self, r->stream, routing, scale,
                                                      loss_sum, d_scores, err), err);
}


int rig_update(rig *r, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    K3RT_TRY(expect_balancer(r, "update", err));
    return rig_fail(r, r->e->vt.balancer.update(r->self, r->stream, dp, step, err), err);
}

/* ---- optimizer ------------------------------------------------------------------------------ */

int rig_step(rig *r, k3rt_comm *comm, double lr, int64_t step, const k3rt_param_ref *params,
             int n_params, k3rt_error *err)
{
    if (r->kind != K3RT_KIND_OPTIMIZER)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: step called on a %s plugin", r->where,
                         k3rt_kind_name(r->kind));
    if (n_params != r->n_refs || (n_params && !params))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: step got %d parameters, create got %d",
                         r->where, n_params, r->n_refs);
    if (step < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: step number %lld; steps count from 1",
                         r->where, (long long)step);
    if (!(lr >= 0) || !isfinite(lr))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: learning rate %g must be finite and >= 0",
                         r->where, lr);
    for (int i = 0; i < n_params; i++)
        K3RT_TRY(rig_check_ref(r, &params[i], i, err));
    k3rt_optimizer_step a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.stream = r->stream;
    a.comm = comm;
    a.lr = lr;
    a.step = step;
    a.params = params;
    a.n_params = n_params;
    return rig_fail(r, r->e->vt.optimizer.step(r->self, &a, err), err);
}

int rig_describe(rig *r, int index, char *buf, size_t len)
{
    if (r->kind != K3RT_KIND_OPTIMIZER || !r->e->vt.optimizer.describe || index < 0 ||
        index >= r->n_refs)
        return K3RT_ERR_INVALID;
    return r->e->vt.optimizer.describe(r->self, index, buf, len);
}
