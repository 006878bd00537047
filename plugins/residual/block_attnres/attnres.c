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
    size_t acc_bytes;   /* the same in the accumulators' dtype */
    int64_t numel;
} call;

/* The call's buffers: the model's state in saved (its layout in attnres.h), scratch. */
static void call_open(attnres *r, const k3rt_residual_args *a, call *c)
{
    c->r = r;
    c->a = a;
    attnres_layout_make(r, a->batch * a->seq, &c->l);
    c->saved = a->saved[0];
    c->ws = a->workspace;
    c->numel = k3rt_tensor_numel(&a->t);
    c->row_bytes = k3rt_tensor_bytes(&a->t);
    c->acc_bytes = (size_t)c->numel * k3rt_dtype_size(r->acc);
}

static int on_cuda(const call *c) { return c->r->device != K3RT_DEVICE_CPU; }

static void *src(const call *c, int j) { return c->saved + c->l.src + j * c->l.row; }
static void *dsrc(const call *c, int j) { return c->saved + c->l.dsrc + j * c->l.acc_row; }
static void *part(const call *c) { return c->saved + c->l.partial; }
static void *dpart(const call *c) { return c->saved + c->l.dpartial; }

static int copy(const call *c, void *dst, const void *from, size_t bytes, k3rt_error *err)
{
    int dev = c->r->device;
    return k3rt_memcpy(c->a->stream, dst, dev, from, dev, bytes, err);
}

static int add(const call *c, void *dst, const void *x, k3rt_error *err)
{
    return k3rt_axpby(c->a->stream, c->r->dtype, c->numel, 1.0, x, 1.0, dst, err);
}

/* t (the run's dtype) = an accumulator row, and back (copies on the CPU). */
static int to_act(const call *c, void *t, const void *acc, k3rt_error *err)
{
    return k3rt_cast(c->a->stream, acc, c->r->acc, t, c->r->dtype, c->numel, err);
}

static int to_acc(const call *c, void *acc, const void *t, k3rt_error *err)
{
    return k3rt_cast(c->a->stream, t, c->r->dtype, acc, c->r->acc, c->numel, err);
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

/* The engine's pre-norm of h (mix_norm's normed and rstd). */
static int engine_norm(const call *c, const void *h, k3rt_error *err)
{
    const k3rt_residual_args *a = c->a;
    return k3rt_rmsnorm_fwd(a->stream, c->r->dtype, h, a->norm_gain.data, a->normed.data,
                            a->rstd.data, c->l.N, c->r->d, a->norm_eps, err);
}

/* d normed (a->t) -> the gradient of the normed input h, into the workspace. */
static void *engine_norm_backward(const call *c, const void *h, k3rt_error *err)
{
    const k3rt_residual_args *a = c->a;
    void *dh = c->ws + c->l.ws_dh;
    int rc = k3rt_rmsnorm_bwd(a->stream, c->r->dtype, h, a->norm_gain.data, a->rstd.data,
                              a->t.data, dh, a->norm_gain_grad.data, c->l.N, c->r->d, 0, err);
    return rc ? NULL : dh;
}

/* h = the op (h32: its f32 copy, CUDA only; may be NULL); with norm, also the pre-norm. */
static int op_fwd(const call *c, const ar_op *op, void *h, void *h32, int norm,
                  k3rt_error *err)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (on_cuda(c))
        return attnres_cuda_fwd(c->r, op, norm ? c->a : NULL, h, h32, err);
#endif
    (void)h32;
    K3RT_TRY(c->r->dtype == K3RT_F32 ? attnres_fwd_f32(op, h, err) : attnres_fwd_f64(op, h, err));
    return norm ? engine_norm(c, h, err) : K3RT_OK;
}

