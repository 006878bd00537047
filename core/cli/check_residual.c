/* check-plugin: residual plugins, driven through a toy stack of 2 * layers sublayers
 * y_s = tanh(x_s) computed with the shared ops (so the same driver runs on the CPU and on
 * CUDA) — gradients by finite differences, outputs written over NaN-filled buffers, declared
 * buffer sizes, determinism, statistics and CPU vs CUDA. A plugin with a fused pre-norm
 * (mix_norm) also runs the stack y_s = tanh(RMSNorm(x_s) * gain) both ways, fused and with the
 * engine's norm, which must agree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check.h"

/* How each toy sublayer's input is normed. */
typedef enum res_norm { NORM_NONE, NORM_ENGINE, NORM_FUSED } res_norm;

typedef struct res_run {
    check_ctx *c;
    int dtype, device, S;
    int64_t B, T, d, n;
    ck_module mod;  /* the instance (its rig), stream, parameters and buffers */
    char *x0, *out, *dout, *dx0, *xs, *ys, *dys, *dxs;  /* device */
    char *gain, *dgain, *xn, *rstd, *dxn;               /* the pre-norm runs (device) */
} res_run;

static char *res_alloc(res_run *r, size_t bytes, k3rt_error *err)
{
    return k3rt_alloc(r->device, bytes ? bytes : 1, err);
}

static void res_close(res_run *r)
{
    char *bufs[] = {r->x0, r->out, r->dout, r->dx0, r->xs, r->ys, r->dys, r->dxs,
                    r->gain, r->dgain, r->xn, r->rstd, r->dxn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            k3rt_free(r->device, bufs[i]);
    ck_module_close(&r->mod);
    memset(r, 0, sizeof *r);
}

static int res_open(check_ctx *c, int dtype, int device, res_run *r, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->c = c, r->dtype = dtype, r->device = device, r->S = 2 * c->layers;
    r->B = c->B, r->T = c->T, r->d = c->d, r->n = c->B * c->T * c->d;
    K3RT_TRY(ck_module_open(c, dtype, device, &r->mod, err));
    size_t nb = (size_t)r->n * k3rt_dtype_size(dtype);
    char **bufs[] = {&r->x0, &r->out, &r->dout, &r->dx0, &r->dys, &r->dxs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = res_alloc(r, nb, err)))
            return err->code;
    if (!(r->xs = res_alloc(r, (size_t)r->S * nb, err)) ||
        !(r->ys = res_alloc(r, (size_t)r->S * nb, err)))
        return err->code;
    size_t es = k3rt_dtype_size(dtype), rows = (size_t)(r->B * r->T);
    if (!(r->gain = res_alloc(r, (size_t)r->d * es, err)) ||
        !(r->dgain = res_alloc(r, (size_t)r->d * es, err)) ||
        !(r->xn = res_alloc(r, (size_t)r->S * nb, err)) ||
        !(r->rstd = res_alloc(r, (size_t)r->S * rows * es, err)) ||
        !(r->dxn = res_alloc(r, nb, err)))
        return err->code;
    void *h = ck_alloc(dtype, r->n);
    if (!h)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    k3rt_rng rng;
    k3rt_rng_seed(&rng, c->seed, 0x7e51ull);
    ck_randn(h, dtype, r->n, 1.0, &rng);
    int rc = ck_copy(r->mod.s, r->x0, device, h, K3RT_DEVICE_CPU, nb, err);
    ck_randn(h, dtype, r->n, 1.0, &rng);
    if (!rc)
        rc = ck_copy(r->mod.s, r->dout, device, h, K3RT_DEVICE_CPU, nb, err);
    ck_randn(h, dtype, r->d, 0.5, &rng);  /* gains around 1 */
    if (!rc)
        rc = k3rt_fill(r->mod.s, dtype, r->gain, r->d, 1.0, err);
    if (!rc)
        rc = ck_copy(r->mod.s, r->dxn, device, h, K3RT_DEVICE_CPU, (size_t)r->d * es, err);
    if (!rc)
        rc = k3rt_axpby(r->mod.s, dtype, r->d, 1.0, r->dxn, 1.0, r->gain, err);
    free(h);
    return rc;
}

static int res_call(res_run *r, rig_residual_call call, int s, char *t, const char *input,
                    k3rt_error *err)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s;
    a.t = k3rt_tensor_view(t, r->dtype, r->device, 3, r->B, r->T, r->d, 0);
    a.training = 1;
    if (input)
        a.sublayer_input = k3rt_tensor_view((char *)input, r->dtype, r->device, 3, r->B, r->T,
                                            r->d, 0);
    return rig_residual(&r->mod.m, call, &a, err);
}

