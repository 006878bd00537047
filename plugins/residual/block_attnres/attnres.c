/* Block AttnRes over the residual protocol: K3's control flow (spec §7), with kb sublayers per
 * block (2 * block_layers, or 1 for Full AttnRes). All activations live in `saved` (see
 * attnres.h); `src[j]` is stored source j (src[0] the embedding), `P` the partial sum.
 *
 *   begin(emb)      src[0] = emb
 *   mix(0)          out = src[0]                     layer 0's attention reads the embedding
 *   mix(s >= 1)     out = AR_s(src[0..n), P), n = closed(s); if s opens a block: src[n] = P
 *   push(s, y)      P = y if s opened a block, else P += y
 *   finish          out = AR_S(src[0..nb), P)
 *
 * The backward runs the same steps in reverse with dsrc[j] and dP: every reader of src[j]
 * adds into dsrc[j]; when the walk reaches the op that stored src[j], dsrc[j] becomes the
 * gradient of the partial sum it was. The partial sum a within-block op read is not kept per
 * sublayer: it is recovered from the sublayer's input (mix_backward's sublayer_input), which
 * the engine keeps anyway, so what this plugin holds grows with the blocks, not the layers.
 */
#include "attnres.h"

#include <stddef.h>
#include <stdio.h>

typedef struct call {
    attnres *r;
    const k3rt_residual_args *a;
    attnres_layout l;
    char *saved, *ws;
    size_t row_bytes;   /* bytes of one [B, T, d] activation */
} call;

/* The call's buffers: the model's state in saved (its layout in attnres.h), scratch. */
static void call_open(attnres *r, const k3rt_residual_args *a, call *c)
{
    c->r = r;
    c->a = a;
    attnres_layout_make(r, a->batch * a->seq, &c->l);
    c->saved = a->saved[0];
    c->ws = a->workspace;
    c->row_bytes = k3rt_tensor_bytes(&a->t);
}

static void *src(const call *c, int j) { return c->saved + c->l.src + j * c->l.row; }
static void *dsrc(const call *c, int j) { return c->saved + c->l.dsrc + j * c->l.row; }
static void *part(const call *c) { return c->saved + c->l.partial; }
static void *dpart(const call *c) { return c->saved + c->l.dpartial; }

static int copy(const call *c, void *dst, const void *from, k3rt_error *err)
{
    return k3rt_memcpy(c->a->stream, dst, K3RT_DEVICE_CPU, from, K3RT_DEVICE_CPU, c->row_bytes,
                       err);
}

static int add(const call *c, void *dst, const void *x, k3rt_error *err)
{
    return k3rt_axpby(c->a->stream, c->r->dtype, k3rt_tensor_numel(&c->a->t), 1.0, x, 1.0, dst,
                      err);
}

/* The mixing op of sublayer s over sources v[0..n): parameters 2s, 2s + 1. */
static ar_op make_op(const call *c, int s, int n, void *alpha, void *rho, void *z)
{
    ar_op op = {
        .stream = c->a->stream,
        .N = c->l.N,
        .d = c->r->d,
        .n = n,
        .v = c->r->v,
        .w = c->a->params[2 * s].data,
        .gamma = c->a->params[2 * s + 1].data,
        .eps = c->r->eps,
        .alpha = alpha,
        .rho_last = rho,
        .z_last = z,
        .q = c->ws + c->l.ws_q,
    };
    return op;
}

static int op_fwd(const call *c, const ar_op *op, void *h, k3rt_error *err)
{
    return c->r->dtype == K3RT_F32 ? attnres_fwd_f32(op, h, err) : attnres_fwd_f64(op, h, err);
}

static int op_bwd(const call *c, const ar_op *op, int s, const void *dh, k3rt_error *err)
{
    void *dw = c->a->grads[2 * s].data, *dg = c->a->grads[2 * s + 1].data;
    void *cw = c->ws + c->l.ws_c, *dq = c->ws + c->l.ws_dq;
    return c->r->dtype == K3RT_F32
               ? attnres_bwd_f32(op, dh, c->r->dv, dw, dg, cw, dq, err)
               : attnres_bwd_f64(op, dh, c->r->dv, dw, dg, cw, dq, err);
}

/* Mixing op s of the model over src[0..n) and P, with its cache in saved. */
static ar_op model_op(const call *c, int s, const void *partial)
{
    int n = attnres_closed(c->r, s);
    for (int j = 0; j < n; j++)
        c->r->v[j] = src(c, j);
    c->r->v[n] = partial;
    int64_t oa, orho, oz;
    attnres_op_offsets(c->r, &c->l, s, &oa, &orho, &oz);
    return make_op(c, s, n + 1, c->saved + oa, c->saved + orho, c->saved + oz);
}

/* ---- forward --------------------------------------------------------------------------------- */

int attnres_begin(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return copy(&c, src(&c, 0), a->t.data, err);
}

int attnres_mix(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    int s = a->sublayer;
    if (s == 0) {
        /* K3's layer-0 rule: the first attention input is the embedding alone. */
        r->alpha_sum[0] += (double)c.l.N;
        r->alpha_tokens[0] += c.l.N;
        return copy(&c, a->t.data, src(&c, 0), err);
    }
    ar_op op = model_op(&c, s, part(&c));
    K3RT_TRY(op_fwd(&c, &op, a->t.data, err));
    attnres_note_alpha(r, s, op.alpha, op.N, op.n);
    if (attnres_opens(r, s))
        return copy(&c, src(&c, attnres_closed(r, s)), part(&c), err);
    return K3RT_OK;
}

