/* block_attnres on CUDA against the same plugin on the CPU in f64 (the finite-difference-tested
 * reference), on the values the device holds (inputs rounded to the run's dtype first).
 *  (a) One mixing op (op_forward / op_backward) over 2, 5, 9 and 17 sources (the last one the
 *      partial sum), d = 64 and 1024, and 9 sources at d = 2048 (the benchmark's shape), 5 at
 *      d = 8192 (16 elements a thread); N = B*T tokens not a multiple of the backward's grid
 *      (2048 blocks: some walk two tokens, some one), or fewer than its blocks: h, every
 *      source's and the partial's gradient, the pseudo-query's and the key-norm gain's. Random pseudo-queries (logits of
 *      order 1) and gains around 1, sources of different scales.
 *  (b) The model's control flow (begin / mix / push / finish and their backwards) through a
 *      toy stack y_s = tanh(x_s), plain and with the pre-norm fused (mix_norm, y_s =
 *      tanh(RMSNorm(x_s) * gain)): Block AttnRes (block_layers 1 and 2) and Full AttnRes, up to
 *      9 sources; the output, the embedding's gradient, every parameter gradient, the norm
 *      gain's, and the depth-weight statistics (read from the device).
 * Outputs, saved parts and workspace are filled with NaN bytes first; every element must be
 * finite. Error = rms(ref - x) / rms(ref). Tolerances: f32 1e-5 (op) and 1e-4 (the stack,
 * whose tanh sublayers and adds compound rounding); bf16 1e-2 (op) and 3e-2 (the stack, whose
 * activations are rounded to bf16 at every sublayer and whose within-block partial sums are
 * rebuilt from a bf16 h with a 1/alpha gain). A second GPU run of every case must give the
 * same bits (deterministic = 1). Exit: 77 without a CUDA device. K3RT_ATTNRES_TEST_SMALL=1
 * keeps d = 64 (for compute-sanitizer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/sinks.h"

static k3rt_stream *G;  /* CUDA stream on device 0 */
static k3rt_stream *C;  /* CPU stream of the reference */
static int small_only;
static int n_failed;
static uint64_t seed_next = 1234;

enum { AR_MAX = 32 };  /* sources of the largest op case */

static void check_err(const char *what, double e, double tol)
{
    int ok = e <= tol;
    printf("  %-40s %.3e (tolerance %.0e)%s\n", what, e, tol, ok ? "" : "  FAILED");
    n_failed += !ok;
}

static double err_of(const double *ref, const double *got, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i]))
            return INFINITY;
    return tu_rel_rms(ref, got, n);
}

/* ---- host values and device buffers --------------------------------------------------------- */

static k3rt_stream *stream_of(int device) { return device == K3RT_DEVICE_CPU ? C : G; }

static double *randv(int64_t n, double scale, double offset)
{
    double *v = calloc((size_t)n, sizeof *v);
    ck_assert_ptr_nonnull(v);
    tu_randn(v, n, scale, seed_next++);
    for (int64_t i = 0; i < n; i++)
        v[i] += offset;
    return v;
}

static void round_to(double *x, int64_t n, int dtype)
{
    k3rt_error err = {0};
    void *tmp = malloc((size_t)n * k3rt_dtype_size(dtype));
    TU_OK(k3rt_convert(tmp, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, tmp, dtype, n, &err), err);
    free(tmp);
}

/* dst (device memory of dtype) = v, or NaN bytes when v is NULL. */
static void put(int device, int dtype, void *dst, const double *v, int64_t n)
{
    k3rt_error err = {0};
    size_t bytes = (size_t)n * k3rt_dtype_size(dtype);
    void *h = malloc(bytes);
    ck_assert_ptr_nonnull(h);
    if (v)
        TU_OK(k3rt_convert(h, dtype, v, K3RT_F64, n, &err), err);
    else
        memset(h, 0xff, bytes);
    TU_OK(k3rt_memcpy(stream_of(device), dst, device, h, K3RT_DEVICE_CPU, bytes, &err), err);
    TU_OK(k3rt_stream_sync(stream_of(device), &err), err);
    free(h);
}

