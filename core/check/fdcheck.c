/* Finite-difference gradient checks through the plugin vtables (fdcheck.h). */
#include "check/fdcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/rig.h"

void fd_options_defaults(fd_options *o)
{
    if (!o->batch) o->batch = 2;
    if (!o->seq) o->seq = 5;
    if (!o->d_model) o->d_model = 16;
    if (!o->vocab) o->vocab = 32;
    if (!o->n_layers) o->n_layers = 2;
    if (!o->samples) o->samples = 10;
    if (!o->eps) o->eps = 1e-6;
    if (!o->tol) o->tol = 1e-6;
    if (!o->jitter) o->jitter = 0.1;
    if (!o->x_scale) o->x_scale = 1.0;
    if (!o->threads) o->threads = 1;
    if (!o->stencil) o->stencil = 2;
}

/* One tensor whose entries are perturbed, with the analytic gradient to compare to. */
typedef struct fd_target {
    char name[160];
    double *value;
    const double *grad;
    int64_t n;
} fd_target;

typedef int (*fd_loss_fn)(void *ctx, double *loss, k3rt_error *err);

static void note(fd_result *r, double rel, const char *name, int64_t i, double a, double num)
{
    r->n_checked++;
    if (rel > r->worst || r->n_checked == 1) {
        r->worst = rel;
        snprintf(r->worst_what, sizeof r->worst_what,
                 "%s[%lld]: analytic %.9e, numeric %.9e, relative error %.2e", name,
                 (long long)i, a, num, rel);
    }
}

static int check_targets(const fd_target *t, int nt, fd_loss_fn loss, void *ctx,
                         const fd_options *o, fd_result *r, k3rt_error *err)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, o->seed, 0xfdcull);
    for (int k = 0; k < nt; k++) {
        double rms = 0;
        for (int64_t i = 0; i < t[k].n; i++)
            rms += t[k].grad[i] * t[k].grad[i];
        rms = sqrt(rms / (double)(t[k].n ? t[k].n : 1));
        /* Entries far below the tensor's typical gradient are judged on an absolute floor. */
        double floor = 1e-3 * rms + 1e-12;
        int64_t m = t[k].n < o->samples ? t[k].n : o->samples;
        for (int64_t s = 0; s < m; s++) {
            int64_t i = t[k].n <= o->samples ? s : (int64_t)(k3rt_rng_u64(&rng) % (uint64_t)t[k].n);
            /* (f(+h) - f(-h)) / 2h, or (8 (f(+h) - f(-h)) - (f(+2h) - f(-2h))) / 12h */
            static const double step[2] = {1, 2}, weight[2][2] = {{0.5, 0}, {8.0 / 12, -1.0 / 12}};
            double keep = t[k].value[i], num = 0;
            int rc = K3RT_OK;
            for (int j = 0; j < (o->stencil == 4 ? 2 : 1) && !rc; j++) {
                double lp = 0, lm = 0;
                t[k].value[i] = keep + step[j] * o->eps;
                rc = loss(ctx, &lp, err);
                t[k].value[i] = keep - step[j] * o->eps;
                if (!rc)
                    rc = loss(ctx, &lm, err);
                num += weight[o->stencil == 4][j] * (lp - lm) / o->eps;
            }
            t[k].value[i] = keep;
            if (rc)
                return rc;
            double a = t[k].grad[i];
            double scale = fmax(fmax(fabs(a), fabs(num)), floor);
            note(r, fabs(a - num) / scale, t[k].name, i, a, num);
        }
    }
    return K3RT_OK;
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void randn(double *x, int64_t n, double scale, k3rt_rng *rng)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * k3rt_rng_normal(rng);
}

/* The instance of a check: f64 on the CPU, its parameters initialised as declared plus
 * jitter, its buffers at B x T. */