static k3rt_tensor res_view(const res_run *r, void *p, int ndim, int64_t n0)
{
    return ndim == 3 ? k3rt_tensor_view(p, r->dtype, r->device, 3, r->B, r->T, r->d, 0)
                     : k3rt_tensor_view(p, r->dtype, r->device, 1, n0, 0, 0, 0);
}

/* Sublayer s's input into xs and, with a norm, its normed copy into xn (rstd kept). */
static int res_mix(res_run *r, res_norm norm, int s, char *xs, char *xn, char *rstd,
                   k3rt_error *err)
{
    if (norm != NORM_FUSED) {
        K3RT_TRY(res_call(r, RIG_MIX, s, xs, NULL, err));
        if (norm == NORM_NONE)
            return K3RT_OK;
        return k3rt_rmsnorm_fwd(r->mod.s, r->dtype, xs, r->gain, xn, rstd, r->B * r->T, r->d,
                                1e-6, err);
    }
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s, a.training = 1;
    a.t = res_view(r, xs, 3, 0);
    a.norm_gain = res_view(r, r->gain, 1, r->d);
    a.normed = res_view(r, xn, 3, 0);
    a.rstd = res_view(r, rstd, 1, r->B * r->T);
    a.norm_eps = 1e-6;
    return rig_residual(&r->mod.m, RIG_MIX_NORM, &a, err);
}

/* From dxn (the gradient of the normed input) or, without a norm, dxs (of the input itself)
 * back into the residual. */
static int res_mix_backward(res_run *r, res_norm norm, int s, char *xs, char *rstd,
                            k3rt_error *err)
{
    if (norm == NORM_NONE)
        return res_call(r, RIG_MIX_BACKWARD, s, r->dxs, xs, err);
    if (norm == NORM_ENGINE) {
        K3RT_TRY(k3rt_rmsnorm_bwd(r->mod.s, r->dtype, xs, r->gain, rstd, r->dxn, r->dxs,
                                  r->dgain, r->B * r->T, r->d, 0, err));
        return res_call(r, RIG_MIX_BACKWARD, s, r->dxs, xs, err);
    }
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s, a.training = 1;
    a.t = res_view(r, r->dxn, 3, 0);
    a.sublayer_input = res_view(r, xs, 3, 0);
    a.norm_gain = res_view(r, r->gain, 1, r->d);
    a.norm_gain_grad = res_view(r, r->dgain, 1, r->d);
    a.rstd = res_view(r, rstd, 1, r->B * r->T);
    a.norm_eps = 1e-6;
    return rig_residual(&r->mod.m, RIG_MIX_NORM_BACKWARD, &a, err);
}

/* One forward and backward of the toy stack from poisoned outputs and zeroed gradients;
 * collects out, the embedding gradient and every parameter gradient (and, with a norm, the
 * gain's gradient). */