static double *get(int device, int dtype, const void *src, int64_t n)
{
    k3rt_error err = {0};
    size_t bytes = (size_t)n * k3rt_dtype_size(dtype);
    void *h = malloc(bytes);
    double *x = calloc((size_t)n, sizeof *x);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_nonnull(x);
    TU_OK(k3rt_stream_sync(stream_of(device), &err), err);
    TU_OK(k3rt_memcpy(stream_of(device), h, K3RT_DEVICE_CPU, src, device, bytes, &err), err);
    TU_OK(k3rt_stream_sync(stream_of(device), &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, h, dtype, n, &err), err);
    free(h);
    return x;
}

static void *dalloc(int device, int dtype, int64_t n)
{
    k3rt_error err = {0};
    void *p = k3rt_alloc(device, (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype), &err);
    ck_assert_msg(p != NULL, "k3rt_alloc: %s", err.msg);
    return p;
}

/* ---- the instance -------------------------------------------------------------------------- */

typedef struct shape {
    int layers, full, block_layers;
    int64_t d, B, T;
} shape;

static void open_rig(rig *r, const shape *sh, int device, int dtype)
{
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = device, a.d_model = sh->d, a.vocab = 32;
    a.n_layers = sh->layers, a.layer = -1, a.stream = stream_of(device), a.seed = 3;
    a.deterministic = 1;
    json_t *j = json_pack("{s:b, s:i}", "full", sh->full, "block_layers", sh->block_layers);
    TU_OK(rig_create(r, tu_plugin("block_attnres"), j, &a, "test", &err), err);
    json_decref(j);
    TU_OK(rig_alloc_params(r, &err), err);
    TU_OK(rig_alloc_shape(r, sh->B, sh->T, 0, &err), err);
}

/* Pseudo-queries with logits of order 1 (w ~ N(0, 1/d)), gains around 1. */
static double **make_params(const rig *r, int dtype)
{
    int np = rig_n_params(r);
    double **p = calloc((size_t)np, sizeof *p);
    for (int i = 0; i < np; i++) {
        const k3rt_param_decl *pd = rig_param(r, i);
        int64_t d = pd->shape[0];
        p[i] = pd->role == K3RT_ROLE_NORM_GAIN ? randv(d, 0.2, 1.0) : randv(d, 1.0 / sqrt((double)d), 0);
        round_to(p[i], d, dtype);
    }
    return p;
}

/* Uploads the parameters and zeroes the gradients and the statistics; poisons the buffers. */
static void load_params(rig *r, double **p)
{
    k3rt_error err = {0};
    for (int i = 0; i < rig_n_params(r); i++) {
        int64_t n = rig_param(r, i)->shape[0];
        put(r->device, r->dtype, r->params[i].data, p[i], n);
        TU_OK(k3rt_memset(r->stream, r->grads[i].data, r->device, 0,
                          (size_t)n * k3rt_dtype_size(r->grad_dtype), &err), err);
    }
    rig_reset_stats(r);
    TU_OK(rig_fill_buffers(r, 0xFF, &err), err);
}

/* Every parameter gradient, back to back. */
static double *grads_of(rig *r, int64_t *n_out)
{
    int64_t n = 0;
    for (int i = 0; i < rig_n_params(r); i++)
        n += rig_param(r, i)->shape[0];
    double *all = calloc((size_t)n, sizeof *all), *at = all;
    for (int i = 0; i < rig_n_params(r); i++) {
        int64_t m = rig_param(r, i)->shape[0];
        double *g = get(r->device, r->grad_dtype, r->grads[i].data, m);
        memcpy(at, g, (size_t)m * sizeof *g);
        at += m;
        free(g);
    }
    *n_out = n;
    return all;
}

static double *stats_of(rig *r, int64_t *n_out)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink = {0};
    TU_OK(rig_stats(r, &sink, &err), err);
    ck_assert_int_eq(sink.n, 1);
    k3rt_tensor t = sink.items[0].t;
    *n_out = k3rt_tensor_numel(&t);
    double *v = get(r->device, K3RT_F32, t.data, *n_out);
    tensor_sink_free(&sink);
    return v;
}

/* The outputs of one run, each n[k] values. */
enum { MAX_OUT = 24 };
typedef struct outs {
    int n;
    const char *name[MAX_OUT];
    double *v[MAX_OUT];
    int64_t len[MAX_OUT];
} outs;