static int fd_open(rig *r, const plugin_entry *e, const json_t *config, const fd_options *o,
                   int layer, k3rt_stream *stream, k3rt_error *err)
{
    k3rt_create_args args;
    memset(&args, 0, sizeof args);
    args.dtype = K3RT_F64;
    args.device = K3RT_DEVICE_CPU;
    args.d_model = o->d_model;
    args.vocab = o->vocab;
    args.n_layers = o->n_layers;
    args.layer = layer;
    args.stream = stream;
    args.seed = o->seed;
    K3RT_TRY(rig_create(r, e, config, &args, "fdcheck", err));
    K3RT_TRY(rig_alloc_params(r, err));
    K3RT_TRY(rig_alloc_shape(r, o->batch, o->seq, 0, err));
    k3rt_rng rng;
    k3rt_rng_seed(&rng, o->seed, 0x7a11ull);
    for (int i = 0; i < rig_n_params(r); i++) {
        const k3rt_param_decl *d = rig_param(r, i);
        k3rt_tensor t = r->params[i];
        int64_t n = k3rt_tensor_numel(&t);
        K3RT_TRY(rig_init_param(r, i, t, o->seed, d->name, err));
        if (d->init == K3RT_INIT_ZEROS || d->init == K3RT_INIT_ONES ||
            d->init == K3RT_INIT_CONST)
            for (int64_t j = 0; j < n; j++)
                ((double *)t.data)[j] += o->jitter * k3rt_rng_normal(&rng);
    }
    return K3RT_OK;
}

static void zero_grads(rig *r)
{
    for (int i = 0; i < rig_n_params(r); i++)
        memset(r->grads[i].data, 0, k3rt_tensor_bytes(&r->grads[i]));
}

static int add_param_targets(rig *r, fd_target *t, int at)
{
    for (int i = 0; i < rig_n_params(r); i++, at++) {
        const k3rt_param_decl *d = rig_param(r, i);
        if (r->kind == K3RT_KIND_RESIDUAL && d->layer >= 0)
            snprintf(t[at].name, sizeof t[at].name, "grad.layers.%d.%s", d->layer, d->name);
        else
            snprintf(t[at].name, sizeof t[at].name, "grad.%s", d->name);
        t[at].value = r->params[i].data;
        t[at].grad = r->grads[i].data;
        t[at].n = k3rt_tensor_numel(&r->params[i]);
    }
    return at;
}

/* ---- attention / moe ------------------------------------------------------------------------- */

typedef struct module_ctx {
    rig r;
    k3rt_stream *stream;
    int64_t B, T, d, n;
    double *x, *y, *dy, *dx;
    int has_state;
    double *s_in, *s_out, *ds_out, *ds_in;
    int64_t state_n;
    float *bias;
} module_ctx;

static k3rt_tensor act(const module_ctx *c, double *data)
{
    return k3rt_tensor_view(data, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
}

static k3rt_tensor state(const module_ctx *c, double *data)
{
    k3rt_tensor t = c->r.state.state;
    t.data = data;
    return t;
}

static int module_forward(module_ctx *c, int training, k3rt_error *err)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = act(c, c->x);
    a.y = act(c, c->y);
    k3rt_routing routing;
    if (c->has_state) {
        a.state_in = state(c, c->s_in);
        a.state_out = state(c, c->s_out);
    }
    if (c->r.experts) {
        a.bias = k3rt_tensor_view(c->bias, K3RT_F32, K3RT_DEVICE_CPU, 1, c->r.experts, 0, 0, 0);
        a.routing = &routing;
    }
    return rig_forward(&c->r, &a, err);
}

static int module_loss(void *ctx, double *loss, k3rt_error *err)
{
    module_ctx *c = ctx;
    K3RT_TRY(module_forward(c, 1, err));
    *loss = dot(c->y, c->dy, c->n);
    if (c->has_state)
        *loss += dot(c->s_out, c->ds_out, c->state_n);
    return K3RT_OK;
}

static int module_backward(module_ctx *c, k3rt_error *err)
{
    K3RT_TRY(module_forward(c, 1, err));
    zero_grads(&c->r);
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act(c, c->x);
    a.dy = act(c, c->dy);
    a.dx = act(c, c->dx);
    if (c->has_state) {
        a.state_in = state(c, c->s_in);
        a.d_state_out = state(c, c->ds_out);
        a.d_state_in = state(c, c->ds_in);
    }
    return rig_backward(&c->r, &a, err);
}

static void module_ctx_free(module_ctx *c)
{
    rig_destroy(&c->r);
    free(c->x), free(c->y), free(c->dy), free(c->dx);
    free(c->s_in), free(c->s_out), free(c->ds_out), free(c->ds_in), free(c->bias);
    k3rt_stream_destroy(c->stream);
}

