/* The model's forward and backward passes (see model.h for the schedule). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
#include "model/model_internal.h"
#include "model/profile.h"

static k3rt_residual_args residual_args(model *m, int s, void *t)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s;
    a.t = model_act_tensor(m, t);
    a.training = 1;
    return a;
}

/* A residual call, timed as the residual's forward or backward. */
static int residual_timed(model *m, rig_residual_call call, int backward,
                          k3rt_residual_args *a, k3rt_error *err)
{
    PROF_TRY(m->prof, profile_module_row(m->residual, backward),
             rig_residual(&m->mods[m->residual].r, call, a, err));
    return K3RT_OK;
}

static int residual_call(model *m, rig_residual_call call, int s, void *t, k3rt_error *err)
{
    k3rt_residual_args a = residual_args(m, s, t);
    int backward = call == RIG_BEGIN_BACKWARD || call == RIG_PUSH_BACKWARD ||
                   call == RIG_FINISH_BACKWARD || call == RIG_MIX_BACKWARD;
    return residual_timed(m, call, backward, &a, err);
}

static k3rt_tensor rstd_tensor(const model *m, void *rstd)
{
    return k3rt_tensor_view(rstd, m->master_dtype, m->opt.device, 1, m->B * m->T, 0, 0, 0);
}

/* hs = the sublayer's input, xn = its pre-norm: the residual's fused mix_norm where it has
 * one, else mix and the engine's RMSNorm. */
static int mix_and_norm(model *m, int s, void *hs, void *rstd, k3rt_error *err)
{
    rig *r = &m->mods[m->residual].r;
    const param_slot *g = &m->params[model_sub_norm(m, s)];
    if (!rig_has_residual(r, RIG_MIX_NORM)) {
        K3RT_TRY(residual_call(m, RIG_MIX, s, hs, err));
        PROF_TRY(m->prof, PROF_NORM_FWD,
                 k3rt_rmsnorm_fwd(m->opt.stream, m->opt.dtype, hs, g->param.data, m->a->xn,
                                  rstd, m->B * m->T, m->d, m->norm_eps, err));
        return K3RT_OK;
    }
    k3rt_residual_args a = residual_args(m, s, hs);
    a.norm_gain = g->param;
    a.normed = model_act_tensor(m, m->a->xn);
    a.rstd = rstd_tensor(m, rstd);
    a.norm_eps = m->norm_eps;
    return residual_timed(m, RIG_MIX_NORM, 0, &a, err);
}

/* From dxn (the gradient of the pre-norm's output) to the residual's gradients: the fused
 * mix_norm_backward, or the engine's RMSNorm backward into dh and mix_backward. mix_backward
 * also gets the sublayer's input (what mix wrote, kept in hs for the pre-norm's backward): a
 * residual whose mixing is not linear in its sources recovers what it read from it instead of
 * keeping a copy per sublayer. */
static int norm_and_mix_backward(model *m, int s, void *hs, void *rstd, k3rt_error *err)
{
    rig *r = &m->mods[m->residual].r;
    const param_slot *g = &m->params[model_sub_norm(m, s)];
    k3rt_residual_args a = residual_args(m, s, m->a->dxn);
    a.sublayer_input = model_act_tensor(m, hs);
    if (rig_has_residual(r, RIG_MIX_NORM_BACKWARD)) {
        a.norm_gain = g->param;
        a.norm_gain_grad = g->grad;
        a.rstd = rstd_tensor(m, rstd);
        a.norm_eps = m->norm_eps;
        return residual_timed(m, RIG_MIX_NORM_BACKWARD, 1, &a, err);
    }
    PROF_TRY(m->prof, PROF_NORM_BWD,
             k3rt_rmsnorm_bwd(m->opt.stream, m->opt.dtype, hs, g->param.data, rstd, m->a->dxn,
                              m->a->dh, g->grad.data, m->B * m->T, m->d, 0, err));
    a.t = model_act_tensor(m, m->a->dh);
    return residual_timed(m, RIG_MIX_BACKWARD, 1, &a, err);
}

/* n values of dtype, wherever they live, as host doubles (waits for the stream). */
static int to_host(model *m, const void *src, int dtype, int64_t n, double *dst,
                   k3rt_error *err)
{
    size_t bytes = (size_t)n * k3rt_dtype_size(dtype);
    void *tmp = malloc(bytes ? bytes : 1);
    if (!tmp)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    int rc = k3rt_memcpy(m->opt.stream, tmp, K3RT_DEVICE_CPU, src, m->opt.device, bytes, err);
    if (!rc)
        rc = k3rt_stream_sync(m->opt.stream, err);
    if (!rc)
        rc = k3rt_convert(dst, K3RT_F64, tmp, dtype, n, err);
    free(tmp);
    return rc;
}