static int res_collect(res_run *r, res_norm norm, ck_blobs *o, k3rt_error *err)
{
    size_t nb = (size_t)r->n * k3rt_dtype_size(r->dtype);
    size_t rb = (size_t)(r->B * r->T) * k3rt_dtype_size(r->dtype);
    K3RT_TRY(ck_params_upload(&r->mod.p, r->mod.s, err));
    char *poison[] = {r->out, r->dx0, r->xs, r->dxs, r->xn, r->rstd};
    size_t sizes[] = {nb, nb, (size_t)r->S * nb, nb, (size_t)r->S * nb, (size_t)r->S * rb};
    for (int i = 0; i < 6; i++)
        K3RT_TRY(k3rt_memset(r->mod.s, poison[i], r->device, 0xFF, sizes[i], err));
    K3RT_TRY(k3rt_fill(r->mod.s, r->dtype, r->dgain, r->d, 0.0, err));
    K3RT_TRY(rig_fill_buffers(&r->mod.m, 0xFF, err));
    K3RT_TRY(res_call(r, RIG_BEGIN, 0, r->x0, NULL, err));
    for (int s = 0; s < r->S; s++) {
        char *xs = r->xs + s * nb, *ys = r->ys + s * nb, *xn = r->xn + s * nb;
        K3RT_TRY(res_mix(r, norm, s, xs, xn, r->rstd + s * rb, err));
        K3RT_TRY(k3rt_act_fwd(r->mod.s, r->dtype, K3RT_ACT_TANH, norm ? xn : xs, ys, r->n,
                              err));
        K3RT_TRY(res_call(r, RIG_PUSH, s, ys, NULL, err));
    }
    K3RT_TRY(res_call(r, RIG_FINISH, r->S, r->out, NULL, err));
    K3RT_TRY(res_call(r, RIG_FINISH_BACKWARD, r->S, r->dout, NULL, err));
    for (int s = r->S - 1; s >= 0; s--) {
        char *xs = r->xs + s * nb, *xn = r->xn + s * nb;
        K3RT_TRY(k3rt_memset(r->mod.s, r->dys, r->device, 0xFF, nb, err));
        K3RT_TRY(res_call(r, RIG_PUSH_BACKWARD, s, r->dys, NULL, err));
        K3RT_TRY(k3rt_act_bwd(r->mod.s, r->dtype, K3RT_ACT_TANH, norm ? xn : xs, r->dys,
                              norm ? r->dxn : r->dxs, r->n, 0, err));
        K3RT_TRY(res_mix_backward(r, norm, s, xs, r->rstd + s * rb, err));
    }
    K3RT_TRY(res_call(r, RIG_BEGIN_BACKWARD, 0, r->dx0, NULL, err));
    K3RT_TRY(k3rt_stream_sync(r->mod.s, err));
    K3RT_TRY(ck_blobs_add(o, "out", r->dtype, r->n, r->out, r->device, r->mod.s, err));
    K3RT_TRY(ck_blobs_add(o, "grad.embedding", r->dtype, r->n, r->dx0, r->device, r->mod.s, err));
    if (norm)
        K3RT_TRY(ck_blobs_add(o, "grad.norm_gain", r->dtype, r->d, r->dgain, r->device,
                              r->mod.s, err));
    for (int i = 0; i < r->mod.p.n; i++) {
        const k3rt_param_decl *d = rig_param(&r->mod.m, i);
        char name[192];
        if (d->layer >= 0)
            snprintf(name, sizeof name, "grad.layers.%d.%s", d->layer, d->name);
        else
            snprintf(name, sizeof name, "grad.%s", d->name);
        K3RT_TRY(ck_blobs_add(o, name, r->mod.p.grad_dtype,
                              k3rt_tensor_numel(&r->mod.p.grad_dev[i]),
                              r->mod.p.grad_dev[i].data, r->device, r->mod.s, err));
    }
    return K3RT_OK;
}

static void check_gradients(check_ctx *c)
{
    fd_options o;
    if (!ck_fd_options(c, &o))
        return;
    fd_result r;
    k3rt_error err = {0};
    if (fd_check_residual(c->e, c->config, &o, &r, &err)) {
        ck_error(c, "gradients", &err);
        return;
    }
    ck_report(c, r.worst <= c->tol ? CK_PASS : CK_FAIL, "gradients",
              "%d entries by 5-point differences (step %g) through %d sublayers, worst "
              "relative error %.2e (tolerance %.0e): %s", r.n_checked, c->fd_eps,
              2 * c->layers, r.worst, c->tol, r.worst_what);
}

static void check_runs(check_ctx *c)
{
    int dtypes[2], nd = ck_cpu_dtypes(c, dtypes), outputs = 0;
    char buf[1024], where[512];
    const char *why = NULL;
    for (int i = 0; i < nd && !why; i++) {
        res_run a = {0}, b = {0};
        ck_blobs a1 = {0}, a2 = {0}, b1 = {0};
        k3rt_error err = {0};
        int rc = res_open(c, dtypes[i], K3RT_DEVICE_CPU, &a, &err);
        if (!rc)
            rc = res_open(c, dtypes[i], K3RT_DEVICE_CPU, &b, &err);
        if (!rc)
            rc = res_collect(&a, NORM_NONE, &a1, &err);
        if (!rc)
            rc = res_collect(&a, NORM_NONE, &a2, &err);
        if (!rc)
            rc = res_collect(&b, NORM_NONE, &b1, &err);
        if (rc) {
            snprintf(buf, sizeof buf, "%s", err.msg);
            why = buf;
        } else if (ck_blobs_nonfinite(&a1, where, sizeof where)) {
            snprintf(buf, sizeof buf, "%s %s is not finite, with outputs, saved and workspace "
                     "filled with NaN bytes first", k3rt_dtype_name(dtypes[i]), where);
            why = buf;
        } else if (!rig_guards_ok(&a.mod.m)) {
            why = "writes beyond the saved or workspace bytes that memory() declared";
        } else if (ck_blobs_differ(&a1, &a2, where, sizeof where) ||
                   ck_blobs_differ(&a1, &b1, where, sizeof where)) {
            snprintf(buf, sizeof buf, "%s runs differ at %s", k3rt_dtype_name(dtypes[i]),
                     where);
            why = (c->e->desc.caps & K3RT_CAP_DETERMINISTIC) ? buf : NULL;
            if (!why)
                ck_report(c, CK_SKIP, "determinism", "not declared: %s", buf);
        }
        outputs = a1.n;
        ck_blobs_free(&a1), ck_blobs_free(&a2), ck_blobs_free(&b1);
        res_close(&a);
        res_close(&b);
    }
    if (!nd)
        ck_report(c, CK_SKIP, "runs", "no CPU implementation");
    else if (why)
        ck_report(c, CK_FAIL, "runs", "%s", why);
    else
        ck_report(c, CK_PASS, "runs", "forward and backward through %d sublayers in %s%s: "
                  "outputs written over NaN-filled buffers, saved/workspace within memory(), "
                  "all %d outputs bitwise equal on a repeated run and on a fresh instance",
                  2 * c->layers, k3rt_dtype_name(dtypes[0]), nd > 1 ? " and f32" : "",
                  outputs);
}