int fd_check_module(const plugin_entry *e, const json_t *config, const fd_options *opts,
                    fd_result *r, k3rt_error *err)
{
    fd_options o = *opts;
    fd_options_defaults(&o);
    memset(r, 0, sizeof *r);
    if (e->desc.kind != K3RT_KIND_ATTENTION && e->desc.kind != K3RT_KIND_MOE)
        return k3rt_fail(err, K3RT_ERR_INVALID, "fd_check_module: %s is a %s plugin",
                         e->desc.name, k3rt_kind_name(e->desc.kind));
    module_ctx c;
    memset(&c, 0, sizeof c);
    c.B = o.batch, c.T = o.seq, c.d = o.d_model, c.n = o.batch * o.seq * o.d_model;
    int rc = k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &c.stream, err);
    if (rc)
        return rc;
    k3rt_stream_set_threads(c.stream, o.threads);
    rc = fd_open(&c.r, e, config, &o, o.layer, c.stream, err);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, o.seed, 0xda7aull);
    c.x = malloc((size_t)c.n * sizeof(double));
    c.y = calloc((size_t)c.n, sizeof(double));
    c.dy = malloc((size_t)c.n * sizeof(double));
    c.dx = calloc((size_t)c.n, sizeof(double));
    c.bias = calloc((size_t)c.r.experts + 1, sizeof(float));
    if (!rc && (!c.x || !c.y || !c.dy || !c.dx || !c.bias))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
    if (!rc) {
        randn(c.x, c.n, o.x_scale, &rng);
        randn(c.dy, c.n, 1.0, &rng);
        for (int i = 0; i < c.r.experts; i++)  /* a non-zero selection bias, as in training */
            c.bias[i] = (float)(0.01 * k3rt_rng_normal(&rng));
    }
    c.state_n = rc ? 0 : k3rt_tensor_numel(&c.r.state.state);
    if (!rc && c.r.state.state.ndim && c.state_n > 0) {
        c.has_state = 1;
        c.s_in = malloc((size_t)c.state_n * sizeof(double));
        c.s_out = calloc((size_t)c.state_n, sizeof(double));
        c.ds_out = malloc((size_t)c.state_n * sizeof(double));
        c.ds_in = calloc((size_t)c.state_n, sizeof(double));
        if (!c.s_in || !c.s_out || !c.ds_out || !c.ds_in)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        else {
            randn(c.s_in, c.state_n, 0.5, &rng);
            randn(c.ds_out, c.state_n, 1.0, &rng);
        }
    }
    if (!rc)
        rc = module_backward(&c, err);
    if (!rc) {
        fd_target *t = calloc((size_t)rig_n_params(&c.r) + 2, sizeof *t);
        if (!t)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        else {
            snprintf(t[0].name, sizeof t[0].name, "grad.x");
            t[0].value = c.x, t[0].grad = c.dx, t[0].n = c.n;
            int nt = add_param_targets(&c.r, t, 1);
            if (c.has_state) {
                snprintf(t[nt].name, sizeof t[nt].name, "grad.state_in");
                t[nt].value = c.s_in, t[nt].grad = c.ds_in, t[nt].n = c.state_n;
                nt++;
            }
            rc = check_targets(t, nt, module_loss, &c, &o, r, err);
            free(t);
        }
    }
    module_ctx_free(&c);
    return rc;
}

/* ---- residual ---------------------------------------------------------------------------------- */

typedef struct residual_ctx {
    rig r;
    k3rt_stream *stream;
    int64_t B, T, d, n;
    int S;
    double *x0, *dout, *dx0, *out, *gates, *xs, *ys, *dys, *dxs;
} residual_ctx;

static int residual_call(residual_ctx *c, rig_residual_call call, int s, double *t,
                         const double *input, k3rt_error *err)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s;
    a.t = k3rt_tensor_view(t, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.training = 1;
    if (input)
        a.sublayer_input = k3rt_tensor_view((double *)input, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B,
                                            c->T, c->d, 0);
    return rig_residual(&c->r, call, &a, err);
}

/* The toy sublayer s: y = tanh(gate_s * x), elementwise. */
static void toy_sublayer(const residual_ctx *c, int s, const double *x, double *y)
{
    const double *g = c->gates + (int64_t)s * c->d;
    for (int64_t i = 0; i < c->n; i++)
        y[i] = tanh(g[i % c->d] * x[i]);
}