static int sum_rows(model *m, const void *x, int64_t n, double *sum, k3rt_error *err)
{
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    int rc = to_host(m, x, m->master_dtype, n, v, err);
    double s = 0;
    for (int64_t i = 0; !rc && i < n; i++)
        s += v[i];
    free(v);
    *sum += s;
    return rc;
}

/* A layer's routed counts of this forward: added into the step's host counters on the CPU; on
 * a GPU copied on the device into this forward's slot (model_flush_routed reads them). */
static int add_counts(model *m, int layer, const k3rt_tensor *counts, k3rt_error *err)
{
    int64_t E = m->layers[layer].experts;
    if (counts->device == K3RT_DEVICE_CPU) {
        const int64_t *c = counts->data;
        for (int64_t e = 0; e < E; e++)
            m->routed[layer][e] += c[e];
        return K3RT_OK;
    }
    int64_t *slot = m->routed_stage + (m->routed_used - 1) * m->routed_width;
    return k3rt_memcpy(m->opt.stream, slot + m->routed_at[layer], m->opt.device, counts->data,
                       counts->device, (size_t)E * sizeof(int64_t), err);
}

static int sublayer_call(model *m, int s, int training, int replay, double aux_scale,
                         k3rt_error *err);

/* Sublayer s forward on xn -> ys. MoE layers take the balancer's bias, report routing to the
 * balancer, and may add its auxiliary loss. A replay (the activation manager's recompute,
 * right before the backward) rebuilds the saved parts only: same input, weights and bias,
 * nothing reported again. */
static int sublayer_forward(model *m, int s, int training, int replay, double aux_scale,
                            k3rt_error *err)
{
    int mi = model_sub_module(m, s);
    K3RT_TRY(actman_before_forward(m, mi, err));
    K3RT_TRY(sublayer_call(m, s, training, replay, aux_scale, err));
    return replay ? K3RT_OK : actman_after_forward(m, mi, training, err);
}

static int sublayer_call(model *m, int s, int training, int replay, double aux_scale,
                         k3rt_error *err)
{
    int mi = model_sub_module(m, s);
    model_module *mm = &m->mods[mi];
    const model_layer *L = &m->layers[s / 2];
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = model_act_tensor(m, m->a->xn);
    a.y = model_act_tensor(m, m->a->ys);
    int fwd = profile_module_row(mi, 0);
    if (s % 2 == 0) {
        if (m->decode.active)  /* model_decode_step: one token, the layer's cache */
            return rig_decode_step(&mm->r, &m->decode.caches[s / 2], a.x, a.y, err);
        a.doc_offsets = m->docs;
        PROF_TRY(m->prof, fwd, rig_forward(&mm->r, &a, err));
        return K3RT_OK;
    }

    k3rt_routing *routing = &m->a->routing[s / 2];
    rig *bal = model_balancer(m, s / 2);
    int bal_row = bal ? profile_module_row(L->balancer, 0) : 0;
    if (bal) {
        PROF_TRY(m->prof, bal_row, rig_bias(bal, &a.bias, err));
        a.routing = routing;
    }
    PROF_TRY(m->prof, fwd, rig_forward(&mm->r, &a, err));
    if (!bal || !training || replay)
        return K3RT_OK;
    K3RT_TRY(prof_begin(m->prof, bal_row, err));
    K3RT_TRY(add_counts(m, s / 2, &routing->counts, err));
    K3RT_TRY(rig_observe(bal, routing, err));
    if (rig_has_aux_loss(bal)) {
        int64_t N = m->B * m->T;
        k3rt_tensor ds = k3rt_tensor_view(m->a->d_scores[s / 2], K3RT_F32, m->opt.device, 2, N,
                                          L->experts, 0, 0);
        /* the sum stays where the run computes: staged on a GPU, read once per step */
        double *sum = m->opt.device == K3RT_DEVICE_CPU ? &m->aux_loss : m->aux_stage;
        k3rt_tensor sum_t = k3rt_tensor_view(sum, K3RT_F64, m->opt.device, 1, 1, 0, 0, 0);
        K3RT_TRY(rig_aux_loss_add(bal, routing, aux_scale, sum_t, &m->aux_loss, ds, err));
    }
    return prof_end(m->prof, err);
}

static int sublayer_backward(model *m, int s, k3rt_error *err)
{
    int mi = model_sub_module(m, s), recompute;
    K3RT_TRY(actman_before_backward(m, mi, &recompute, err));
    if (recompute)
        K3RT_TRY(sublayer_forward(m, s, 1, 1, 0.0, err));
    model_module *mm = &m->mods[mi];
    const model_layer *L = &m->layers[s / 2];
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = model_act_tensor(m, m->a->xn);
    a.dy = model_act_tensor(m, m->a->dys);
    a.dx = model_act_tensor(m, m->a->dxn);
    const rig *bal = s % 2 ? model_balancer(m, s / 2) : NULL;
    if (s % 2 == 0)
        a.doc_offsets = m->docs;
    if (bal && rig_has_aux_loss(bal))
        a.d_scores = k3rt_tensor_view(m->a->d_scores[s / 2], K3RT_F32, m->opt.device, 2,
                                      m->B * m->T, L->experts, 0, 0);
    PROF_TRY(m->prof, profile_module_row(mi, 1), rig_backward(&mm->r, &a, err));
    return K3RT_OK;
}