static void outs_add(outs *o, const char *name, double *v, int64_t len)
{
    ck_assert_int_lt(o->n, MAX_OUT);
    o->name[o->n] = name, o->v[o->n] = v, o->len[o->n] = len;
    o->n++;
}

static void outs_free(outs *o)
{
    for (int i = 0; i < o->n; i++)
        free(o->v[i]);
    memset(o, 0, sizeof *o);
}

/* got vs ref per output (tolerance tol) and, with again, got == again bit for bit. */
static void compare(const char *label, const outs *ref, const outs *got, const outs *again,
                    double tol)
{
    printf("%s\n", label);
    double worst = 0;
    const char *where = "";
    for (int i = 0; i < ref->n; i++) {
        double e = err_of(ref->v[i], got->v[i], ref->len[i]);
        if (!(e <= worst) || i == 0)
            worst = e, where = ref->name[i];
        char what[64];
        snprintf(what, sizeof what, "%s", ref->name[i]);
        check_err(what, e, tol);
        if (again && memcmp(got->v[i], again->v[i], (size_t)got->len[i] * sizeof(double))) {
            printf("  %-40s differs between two runs  FAILED\n", ref->name[i]);
            n_failed++;
        }
    }
    printf("  worst %.3e at %s%s\n", worst, where, again ? "; two runs bitwise equal" : "");
}

/* ---- (a) one op ------------------------------------------------------------------------------ */

typedef struct op_in {
    int n;           /* sources including the partial */
    int64_t N, d;
    double **v;      /* n rows [N, d]; the last is the partial */
    double *dy;
    double **p;
} op_in;

static void op_run(rig *r, const op_in *in, outs *o)
{
    k3rt_error err = {0};
    int dev = r->device, dt = r->dtype, n = in->n;
    int64_t nd = in->N * in->d;
    void *t = dalloc(dev, dt, nd), *dy = dalloc(dev, dt, nd);
    void *buf[AR_MAX], *dbuf[AR_MAX];
    k3rt_tensor src[AR_MAX], dsrc[AR_MAX];
    for (int i = 0; i < n; i++) {
        buf[i] = dalloc(dev, dt, nd), dbuf[i] = dalloc(dev, dt, nd);
        put(dev, dt, buf[i], in->v[i], nd);
        put(dev, dt, dbuf[i], NULL, nd);
        src[i] = k3rt_tensor_view(buf[i], dt, dev, 3, r->B, r->T, in->d, 0);
        dsrc[i] = k3rt_tensor_view(dbuf[i], dt, dev, 3, r->B, r->T, in->d, 0);
    }
    put(dev, dt, t, NULL, nd);
    put(dev, dt, dy, in->dy, nd);
    load_params(r, in->p);
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = 5;
    a.t = k3rt_tensor_view(t, dt, dev, 3, r->B, r->T, in->d, 0);
    a.sources = src, a.n_sources = n - 1, a.partial = src[n - 1];
    a.training = 1;
    TU_OK(rig_residual(r, RIG_OP_FORWARD, &a, &err), err);
    outs_add(o, "h", get(dev, dt, t, nd), nd);
    a.t = k3rt_tensor_view(dy, dt, dev, 3, r->B, r->T, in->d, 0);
    a.d_sources = dsrc, a.d_partial = dsrc[n - 1];
    TU_OK(rig_residual(r, RIG_OP_BACKWARD, &a, &err), err);
    static const char *const dnames[] = {"d source 0", "d source 1", "d source 2",
                                         "d source 3", "d sources 4..n-2"};
    for (int i = 0; i < n - 1 && i < 4; i++)
        outs_add(o, dnames[i], get(dev, dt, dbuf[i], nd), nd);
    if (n - 1 > 4) {
        double *rest = calloc((size_t)((n - 5) * nd), sizeof *rest);
        for (int i = 4; i < n - 1; i++) {
            double *x = get(dev, dt, dbuf[i], nd);
            memcpy(rest + (i - 4) * nd, x, (size_t)nd * sizeof *x);
            free(x);
        }
        outs_add(o, dnames[4], rest, (n - 5) * nd);
    }
    outs_add(o, "d partial", get(dev, dt, dbuf[n - 1], nd), nd);
    /* op sublayer 5's pseudo-query and gain: parameters 10 and 11 */
    outs_add(o, "d pseudo-query", get(dev, r->grad_dtype, r->grads[10].data, in->d), in->d);
    outs_add(o, "d key-norm gain", get(dev, r->grad_dtype, r->grads[11].data, in->d), in->d);
    for (int i = 0; i < n; i++) {
        k3rt_free(dev, buf[i]);
        k3rt_free(dev, dbuf[i]);
    }
    k3rt_free(dev, t);
    k3rt_free(dev, dy);
}

