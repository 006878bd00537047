/* Finite-difference gradient checks through the plugin vtables (fdcheck.h). */
#include "plugin/fdcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"

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
                double lp, lm;
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

/* Parameters of a module as double host tensors, initialised as declared plus jitter. */
typedef struct fd_params {
    int n;
    k3rt_tensor *params, *grads;
} fd_params;

static void fd_params_free(fd_params *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->params[i].data);
        free(p->grads[i].data);
    }
    free(p->params);
    free(p->grads);
    memset(p, 0, sizeof *p);
}

static int fd_params_make(module *m, const fd_options *o, fd_params *p, k3rt_error *err)
{
    p->n = module_n_params(m);
    p->params = calloc((size_t)p->n + 1, sizeof(k3rt_tensor));
    p->grads = calloc((size_t)p->n + 1, sizeof(k3rt_tensor));
    if (!p->params || !p->grads)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
    k3rt_rng rng;
    k3rt_rng_seed(&rng, o->seed, 0x7a11ull);
    for (int i = 0; i < p->n; i++) {
        const k3rt_param_decl *d = module_param(m, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F64, K3RT_DEVICE_CPU, d->ndim, d->shape[0],
                                         d->shape[1], d->shape[2], d->shape[3]);
        int64_t n = k3rt_tensor_numel(&t);
        t.data = calloc((size_t)n, sizeof(double));
        k3rt_tensor g = t;
        g.data = calloc((size_t)n, sizeof(double));
        p->params[i] = t;
        p->grads[i] = g;
        if (!t.data || !g.data)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        K3RT_TRY(module_init_param(m, i, t, o->seed, d->name, err));
        if (d->init == K3RT_INIT_ZEROS || d->init == K3RT_INIT_ONES ||
            d->init == K3RT_INIT_CONST)
            for (int64_t j = 0; j < n; j++)
                ((double *)t.data)[j] += o->jitter * k3rt_rng_normal(&rng);
    }
    return K3RT_OK;
}

static void zero_grads(fd_params *p)
{
    for (int i = 0; i < p->n; i++)
        memset(p->grads[i].data, 0, k3rt_tensor_bytes(&p->grads[i]));
}

static int add_param_targets(module *m, fd_params *p, fd_target *t, int at)
{
    for (int i = 0; i < p->n; i++, at++) {
        const k3rt_param_decl *d = module_param(m, i);
        if (m->e->desc.kind == K3RT_KIND_RESIDUAL && d->layer >= 0)
            snprintf(t[at].name, sizeof t[at].name, "grad.layers.%d.%s", d->layer, d->name);
        else
            snprintf(t[at].name, sizeof t[at].name, "grad.%s", d->name);
        t[at].value = p->params[i].data;
        t[at].grad = p->grads[i].data;
        t[at].n = k3rt_tensor_numel(&p->params[i]);
    }
    return at;
}

/* ---- attention / moe ------------------------------------------------------------------------- */

typedef struct module_ctx {
    module m;
    fd_params p;
    k3rt_stream *stream;
    int64_t B, T, d, n;
    double *x, *y, *dy, *dx;
    void *saved, *ws;
    k3rt_memory mem;
    int has_state;
    k3rt_state_layout layout;
    double *s_in, *s_out, *ds_out, *ds_in;
    int64_t state_n;
    float *bias;
    int experts;
} module_ctx;