int model_forward_body(model *m, const int32_t *tokens, int training, double aux_scale,
                       k3rt_error *err)
{
    model_acts *a = m->a;
    k3rt_stream *st = m->opt.stream;
    int dt = m->opt.dtype;
    int64_t N = m->B * m->T;
    K3RT_TRY(prof_begin(m->prof, PROF_EMBED_FWD, err));
    K3RT_TRY(k3rt_memcpy(st, a->tokens, m->opt.device, tokens, K3RT_DEVICE_CPU,
                         (size_t)N * sizeof(int32_t), err));
    K3RT_TRY(k3rt_embedding_fwd(st, dt, m->params[m->embed].param.data, a->tokens, a->h0, N,
                                m->vocab, m->d, err));
    K3RT_TRY(prof_end(m->prof, err));
    K3RT_TRY(residual_call(m, RIG_BEGIN, 0, a->h0, err));
    if (training && m->routed_stage) {  /* this forward's slot of routed counts */
        if (m->routed_used == MODEL_ROUTED_SLOTS)
            K3RT_TRY(model_flush_routed(m, err));
        if (m->routed_used++ == 0)  /* a new round of slots: its auxiliary loss from zero */
            K3RT_TRY(k3rt_memset(st, m->aux_stage, m->opt.device, 0, sizeof *m->aux_stage, err));
    }
    for (int s = 0; s < 2 * m->n_layers; s++) {
        void *hs = model_sub(m, a->hs, s);
        void *rstd = (char *)a->rstd + (int64_t)s * N * (int64_t)m->master_elem;
        K3RT_TRY(mix_and_norm(m, s, hs, rstd, err));
        K3RT_TRY(sublayer_forward(m, s, training, 0, aux_scale, err));
        K3RT_TRY(residual_call(m, RIG_PUSH, s, a->ys, err));
    }
    K3RT_TRY(residual_call(m, RIG_FINISH, 2 * m->n_layers, a->hf, err));
    PROF_TRY(m->prof, PROF_NORM_FWD,
             k3rt_rmsnorm_fwd(st, dt, a->hf, m->params[m->final_norm].param.data, a->hn,
                              a->rstd_f, N, m->d, m->norm_eps, err));
    return K3RT_OK;
}

/* LM head and cross-entropy in row chunks. With grad_scale != 0 the head's backward runs
 * right away: dhn = dlogits @ W, dW += dlogits^T @ hn. */
static int head_and_loss(model *m, const int32_t *targets, double grad_scale, double *loss_sum,
                         int64_t *count, k3rt_error *err)
{
    model_acts *a = m->a;
    k3rt_stream *st = m->opt.stream;
    int dt = m->opt.dtype;
    int64_t N = m->B * m->T, V = m->vocab;
    const param_slot *head = &m->params[m->head];
    K3RT_TRY(prof_begin(m->prof, PROF_HEAD_FWD, err));
    K3RT_TRY(k3rt_memcpy(st, a->targets, m->opt.device, targets, K3RT_DEVICE_CPU,
                         (size_t)N * sizeof(int32_t), err));
    double total = 0;
    int64_t valid = 0;
    for (int64_t i = 0; i < N; i++)
        valid += targets[i] >= 0;
    for (int64_t r0 = 0; r0 < N; r0 += a->chunk) {
        int64_t rows = N - r0 < a->chunk ? N - r0 : a->chunk;
        void *hn = model_row(m, a->hn, r0);
        K3RT_TRY(k3rt_linear_fwd(st, dt, hn, head->param.data, NULL, a->logits, rows, m->d, V,
                                 err));
        void *row_loss = (char *)a->row_loss + r0 * (int64_t)m->master_elem;
        K3RT_TRY(k3rt_xent_fwd(st, dt, a->logits, a->targets + r0, row_loss, a->lse, rows, V,
                               err));
        if (grad_scale == 0.0)
            continue;
        K3RT_TRY(prof_begin(m->prof, PROF_HEAD_BWD, err));  /* pauses the forward's part */
        K3RT_TRY(k3rt_xent_bwd(st, dt, a->logits, a->targets + r0, a->lse, grad_scale,
                               a->logits, rows, V, err));
        K3RT_TRY(k3rt_linear_bwd(st, dt, hn, head->param.data, a->logits,
                                 model_row(m, a->dhn, r0), head->grad.data, NULL, rows, m->d, V,
                                 0, err));
        K3RT_TRY(prof_end(m->prof, err));
    }
    K3RT_TRY(sum_rows(m, a->row_loss, N, &total, err));
    K3RT_TRY(prof_end(m->prof, err));
    *loss_sum = total;
    if (count)
        *count = valid;
    return K3RT_OK;
}