static void op_case(int n, int64_t d, int64_t B, int64_t T)
{
    shape sh = {.layers = 8, .full = 1, .block_layers = 1, .d = d, .B = B, .T = T};
    int64_t N = B * T, nd = N * d;
    for (int k = 0; k < 2; k++) {
        int dt = k ? K3RT_BF16 : K3RT_F32;
        rig rc, rg;
        open_rig(&rc, &sh, K3RT_DEVICE_CPU, K3RT_F64);
        open_rig(&rg, &sh, 0, dt);
        op_in in = {.n = n, .N = N, .d = d};
        in.v = calloc((size_t)n, sizeof *in.v);
        for (int i = 0; i < n; i++) {
            in.v[i] = randv(nd, 0.5 + 0.25 * i, 0.05 * i);
            round_to(in.v[i], nd, dt);
        }
        in.dy = randv(nd, 1.0, 0);
        round_to(in.dy, nd, dt);
        in.p = make_params(&rc, dt);
        outs ref = {0}, got = {0}, again = {0};
        op_run(&rc, &in, &ref);
        op_run(&rg, &in, &got);
        op_run(&rg, &in, &again);
        char label[160];
        snprintf(label, sizeof label, "op: %d sources, d %lld, N %lld (B %lld x T %lld), %s",
                 n, (long long)d, (long long)N, (long long)B, (long long)T,
                 k3rt_dtype_name(dt));
        compare(label, &ref, &got, &again, k ? 1e-2 : 1e-5);
        outs_free(&ref), outs_free(&got), outs_free(&again);
        for (int i = 0; i < n; i++)
            free(in.v[i]);
        for (int i = 0; i < rig_n_params(&rc); i++)
            free(in.p[i]);
        free(in.v), free(in.p), free(in.dy);
        rig_destroy(&rc);
        rig_destroy(&rg);
    }
}

START_TEST(op_vs_cpu)
{
    static const int ns[] = {2, 5, 9, 17};
    for (int i = 0; i < 4; i++) {
        op_case(ns[i], 64, 3, 701);
        if (!small_only)
            op_case(ns[i], 1024, 1, 2101);
    }
    if (!small_only) {
        op_case(9, 2048, 1, 1037);  /* the benchmark's shape: 9 sources, one chunk in bf16 */
        op_case(5, 8192, 1, 300);   /* 16 elements a thread */
    }
    ck_assert_msg(n_failed == 0, "%d checks failed (see the log)", n_failed);
}
END_TEST

/* ---- (b) the model's stack ---------------------------------------------------------------------- */

typedef struct stack_in {
    double *x0, *dout, *gain;
    double **p;
} stack_in;