/* How a backward call reaches the op's output and its gradient. */
typedef struct bwd_io {
    const void *dh;    /* the gradient of h, or with norm of the pre-norm's output */
    const void *h;     /* the op's output as the forward stored it (NULL: use h32) */
    const void *h32;   /* CUDA: its f32 copy */
    int recon;         /* the last source (the partial) is rebuilt from h into op->v[n-1] */
    int norm;          /* the pre-norm is fused (mix_norm_backward) */
    int overwrite;     /* op mode on CUDA: r->dv are written, not accumulated */
} bwd_io;

/* Op s backward into r->dv and the op's parameter gradients. */
static int op_bwd(const call *c, const ar_op *op, int s, const bwd_io *io, k3rt_error *err)
{
    attnres *r = c->r;
    void *dw = c->a->grads[2 * s].data, *dg = c->a->grads[2 * s + 1].data;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (on_cuda(c))
        return attnres_cuda_bwd(r, op, io->norm ? c->a : NULL, io->dh, io->h, io->h32,
                                io->recon, io->overwrite, r->dv, dw, dg, c->ws + c->l.ws_part,
                                err);
#endif
    const void *dh = io->dh;
    if (io->norm && !(dh = engine_norm_backward(c, io->h, err)))
        return err->code;
    if (io->recon)
        K3RT_TRY(r->dtype == K3RT_F32
                     ? attnres_partial_f32(op, io->h, (void *)op->v[op->n - 1], err)
                     : attnres_partial_f64(op, io->h, (void *)op->v[op->n - 1], err));
    void *cw = c->ws + c->l.ws_c, *dq = c->ws + c->l.ws_dq;
    return r->dtype == K3RT_F32 ? attnres_bwd_f32(op, dh, r->dv, dw, dg, cw, dq, err)
                                : attnres_bwd_f64(op, dh, r->dv, dw, dg, cw, dq, err);
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

static int note(const call *c, int s, const ar_op *op, k3rt_error *err)
{
    return attnres_note_alpha(c->r, c->a->stream, s, op ? op->alpha : NULL, c->l.N,
                              op ? op->n : 1, err);
}

/* ---- forward --------------------------------------------------------------------------------- */

int attnres_begin(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return copy(&c, src(&c, 0), a->t.data, c.row_bytes, err);
}

/* mix(s), and with norm the engine's pre-norm of what it returns. */
static int mix(attnres *r, const k3rt_residual_args *a, int norm, k3rt_error *err)
{
    call c;
    call_open(r, a, &c);
    int s = a->sublayer;
    if (s == 0) {
        /* K3's layer-0 rule: the first attention input is the embedding alone. */
        K3RT_TRY(note(&c, 0, NULL, err));
        K3RT_TRY(copy(&c, a->t.data, src(&c, 0), c.row_bytes, err));
        return norm ? engine_norm(&c, a->t.data, err) : K3RT_OK;
    }
    ar_op op = model_op(&c, s, part(&c));
    K3RT_TRY(op_fwd(&c, &op, a->t.data, NULL, norm, err));
    K3RT_TRY(note(&c, s, &op, err));
    if (attnres_opens(r, s))
        return copy(&c, src(&c, attnres_closed(r, s)), part(&c), c.row_bytes, err);
    return K3RT_OK;
}

int attnres_mix(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return mix(self, a, 0, err);
}

int attnres_mix_norm(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return mix(self, a, 1, err);
}

int attnres_push(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    if (attnres_opens(r, a->sublayer))
        return copy(&c, part(&c), a->t.data, c.row_bytes, err);
    return add(&c, part(&c), a->t.data, err);
}

int attnres_finish(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    ar_op op = model_op(&c, r->S, part(&c));
    void *h32 = on_cuda(&c) ? c.saved + c.l.out32 : NULL;
    K3RT_TRY(op_fwd(&c, &op, a->t.data, h32, 0, err));
    return note(&c, r->S, &op, err);
}

/* ---- backward -------------------------------------------------------------------------------- */

/* Runs op s backward: dsrc[j] += for the stored sources, dP += for the partial. */
static int model_op_backward(const call *c, int s, const void *partial, const bwd_io *io,
                             k3rt_error *err)
{
    ar_op op = model_op(c, s, partial);
    for (int j = 0; j < op.n - 1; j++)
        c->r->dv[j] = dsrc(c, j);
    c->r->dv[op.n - 1] = dpart(c);
    return op_bwd(c, &op, s, io, err);
}

int attnres_finish_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    call_open(r, a, &c);
    /* d stored sources and dP are contiguous: zero them in one go. */
    K3RT_TRY(k3rt_memset(a->stream, dsrc(&c, 0), r->device, 0,
                         (size_t)((r->nb + 1) * c.l.acc_row), err));
    bwd_io io = {.dh = a->t.data, .h32 = c.saved + c.l.out32};
    return model_op_backward(&c, r->S, part(&c), &io, err);
}