static int backward_body(model *m, k3rt_error *err)
{
    model_acts *a = m->a;
    k3rt_stream *st = m->opt.stream;
    int dt = m->opt.dtype;
    int64_t N = m->B * m->T;
    const param_slot *fn = &m->params[m->final_norm];
    PROF_TRY(m->prof, PROF_NORM_BWD,
             k3rt_rmsnorm_bwd(st, dt, a->hf, fn->param.data, a->rstd_f, a->dhn, a->dh,
                              fn->grad.data, N, m->d, 0, err));
    K3RT_TRY(residual_call(m, RIG_FINISH_BACKWARD, 2 * m->n_layers, a->dh, err));
    actman_begin_backward(m);
    for (int s = 2 * m->n_layers - 1; s >= 0; s--) {
        void *hs = model_sub(m, a->hs, s);
        void *rstd = (char *)a->rstd + (int64_t)s * N * (int64_t)m->master_elem;
        const param_slot *g = &m->params[model_sub_norm(m, s)];
        K3RT_TRY(residual_call(m, RIG_PUSH_BACKWARD, s, a->dys, err));
        /* The normed input is cheaper to recompute than to keep for every sublayer. */
        PROF_TRY(m->prof, PROF_NORM_BWD,
                 k3rt_rmsnorm_fwd(st, dt, hs, g->param.data, a->xn, NULL, N, m->d,
                                  m->norm_eps, err));
        K3RT_TRY(sublayer_backward(m, s, err));
        K3RT_TRY(norm_and_mix_backward(m, s, hs, rstd, err));
    }
    K3RT_TRY(residual_call(m, RIG_BEGIN_BACKWARD, 0, a->dh, err));
    PROF_TRY(m->prof, PROF_EMBED_BWD,
             k3rt_embedding_bwd(st, dt, a->tokens, a->dh, m->params[m->embed].grad.data, N,
                                m->vocab, m->d, err));
    return K3RT_OK;
}

int model_train_step(model *m, const int32_t *tokens, const int32_t *targets, double grad_scale,
                     double aux_scale, double *loss_sum, k3rt_error *err)
{
    if (!m->a)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: call model_set_shape first");
    K3RT_TRY(model_forward_body(m, tokens, 1, aux_scale, err));
    K3RT_TRY(head_and_loss(m, targets, grad_scale, loss_sum, NULL, err));
    return backward_body(m, err);
}

int model_eval(model *m, const int32_t *tokens, const int32_t *targets, double *loss_sum,
               int64_t *count, k3rt_error *err)
{
    if (!m->a)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: call model_set_shape first");
    K3RT_TRY(model_forward_body(m, tokens, 0, 0.0, err));
    return head_and_loss(m, targets, 0.0, loss_sum, count, err);
}

int model_logits_at(model *m, const int32_t *tokens, int64_t pos, double *logits,
                    k3rt_error *err)
{
    if (pos < 0 || pos >= m->T)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: position %lld outside [0, %lld)",
                         (long long)pos, (long long)m->T);
    if (!m->a)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: call model_set_shape first");
    K3RT_TRY(model_forward_body(m, tokens, 0, 0.0, err));
    for (int64_t b = 0; b < m->B; b++)
        K3RT_TRY(model_row_logits(m, b * m->T + pos, logits + b * m->vocab, err));
    return K3RT_OK;
}

int model_row_logits(model *m, int64_t row, double *logits, k3rt_error *err)
{
    K3RT_TRY(k3rt_linear_fwd(m->opt.stream, m->opt.dtype, model_row(m, m->a->hn, row),
                             m->params[m->head].param.data, NULL, m->a->logits, 1, m->d,
                             m->vocab, err));
    return to_host(m, m->a->logits, m->opt.dtype, m->vocab, logits, err);
}

int model_flops(model *m, int64_t B, int64_t T, double *forward, double *backward,
                k3rt_error *err)
{
    double f = 0, b = 0;
    for (int i = 0; i < m->n_mods; i++) {
        if (m->mods[i].kind == K3RT_KIND_BALANCER)
            continue;
        k3rt_flops fl;
        K3RT_TRY(rig_flops(&m->mods[i].r, B, T, &fl, err));
        f += fl.forward;
        b += fl.backward;
    }
    double head = 2.0 * (double)(B * T) * (double)m->d * (double)m->vocab;
    *forward = f + head;
    *backward = b + 2 * head;
    return K3RT_OK;
}