/* Forward and backward of the toy stack (y_s = tanh of the input or of its pre-norm). */
static void stack_run(rig *r, const shape *sh, const stack_in *in, int norm, outs *o)
{
    k3rt_error err = {0};
    int dev = r->device, dt = r->dtype, S = 2 * sh->layers;
    int64_t N = sh->B * sh->T, d = sh->d, nd = N * d;
    k3rt_stream *st = r->stream;
    int fdt = dt == K3RT_BF16 ? K3RT_F32 : dt;  /* rstd and the gain's gradient */
    char *x0 = dalloc(dev, dt, nd), *out = dalloc(dev, dt, nd), *dout = dalloc(dev, dt, nd);
    char *dx0 = dalloc(dev, dt, nd), *xs = dalloc(dev, dt, S * nd), *xn = dalloc(dev, dt, S * nd);
    char *ys = dalloc(dev, dt, nd), *dys = dalloc(dev, dt, nd), *dxs = dalloc(dev, dt, nd);
    char *rstd = dalloc(dev, fdt, S * N), *gain = dalloc(dev, dt, d), *dgain = dalloc(dev, fdt, d);
    size_t es = k3rt_dtype_size(dt), fs = k3rt_dtype_size(fdt);
    put(dev, dt, x0, in->x0, nd);
    put(dev, dt, dout, in->dout, nd);
    put(dev, dt, gain, in->gain, d);
    put(dev, dt, out, NULL, nd);
    put(dev, dt, dx0, NULL, nd);
    TU_OK(k3rt_memset(st, dgain, dev, 0, d * fs, &err), err);
    load_params(r, in->p);
#define VIEW3(p) k3rt_tensor_view((p), dt, dev, 3, sh->B, sh->T, d, 0)
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.training = 1;
    a.t = VIEW3(x0);
    TU_OK(rig_residual(r, RIG_BEGIN, &a, &err), err);
    for (int s = 0; s < S; s++) {
        char *x = xs + s * nd * es, *xh = xn + s * nd * es, *rs = rstd + s * N * fs;
        memset(&a, 0, sizeof a);
        a.training = 1, a.sublayer = s, a.t = VIEW3(x);
        if (norm) {
            a.norm_gain = k3rt_tensor_view(gain, dt, dev, 1, d, 0, 0, 0);
            a.normed = VIEW3(xh);
            a.rstd = k3rt_tensor_view(rs, fdt, dev, 1, N, 0, 0, 0);
            a.norm_eps = 1e-6;
        }
        TU_OK(rig_residual(r, norm ? RIG_MIX_NORM : RIG_MIX, &a, &err), err);
        TU_OK(k3rt_act_fwd(st, dt, K3RT_ACT_TANH, norm ? xh : x, ys, nd, &err), err);
        memset(&a, 0, sizeof a);
        a.training = 1, a.sublayer = s, a.t = VIEW3(ys);
        TU_OK(rig_residual(r, RIG_PUSH, &a, &err), err);
    }
    memset(&a, 0, sizeof a);
    a.training = 1, a.sublayer = S, a.t = VIEW3(out);
    TU_OK(rig_residual(r, RIG_FINISH, &a, &err), err);
    a.t = VIEW3(dout);
    TU_OK(rig_residual(r, RIG_FINISH_BACKWARD, &a, &err), err);
    for (int s = S - 1; s >= 0; s--) {
        char *x = xs + s * nd * es, *xh = xn + s * nd * es, *rs = rstd + s * N * fs;
        memset(&a, 0, sizeof a);
        a.training = 1, a.sublayer = s, a.t = VIEW3(dys);
        TU_OK(k3rt_memset(st, dys, dev, 0xFF, nd * es, &err), err);
        TU_OK(rig_residual(r, RIG_PUSH_BACKWARD, &a, &err), err);
        TU_OK(k3rt_act_bwd(st, dt, K3RT_ACT_TANH, norm ? xh : x, dys, dxs, nd, 0, &err), err);
        memset(&a, 0, sizeof a);
        a.training = 1, a.sublayer = s, a.t = VIEW3(dxs), a.sublayer_input = VIEW3(x);
        if (norm) {
            a.norm_gain = k3rt_tensor_view(gain, dt, dev, 1, d, 0, 0, 0);
            a.norm_gain_grad = k3rt_tensor_view(dgain, fdt, dev, 1, d, 0, 0, 0);
            a.rstd = k3rt_tensor_view(rs, fdt, dev, 1, N, 0, 0, 0);
            a.norm_eps = 1e-6;
        }
        TU_OK(rig_residual(r, norm ? RIG_MIX_NORM_BACKWARD : RIG_MIX_BACKWARD, &a, &err), err);
    }
    memset(&a, 0, sizeof a);
    a.training = 1, a.t = VIEW3(dx0);
    TU_OK(rig_residual(r, RIG_BEGIN_BACKWARD, &a, &err), err);
#undef VIEW3
    int64_t ng = 0, ns = 0;
    outs_add(o, "out", get(dev, dt, out, nd), nd);
    outs_add(o, "d embedding", get(dev, dt, dx0, nd), nd);
    outs_add(o, "d AttnRes parameters", grads_of(r, &ng), ng);
    if (norm)
        outs_add(o, "d norm gain", get(dev, fdt, dgain, d), d);
    outs_add(o, "depth_weights", stats_of(r, &ns), ns);
    char *bufs[] = {x0, out, dout, dx0, xs, xn, ys, dys, dxs, rstd, gain, dgain};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        k3rt_free(dev, bufs[i]);
}