int attnres_push(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    if (attnres_opens(r, a->sublayer))
        return copy(&c, part(&c), a->t.data, err);
    return add(&c, part(&c), a->t.data, err);
}

int attnres_finish(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    ar_op op = model_op(&c, r->S, part(&c));
    K3RT_TRY(op_fwd(&c, &op, a->t.data, err));
    attnres_note_alpha(r, r->S, op.alpha, op.N, op.n);
    return K3RT_OK;
}

/* ---- backward -------------------------------------------------------------------------------- */

/* Runs op s backward from dh = t: dsrc[j] += for the stored sources, dP += for the partial. */
static int model_op_backward(const call *c, int s, const void *partial, k3rt_error *err)
{
    ar_op op = model_op(c, s, partial);
    for (int j = 0; j < op.n - 1; j++)
        c->r->dv[j] = dsrc(c, j);
    c->r->dv[op.n - 1] = dpart(c);
    return op_bwd(c, &op, s, c->a->t.data, err);
}

int attnres_finish_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    /* d stored sources and dP are contiguous: zero them in one go. */
    K3RT_TRY(k3rt_memset(a->stream, dsrc(&c, 0), K3RT_DEVICE_CPU, 0,
                         (size_t)((r->nb + 1) * c.l.row), err));
    return model_op_backward(&c, r->S, part(&c), err);
}

int attnres_push_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return copy(&c, a->t.data, dpart(&c), err);
}

int attnres_mix_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    int s = a->sublayer;
    if (s == 0) {
        /* The embedding: every reader of src[0] plus layer 0's identity mix. */
        K3RT_TRY(copy(&c, dpart(&c), dsrc(&c, 0), err));
        return add(&c, dpart(&c), a->t.data, err);
    }
    int n = attnres_closed(r, s);
    if (attnres_opens(r, s)) {
        /* It read the partial sum that became src[n]; all of src[n]'s readers are done. */
        K3RT_TRY(copy(&c, dpart(&c), dsrc(&c, n), err));
        return model_op_backward(&c, s, src(&c, n), err);
    }
    const k3rt_tensor *h = &a->sublayer_input;
    void *p = c.ws + c.l.ws_row;
    ar_op op = model_op(&c, s, p);
    K3RT_TRY(r->dtype == K3RT_F32 ? attnres_partial_f32(&op, h->data, p, err)
                                  : attnres_partial_f64(&op, h->data, p, err));
    return model_op_backward(&c, s, p, err);
}

int attnres_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return copy(&c, a->t.data, dpart(&c), err);
}

/* ---- one op over explicit sources (`k3rt op`): sources.{j} then the partial, if given ------- */

static int op_sources(const call *c, int *n_out, k3rt_error *err)
{
    const k3rt_residual_args *a = c->a;
    int n = a->n_sources + (a->partial.ndim > 0);
    if (n > c->r->nb + 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres: %d sources, but a model of %d "
                         "layers (block_layers %d%s) mixes at most %d; give more layers",
                         n, c->r->n_layers, c->r->block_layers, c->r->full ? ", full" : "",
                         c->r->nb + 1);
    *n_out = n;
    return K3RT_OK;
}

/* Points r->v at the sources and the partial, and returns op s with alpha in workspace. */
static int op_mode(const call *c, ar_op *op, k3rt_error *err)
{
    int n = 0;
    K3RT_TRY(op_sources(c, &n, err));
    for (int j = 0; j < c->a->n_sources; j++)
        c->r->v[j] = c->a->sources[j].data;
    if (n > c->a->n_sources)
        c->r->v[n - 1] = c->a->partial.data;
    *op = make_op(c, c->a->sublayer, n, c->ws + c->l.ws_a, NULL, NULL);
    return K3RT_OK;
}

int attnres_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    ar_op op;
    call_open(self, a, &c);
    K3RT_TRY(op_mode(&c, &op, err));
    K3RT_TRY(op_fwd(&c, &op, a->t.data, err));
    attnres_note_alpha(self, a->sublayer, op.alpha, op.N, op.n);
    return K3RT_OK;
}

/* t is dy; the weights are recomputed from the sources (the op keeps nothing between calls). */
int attnres_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    ar_op op;
    call_open(r, a, &c);
    K3RT_TRY(op_mode(&c, &op, err));
    int n = op.n;
    K3RT_TRY(op_fwd(&c, &op, c.ws + c.l.ws_row, err));
    for (int j = 0; j < a->n_sources; j++)
        r->dv[j] = a->d_sources[j].data;
    if (n > a->n_sources)
        r->dv[n - 1] = a->d_partial.data;  /* given with partial (the host checked) */
    for (int j = 0; j < n; j++)
        K3RT_TRY(k3rt_memset(a->stream, r->dv[j], K3RT_DEVICE_CPU, 0, c.row_bytes, err));
    return op_bwd(&c, &op, a->sublayer, a->t.data, err);
}