int attnres_push_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return to_act(&c, a->t.data, dpart(&c), err);
}

/* mix_backward(s) from the gradient of the sublayer input, or with norm of its pre-norm. */
static int mix_backward(attnres *r, const k3rt_residual_args *a, int norm, k3rt_error *err)
{
    call c;
    call_open(r, a, &c);
    int s = a->sublayer;
    const void *h = a->sublayer_input.data;
    if (s == 0) {
        /* The embedding: every reader of src[0] plus layer 0's identity mix. */
        const void *dh = a->t.data;
        if (norm && !(dh = engine_norm_backward(&c, h, err)))
            return err->code;
        K3RT_TRY(to_acc(&c, dpart(&c), dh, err));
        return k3rt_axpby(a->stream, r->acc, c.numel, 1.0, dsrc(&c, 0), 1.0, dpart(&c), err);
    }
    int n = attnres_closed(r, s);
    bwd_io io = {.dh = a->t.data, .h = h, .norm = norm};
    if (attnres_opens(r, s)) {
        /* It read the partial sum that became src[n]; all of src[n]'s readers are done. */
        K3RT_TRY(copy(&c, dpart(&c), dsrc(&c, n), c.acc_bytes, err));
        return model_op_backward(&c, s, src(&c, n), &io, err);
    }
    io.recon = 1;
    return model_op_backward(&c, s, c.ws + c.l.ws_row, &io, err);
}

int attnres_mix_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return mix_backward(self, a, 0, err);
}

int attnres_mix_norm_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    return mix_backward(self, a, 1, err);
}

int attnres_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    call c;
    call_open(self, a, &c);
    return to_act(&c, a->t.data, dpart(&c), err);
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
    K3RT_TRY(op_fwd(&c, &op, a->t.data, NULL, 0, err));
    return note(&c, a->sublayer, &op, err);
}

/* t is dy; the weights are recomputed from the sources (the op keeps nothing between calls).
 * The CPU accumulates into zeroed gradients; CUDA writes them. */
int attnres_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err)
{
    attnres *r = self;
    call c;
    ar_op op;
    call_open(r, a, &c);
    K3RT_TRY(op_mode(&c, &op, err));
    int n = op.n;
    bwd_io io = {.dh = a->t.data, .h = c.ws + c.l.ws_row, .overwrite = on_cuda(&c)};
    if (on_cuda(&c))
        io.h32 = c.ws + c.l.ws_h32;
    K3RT_TRY(op_fwd(&c, &op, c.ws + c.l.ws_row, (void *)io.h32, 0, err));
    for (int j = 0; j < a->n_sources; j++)
        r->dv[j] = a->d_sources[j].data;
    if (n > a->n_sources)
        r->dv[n - 1] = a->d_partial.data;  /* given with partial (the host checked) */
    for (int j = 0; j < n && !io.overwrite; j++)
        K3RT_TRY(k3rt_memset(a->stream, r->dv[j], K3RT_DEVICE_CPU, 0, c.row_bytes, err));
    return op_bwd(&c, &op, a->sublayer, &io, err);
}