static void stack_case(const shape *sh)
{
    int64_t N = sh->B * sh->T, nd = N * sh->d;
    for (int k = 0; k < 2; k++) {
        int dt = k ? K3RT_BF16 : K3RT_F32;
        for (int norm = 0; norm <= 1; norm++) {
            rig rc, rg;
            open_rig(&rc, sh, K3RT_DEVICE_CPU, K3RT_F64);
            open_rig(&rg, sh, 0, dt);
            stack_in in;
            in.x0 = randv(nd, 1.0, 0), in.dout = randv(nd, 1.0, 0);
            in.gain = randv(sh->d, 0.2, 1.0);
            round_to(in.x0, nd, dt), round_to(in.dout, nd, dt), round_to(in.gain, sh->d, dt);
            in.p = make_params(&rc, dt);
            outs ref = {0}, got = {0}, again = {0};
            stack_run(&rc, sh, &in, norm, &ref);
            stack_run(&rg, sh, &in, norm, &got);
            stack_run(&rg, sh, &in, norm, &again);
            char label[200];
            snprintf(label, sizeof label, "stack: %d layers, %s, d %lld, N %lld, %s%s",
                     sh->layers, sh->full ? "full" : sh->block_layers == 1 ? "block_layers 1"
                                                                           : "block_layers 2",
                     (long long)sh->d, (long long)N, k3rt_dtype_name(dt),
                     norm ? ", fused pre-norm" : "");
            compare(label, &ref, &got, &again, k ? 3e-2 : 1e-4);
            outs_free(&ref), outs_free(&got), outs_free(&again);
            for (int i = 0; i < rig_n_params(&rc); i++)
                free(in.p[i]);
            free(in.p), free(in.x0), free(in.dout), free(in.gain);
            rig_destroy(&rc);
            rig_destroy(&rg);
        }
    }
}

START_TEST(stack_vs_cpu)
{
    /* block_layers 1: 4 layers make 4 blocks, 5 sources at the output; block_layers 2 on 8
     * layers the same with two-layer blocks; full on 4 layers: 9 sources at the output */
    const shape shapes[] = {
        {.layers = 4, .full = 0, .block_layers = 1, .d = 64, .B = 2, .T = 1031},
        {.layers = 8, .full = 0, .block_layers = 2, .d = 64, .B = 1, .T = 2101},
        {.layers = 4, .full = 1, .block_layers = 1, .d = 64, .B = 3, .T = 333},
        {.layers = 4, .full = 0, .block_layers = 1, .d = 1024, .B = 1, .T = 2101},
    };
    int n = small_only ? 3 : 4;
    for (int i = 0; i < n; i++)
        stack_case(&shapes[i]);
    ck_assert_msg(n_failed == 0, "%d checks failed (see the log)", n_failed);
}
END_TEST

/* create() refuses what the kernels cannot run, naming the limit. */
START_TEST(cuda_refuses)
{
    rig r;
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32, a.device = 0, a.d_model = 60, a.n_layers = 2, a.layer = -1;
    a.stream = G;
    json_t *j = json_pack("{}");
    int rc = rig_create(&r, tu_plugin("block_attnres"), j, &a, "test", &err);
    json_decref(j);
    ck_assert_int_ne(rc, K3RT_OK);
    ck_assert_msg(strstr(err.msg, "multiple of 8") != NULL, "message: %s", err.msg);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("attnres_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, op_vs_cpu);
    tcase_add_test(tc, stack_vs_cpu);
    tcase_add_test(tc, cuda_refuses);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *small = getenv("K3RT_ATTNRES_TEST_SMALL");
    small_only = small && *small && strcmp(small, "0") != 0;
    C = tu_cpu_stream(8);
    int rc = tu_run_gpu_suite(make_suite, &G);
    k3rt_stream_destroy(C);
    return rc;
}