static void check_cuda(check_ctx *c)
{
    if (!ck_cuda_ready(c, "cuda"))
        return;
    res_run h = {0}, g = {0};
    k3rt_error err = {0};
    char where[256] = "", w[256];
    double worst = 0;
    int outputs = 0, fused = c->e->vt.residual.mix_norm != NULL;
    int rc = res_open(c, K3RT_F32, K3RT_DEVICE_CPU, &h, &err);
    if (!rc)
        rc = res_open(c, K3RT_F32, 0, &g, &err);
    /* the plain stack, and the fused pre-norm where the plugin has one */
    for (int pass = 0; !rc && pass <= fused; pass++) {
        ck_blobs oh = {0}, og = {0};
        res_norm norm = pass ? NORM_FUSED : NORM_NONE;
        rc = res_collect(&h, norm, &oh, &err);
        if (!rc)
            rc = res_collect(&g, norm, &og, &err);
        if (!rc) {
            double e = ck_blobs_worst(&oh, &og, w, sizeof w);
            if (e >= worst)
                worst = e, snprintf(where, sizeof where, "%s%s", w, pass ? " (fused norm)" : "");
            outputs += oh.n;
        }
        ck_blobs_free(&oh), ck_blobs_free(&og);
    }
    if (rc)
        ck_error(c, "cuda", &err);
    else
        ck_report(c, worst <= c->cuda_tol ? CK_PASS : CK_FAIL, "cuda",
                  "f32 on CUDA device 0 against the CPU: %d outputs%s, worst relative rms "
                  "%.2e (%s; tolerance %.0e)", outputs, fused ? " with and without the fused "
                  "norm" : "", worst, where, c->cuda_tol);
    res_close(&h);
    res_close(&g);
}

/* The fused pre-norm against mix + the engine's norm, in the first CPU dtype (f64 when the
 * plugin has it): the same stack, the same numbers up to rounding. */
static void check_fused_norm(check_ctx *c)
{
    if (!c->e->vt.residual.mix_norm) {
        ck_report(c, CK_SKIP, "fused norm", "no mix_norm (the engine norms each sublayer's "
                  "input)");
        return;
    }
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes)) {
        ck_report(c, CK_SKIP, "fused norm", "no CPU implementation");
        return;
    }
    res_run r = {0};
    ck_blobs engine = {0}, fused = {0};
    k3rt_error err = {0};
    char where[256];
    int rc = res_open(c, dtypes[0], K3RT_DEVICE_CPU, &r, &err);
    if (!rc)
        rc = res_collect(&r, NORM_ENGINE, &engine, &err);
    if (!rc)
        rc = res_collect(&r, NORM_FUSED, &fused, &err);
    if (rc) {
        ck_error(c, "fused norm", &err);
    } else {
        double tol = dtypes[0] == K3RT_F64 ? 1e-12 : 1e-5;
        double worst = ck_blobs_worst(&engine, &fused, where, sizeof where);
        if (ck_blobs_nonfinite(&fused, where, sizeof where))
            ck_report(c, CK_FAIL, "fused norm", "%s %s is not finite, with outputs filled with "
                      "NaN bytes first", k3rt_dtype_name(dtypes[0]), where);
        else
            ck_report(c, worst <= tol ? CK_PASS : CK_FAIL, "fused norm",
                      "%s: mix_norm / mix_norm_backward against mix, the engine's RMSNorm and "
                      "mix_backward through %d sublayers: %d outputs, worst relative rms %.2e "
                      "(%s; tolerance %.0e)", k3rt_dtype_name(dtypes[0]), r.S, fused.n, worst,
                      where, tol);
    }
    ck_blobs_free(&engine), ck_blobs_free(&fused);
    res_close(&r);
}

void ck_residual(check_ctx *c)
{
    check_gradients(c);
    check_runs(c);
    check_fused_norm(c);
    check_cuda(c);
}