static int module_forward(module_ctx *c, int training, k3rt_error *err)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.training = training;
    a.stream = c->stream;
    a.batch = c->B;
    a.seq = c->T;
    a.x = k3rt_tensor_view(c->x, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.y = k3rt_tensor_view(c->y, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.params = c->p.params;
    a.n_params = c->p.n;
    a.saved = c->saved;
    a.saved_bytes = c->mem.saved_bytes;
    a.workspace = c->ws;
    a.workspace_bytes = c->mem.workspace_bytes;
    k3rt_routing routing;
    memset(&routing, 0, sizeof routing);
    routing.struct_size = sizeof routing;
    if (c->has_state) {
        a.state_in = c->layout.state;
        a.state_in.data = c->s_in;
        a.state_out = c->layout.state;
        a.state_out.data = c->s_out;
    }
    if (c->experts) {
        a.bias = k3rt_tensor_view(c->bias, K3RT_F32, K3RT_DEVICE_CPU, 1, c->experts, 0, 0, 0);
        a.routing = &routing;
    }
    const plugin_entry *e = c->m.e;
    int rc = e->desc.kind == K3RT_KIND_MOE ? e->vt.moe.forward(c->m.self, &a, err)
                                           : e->vt.attention.forward(c->m.self, &a, err);
    return module_fail(&c->m, rc, err);
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
    zero_grads(&c->p);
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.stream = c->stream;
    a.batch = c->B;
    a.seq = c->T;
    a.x = k3rt_tensor_view(c->x, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.dy = k3rt_tensor_view(c->dy, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.dx = k3rt_tensor_view(c->dx, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.params = c->p.params;
    a.grads = c->p.grads;
    a.n_params = c->p.n;
    a.saved = c->saved;
    a.saved_bytes = c->mem.saved_bytes;
    a.workspace = c->ws;
    a.workspace_bytes = c->mem.workspace_bytes;
    if (c->has_state) {
        a.state_in = c->layout.state;
        a.state_in.data = c->s_in;
        a.d_state_out = c->layout.state;
        a.d_state_out.data = c->ds_out;
        a.d_state_in = c->layout.state;
        a.d_state_in.data = c->ds_in;
    }
    const plugin_entry *e = c->m.e;
    int rc = e->desc.kind == K3RT_KIND_MOE ? e->vt.moe.backward(c->m.self, &a, err)
                                           : e->vt.attention.backward(c->m.self, &a, err);
    return module_fail(&c->m, rc, err);
}

static void module_ctx_free(module_ctx *c)
{
    fd_params_free(&c->p);
    module_destroy(&c->m);
    free(c->x), free(c->y), free(c->dy), free(c->dx), free(c->saved), free(c->ws);
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
    k3rt_create_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.dtype = K3RT_F64;
    args.device = K3RT_DEVICE_CPU;
    args.d_model = o.d_model;
    args.vocab = o.vocab;
    args.n_layers = o.n_layers;
    args.layer = o.layer;
    args.stream = c.stream;
    args.seed = o.seed;
    rc = module_create(&c.m, e, config, &args, "fdcheck", err);
    if (!rc)
        rc = fd_params_make(&c.m, &o, &c.p, err);
    if (!rc)
        rc = module_memory(&c.m, c.B, c.T, &c.mem, err);
    if (!rc && e->desc.kind == K3RT_KIND_MOE && e->vt.moe.experts) {
        int32_t ne = 0, k = 0;
        e->vt.moe.experts(c.m.self, &ne, &k);
        c.experts = ne;
    }
    k3rt_rng rng;
    k3rt_rng_seed(&rng, o.seed, 0xda7aull);
    c.x = malloc((size_t)c.n * sizeof(double));
    c.y = calloc((size_t)c.n, sizeof(double));
    c.dy = malloc((size_t)c.n * sizeof(double));
    c.dx = calloc((size_t)c.n, sizeof(double));
    c.saved = calloc(1, (size_t)c.mem.saved_bytes + 64);
    c.ws = calloc(1, (size_t)c.mem.workspace_bytes + 64);
    c.bias = calloc((size_t)c.experts + 1, sizeof(float));
    if (!rc && (!c.x || !c.y || !c.dy || !c.dx || !c.saved || !c.ws || !c.bias))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
    if (!rc) {
        randn(c.x, c.n, o.x_scale, &rng);
        randn(c.dy, c.n, 1.0, &rng);
        for (int i = 0; i < c.experts; i++)  /* a non-zero selection bias, as in training */
            c.bias[i] = (float)(0.01 * k3rt_rng_normal(&rng));
    }
    if (!rc && (e->desc.caps & K3RT_CAP_STATE) && e->vt.attention.state_layout) {
        c.layout.struct_size = sizeof c.layout;
        rc = module_fail(&c.m, e->vt.attention.state_layout(c.m.self, c.B, &c.layout, err),
                         err);
        c.state_n = rc ? 0 : k3rt_tensor_numel(&c.layout.state);
        if (!rc && c.state_n > 0) {
            c.has_state = 1;
            c.layout.state.dtype = K3RT_F64;
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
    }
    if (!rc)
        rc = module_backward(&c, err);
    if (!rc) {
        fd_target *t = calloc((size_t)c.p.n + 2, sizeof *t);
        if (!t)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        else {
            snprintf(t[0].name, sizeof t[0].name, "grad.x");
            t[0].value = c.x, t[0].grad = c.dx, t[0].n = c.n;
            int nt = add_param_targets(&c.m, &c.p, t, 1);
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
    module m;
    fd_params p;
    k3rt_stream *stream;
    int64_t B, T, d, n;
    int S;
    double *x0, *dout, *dx0, *out, *gates, *xs, *ys, *dys, *dxs;
    void *saved, *ws;
    k3rt_memory mem;
} residual_ctx;

static k3rt_residual_args residual_args(residual_ctx *c, int s, double *t, int backward)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.stream = c->stream;
    a.batch = c->B;
    a.seq = c->T;
    a.sublayer = s;
    a.n_sublayers = c->S;
    a.t = k3rt_tensor_view(t, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B, c->T, c->d, 0);
    a.params = c->p.params;
    a.grads = backward ? c->p.grads : NULL;
    a.n_params = c->p.n;
    a.training = 1;
    a.saved = c->saved;
    a.saved_bytes = c->mem.saved_bytes;
    a.workspace = c->ws;
    a.workspace_bytes = c->mem.workspace_bytes;
    return a;
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
    const k3rt_residual_vtable *v = &c->m.e->vt.residual;
    k3rt_residual_args a = residual_args(c, 0, c->x0, 0);
    K3RT_TRY(module_fail(&c->m, v->begin(c->m.self, &a, err), err));
    for (int s = 0; s < c->S; s++) {
        double *xs = c->xs + (int64_t)s * c->n, *ys = c->ys + (int64_t)s * c->n;
        a = residual_args(c, s, xs, 0);
        K3RT_TRY(module_fail(&c->m, v->mix(c->m.self, &a, err), err));
        toy_sublayer(c, s, xs, ys);
        a = residual_args(c, s, ys, 0);
        K3RT_TRY(module_fail(&c->m, v->push(c->m.self, &a, err), err));
    }
    a = residual_args(c, c->S, c->out, 0);
    return module_fail(&c->m, v->finish(c->m.self, &a, err), err);
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
    const k3rt_residual_vtable *v = &c->m.e->vt.residual;
    K3RT_TRY(residual_forward(c, err));
    zero_grads(&c->p);
    k3rt_residual_args a = residual_args(c, c->S, c->dout, 1);
    K3RT_TRY(module_fail(&c->m, v->finish_backward(c->m.self, &a, err), err));
    for (int s = c->S - 1; s >= 0; s--) {
        a = residual_args(c, s, c->dys, 1);
        K3RT_TRY(module_fail(&c->m, v->push_backward(c->m.self, &a, err), err));
        const double *xs = c->xs + (int64_t)s * c->n, *g = c->gates + (int64_t)s * c->d;
        for (int64_t i = 0; i < c->n; i++) {
            double th = tanh(g[i % c->d] * xs[i]);
            c->dxs[i] = c->dys[i] * (1 - th * th) * g[i % c->d];
        }
        a = residual_args(c, s, c->dxs, 1);
        a.sublayer_input = k3rt_tensor_view((double *)xs, K3RT_F64, K3RT_DEVICE_CPU, 3, c->B,
                                            c->T, c->d, 0);
        K3RT_TRY(module_fail(&c->m, v->mix_backward(c->m.self, &a, err), err));
    }
    a = residual_args(c, 0, c->dx0, 1);
    return module_fail(&c->m, v->begin_backward(c->m.self, &a, err), err);
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
    k3rt_create_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.dtype = K3RT_F64;
    args.device = K3RT_DEVICE_CPU;
    args.d_model = o.d_model;
    args.vocab = o.vocab;
    args.n_layers = o.n_layers;
    args.layer = -1;
    args.stream = c.stream;
    args.seed = o.seed;
    rc = module_create(&c.m, e, config, &args, "fdcheck", err);
    if (!rc)
        rc = fd_params_make(&c.m, &o, &c.p, err);
    if (!rc)
        rc = module_memory(&c.m, c.B, c.T, &c.mem, err);
    size_t nb = (size_t)c.n * sizeof(double);
    c.x0 = malloc(nb), c.dout = malloc(nb), c.dx0 = calloc(1, nb), c.out = calloc(1, nb);
    c.gates = malloc((size_t)c.S * (size_t)c.d * sizeof(double));
    c.xs = calloc((size_t)c.S, nb), c.ys = calloc((size_t)c.S, nb);
    c.dys = calloc(1, nb), c.dxs = calloc(1, nb);
    c.saved = calloc(1, (size_t)c.mem.saved_bytes + 64);
    c.ws = calloc(1, (size_t)c.mem.workspace_bytes + 64);
    if (!rc && (!c.x0 || !c.dout || !c.dx0 || !c.out || !c.gates || !c.xs || !c.ys || !c.dys ||
                !c.dxs || !c.saved || !c.ws))
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
        fd_target *t = calloc((size_t)c.p.n + 1, sizeof *t);
        if (!t)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "fdcheck: out of memory");
        else {
            snprintf(t[0].name, sizeof t[0].name, "grad.embedding");
            t[0].value = c.x0, t[0].grad = c.dx0, t[0].n = c.n;
            int nt = add_param_targets(&c.m, &c.p, t, 1);
            rc = check_targets(t, nt, residual_loss, &c, &o, r, err);
            free(t);
        }
    }
    fd_params_free(&c.p);
    module_destroy(&c.m);
    free(c.x0), free(c.dout), free(c.dx0), free(c.out), free(c.gates), free(c.xs), free(c.ys);
    free(c.dys), free(c.dxs), free(c.saved), free(c.ws);
    k3rt_stream_destroy(c.stream);
    return rc;
}