static int residual_forward(residual_ctx *c, k3rt_error *err)
{
    K3RT_TRY(residual_call(c, RIG_BEGIN, 0, c->x0, NULL, err));
    for (int s = 0; s < c->S; s++) {
        double *xs = c->xs + (int64_t)s * c->n, *ys = c->ys + (int64_t)s * c->n;
        K3RT_TRY(residual_call(c, RIG_MIX, s, xs, NULL, err));
        toy_sublayer(c, s, xs, ys);
        K3RT_TRY(residual_call(c, RIG_PUSH, s, ys, NULL, err));
    }
    return residual_call(c, RIG_FINISH, c->S, c->out, NULL, err);
}

static int residual_loss(void *ctx, double *loss, k3rt_error *err)
{
    residual_ctx *c = ctx;
    K3RT_TRY(residual_forward(c, err));
    *loss = dot(c->out, c->dout, c->n);
    return K3RT_OK;
}

static int residual_backward(residual_ctx *c, k3rt_error *err)
{
    K3RT_TRY(residual_forward(c, err));
    zero_grads(&c->r);
    K3RT_TRY(residual_call(c, RIG_FINISH_BACKWARD, c->S, c->dout, NULL, err));
    for (int s = c->S - 1; s >= 0; s--) {
        K3RT_TRY(residual_call(c, RIG_PUSH_BACKWARD, s, c->dys, NULL, err));
        const double *xs = c->xs + (int64_t)s * c->n, *g = c->gates + (int64_t)s * c->d;
        for (int64_t i = 0; i < c->n; i++) {
            double th = tanh(g[i % c->d] * xs[i]);
            c->dxs[i] = c->dys[i] * (1 - th * th) * g[i % c->d];
        }
        K3RT_TRY(residual_call(c, RIG_MIX_BACKWARD, s, c->dxs, xs, err));
    }
    return residual_call(c, RIG_BEGIN_BACKWARD, 0, c->dx0, NULL, err);
}

int fd_check_residual(const plugin_entry *e, const json_t *config, const fd_options *opts,
                      fd_result *r, k3rt_error *err)
{
    fd_options o = *opts;
    fd_options_defaults(&o);
    memset(r, 0, sizeof *r);
    if (e->desc.kind != K3RT_KIND_RESIDUAL)
        return k3rt_fail(err, K3RT_ERR_INVALID, "fd_check_residual: %s is a %s plugin",
                         e->desc.name, k3rt_kind_name(e->desc.kind));
    residual_ctx c;
    memset(&c, 0, sizeof c);
    c.B = o.batch, c.T = o.seq, c.d = o.d_model, c.n = o.batch * o.seq * o.d_model;
    c.S = 2 * o.n_layers;
    int rc = k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &c.stream, err);
    if (rc)
        return rc;
    k3rt_stream_set_threads(c.stream, o.threads);
    rc = fd_open(&c.r, e, config, &o, -1, c.stream, err);
    size_t nb = (size_t)c.n * sizeof(double);
    c.x0 = malloc(nb), c.dout = malloc(nb), c.dx0 = calloc(1, nb), c.out = calloc(1, nb);
    c.gates = malloc((size_t)c.S * (size_t)c.d * sizeof(double));
    c.xs = calloc((size_t)c.S, nb), c.ys = calloc((size_t)c.S, nb);
    c.dys = calloc(1, nb), c.dxs = calloc(1, nb);
    if (!rc && (!c.x0 || !c.dout || !c.dx0 || !c.out || !c.gates || !c.xs || !c.ys || !c.dys ||
                !c.dxs))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
    if (!rc) {
        k3rt_rng rng;
        k3rt_rng_seed(&rng, o.seed, 0x5e5ull);
        randn(c.x0, c.n, o.x_scale, &rng);
        randn(c.dout, c.n, 1.0, &rng);
        randn(c.gates, (int64_t)c.S * c.d, 1.0, &rng);
        rc = residual_backward(&c, err);
    }
    if (!rc) {
        fd_target *t = calloc((size_t)rig_n_params(&c.r) + 1, sizeof *t);
        if (!t)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        else {
            snprintf(t[0].name, sizeof t[0].name, "grad.embedding");
            t[0].value = c.x0, t[0].grad = c.dx0, t[0].n = c.n;
            int nt = add_param_targets(&c.r, t, 1);
            rc = check_targets(t, nt, residual_loss, &c, &o, r, err);
            free(t);
        }
    }
    rig_destroy(&c.r);
    free(c.x0), free(c.dout), free(c.dx0), free(c.out), free(c.gates), free(c.xs), free(c.ys);
    free(c.dys), free(c.dxs);
    k3rt_stream_destroy(c.stream);
    return rc;
}
