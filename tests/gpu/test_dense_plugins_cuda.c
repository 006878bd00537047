/* The baseline plugins on CUDA against the same plugins on the CPU: dense_glu (SwiGLU and
 * SiTU-GLU), the standard residual and adamw. The CPU instance runs in f64 on the exact values
 * the device holds (bf16 inputs are rounded first), so the error measured is the device's own.
 * Outputs are poisoned with NaN bits (0xff bytes) before each call; parameter gradients, which
 * accumulate, start from the same random values on both sides and their increments are
 * compared. Error = rms(ref - x) / rms(ref): <= 1e-5 for f32, <= 1e-2 for bf16 (f32 weight
 * gradients included: their inputs are bf16); adamw's f32 master weights <= 1e-6.
 * Every failure names the plugin, the shape, the dtype and the error.
 *
 * Skips (exit 77) without a CUDA device. Runs without fork: CUDA does not survive a fork of an
 * initialised process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

enum { DEV = 0 };       /* the CUDA device under test */
static k3rt_stream *G;  /* CUDA stream on DEV */
static k3rt_stream *H;  /* CPU stream of the reference */
static uint64_t seed_next;  /* of the next random array; reset per case by seed_case */

/* From the first directory of K3RT_PLUGIN_PATH (set by ctest and by the GPU machine's runner,
 * where the build tree may sit elsewhere than where it was built), else the build tree's. */
static const plugin_entry *plugin(const char *name)
{
    const plugin_entry *e = tu_plugin(name);
    ck_assert_msg(e->desc.caps & K3RT_CAP_CUDA, "%s does not declare K3RT_CAP_CUDA in this CUDA "
                  "build", name);
    return e;
}

/* ---- host values and device buffers ------------------------------------------------------- */

static size_t nbytes(int dtype, int64_t n)
{
    return (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype);
}

/* x rounded to dtype in place: the values a buffer of that dtype holds exactly. */
static void round_to(double *x, int64_t n, int dtype)
{
    k3rt_error err = {0};
    void *tmp = malloc(nbytes(dtype, n));
    TU_OK(k3rt_convert(tmp, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, tmp, dtype, n, &err), err);
    free(tmp);
}

/* Each case draws from seeds derived from its description alone, so a failing case reproduces
 * on its own whatever ran before it. */
static void seed_case(const char *where)
{
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (const char *c = where; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    seed_next = h;
}

/* N(0, scale^2) values, exact in dtype. */
static double *randn(int64_t n, double scale, int dtype)
{
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    tu_randn(x, n, scale, seed_next++);
    round_to(x, n, dtype);
    return x;
}

static double *copy_of(const double *x, int64_t n)
{
    double *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    memcpy(c, x, (size_t)n * sizeof(double));
    return c;
}

static void *dev_alloc(size_t bytes)
{
    k3rt_error err = {0};
    void *p = k3rt_alloc(DEV, bytes ? bytes : 1, &err);
    ck_assert_msg(p != NULL, "k3rt_alloc(%zu bytes): %s", bytes, err.msg);
    return p;
}

static void dev_poison(void *p, size_t bytes)
{
    k3rt_error err = {0};
    TU_OK(k3rt_memset(G, p, DEV, 0xff, bytes, &err), err);
}

static void dev_put(void *dev, int dtype, const double *x, int64_t n)
{
    k3rt_error err = {0};
    void *h = malloc(nbytes(dtype, n));
    TU_OK(k3rt_convert(h, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_memcpy(G, dev, DEV, h, K3RT_DEVICE_CPU, (size_t)n * k3rt_dtype_size(dtype), &err),
          err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    free(h);
}

static void *dev_from(int dtype, const double *x, int64_t n)
{
    void *d = dev_alloc(nbytes(dtype, n));
    dev_put(d, dtype, x, n);
    return d;
}

static void *raw_get(const void *dev, int device, size_t bytes)
{
    k3rt_error err = {0};
    void *h = malloc(bytes ? bytes : 1);
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, dev, device, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    return h;
}

static double *dev_get(const void *dev, int dtype, int64_t n)
{
    k3rt_error err = {0};
    void *h = raw_get(dev, DEV, (size_t)n * k3rt_dtype_size(dtype));
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    TU_OK(k3rt_convert(x, K3RT_F64, h, dtype, n, &err), err);
    free(h);
    return x;
}

/* Whether a side of a comparison keeps its buffers in host memory (the CPU reference). */
static int host_side(int device, int dtype)
{
    (void)dtype;
    return device == K3RT_DEVICE_CPU;
}

static double tol_of(int dtype) { return dtype == K3RT_BF16 ? 1e-2 : 1e-5; }

/* got against ref: finite where ref is, and rms(ref - got) / rms(ref) <= tol. `where` names the
 * plugin, shape and dtype. */
static void expect_close(const char *where, const char *what, const double *ref,
                         const double *got, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(isfinite(got[i]) || !isfinite(ref[i]),
                      "%s: %s element %lld of %lld is %g (reference %g): not written by the "
                      "device, or not finite", where, what, (long long)i, (long long)n, got[i],
                      ref[i]);
    double e = tu_rel_rms(ref, got, n);
    printf("  %-58s %-22s rel rms %.2e (tol %.0e)\n", where, what, e, tol);
    ck_assert_msg(e <= tol, "%s: %s relative rms error %.3g > %.1g", where, what, e, tol);
}

/* The device buffer (n values of dtype) against ref. */
static void expect_dev(const char *where, const char *what, const double *ref, const void *dev,
                       int dtype, int64_t n, double tol)
{
    double *got = dev_get(dev, dtype, n);
    expect_close(where, what, ref, got, n, tol);
    free(got);
}

static void expect_same_bits(const char *where, const char *what, const void *a,
                             const void *b, size_t bytes)
{
    void *x = raw_get(a, DEV, bytes), *y = raw_get(b, DEV, bytes);
    ck_assert_msg(memcmp(x, y, bytes) == 0, "%s: %s differs between two runs on the same "
                  "inputs (the plugin declares K3RT_CAP_DETERMINISTIC)", where, what);
    free(x);
    free(y);
}

static void create(rig *m, const char *plugin_name, const char *cfg_text, int dtype,
                   int device, int64_t d, const k3rt_param_ref *params, int n_params)
{
    k3rt_error err = {0};
    json_t *cfg = cfg_text ? json_loads(cfg_text, 0, NULL) : NULL;
    ck_assert_msg(!cfg_text || cfg, "bad test config %s", cfg_text);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = device;
    a.d_model = d;
    a.n_layers = 2;
    a.layer = params ? -1 : 0;
    a.params = params;
    a.n_params = n_params;
    a.stream = device == K3RT_DEVICE_CPU ? H : G;
    TU_OK(rig_create(m, plugin(plugin_name), cfg, &a, device == K3RT_DEVICE_CPU ? "cpu" : "cuda",
                        &err), err);
    json_decref(cfg);
}

/* ---- dense_glu ----------------------------------------------------------------------------- */

/* One side (CPU f64 or CUDA) of a dense_glu comparison. */
typedef struct glu_side {
    rig m;  /* the instance; its saved part and workspace at B x T */
    int dtype, gdtype, device, host;
    k3rt_stream *s;
    k3rt_tensor params[3], grads[3];
    void *x, *dy, *y, *dx;
} glu_side;

typedef struct glu_case {
    const char *cfg;    /* without "hidden" */
    int64_t B, T, d, H;
    int f32_only;       /* too few elements for a bf16 error estimate (see GLU_SHAPES) */
} glu_case;

static k3rt_tensor act_view(const glu_side *s, void *p, const glu_case *c)
{
    return k3rt_tensor_view(p, s->dtype, s->device, 3, c->B, c->T, c->d, 0);
}

static int glu_forward(glu_side *s, const glu_case *c, int training, k3rt_error *err)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = act_view(s, s->x, c);
    a.y = act_view(s, s->y, c);
    return rig_forward(&s->m, &a, err);
}

static int glu_backward(glu_side *s, const glu_case *c, k3rt_error *err)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act_view(s, s->x, c);
    a.dy = act_view(s, s->dy, c);
    a.dx = act_view(s, s->dx, c);
    return rig_backward(&s->m, &a, err);
}

/* Inputs shared by both sides: exact in the device dtype (gradients' start in f32). */
typedef struct glu_inputs {
    double *p[3], *g0[3], *x, *dy;
    int64_t pn[3], n;
} glu_inputs;

static void glu_side_init(glu_side *s, const glu_case *c, const char *cfg, int dtype, int device,
                          const glu_inputs *in)
{
    memset(s, 0, sizeof *s);
    k3rt_error err = {0};
    s->dtype = dtype;
    s->gdtype = dtype == K3RT_BF16 ? K3RT_F32 : dtype;
    s->device = device;
    s->host = host_side(device, dtype);
    s->s = device == K3RT_DEVICE_CPU ? H : G;
    create(&s->m, "dense_glu", cfg, dtype, device, c->d, NULL, 0);
    ck_assert_int_eq(rig_n_params(&s->m), 3);
    ck_assert_int_eq(rig_param(&s->m, 0)->shape[0], c->H);
    int cpu = s->host;
    for (int i = 0; i < 3; i++) {
        const k3rt_param_decl *pd = rig_param(&s->m, i);
        s->params[i] = k3rt_tensor_view(NULL, dtype, device, 2, pd->shape[0], pd->shape[1], 0, 0);
        s->grads[i] = s->params[i];
        s->grads[i].dtype = s->gdtype;
        s->params[i].data = cpu ? copy_of(in->p[i], in->pn[i])
                                : dev_from(dtype, in->p[i], in->pn[i]);
        s->grads[i].data = cpu ? copy_of(in->g0[i], in->pn[i])
                               : dev_from(s->gdtype, in->g0[i], in->pn[i]);
    }
    s->x = cpu ? copy_of(in->x, in->n) : dev_from(dtype, in->x, in->n);
    s->dy = cpu ? copy_of(in->dy, in->n) : dev_from(dtype, in->dy, in->n);
    if (cpu) {
        s->y = calloc((size_t)in->n, sizeof(double));
        s->dx = calloc((size_t)in->n, sizeof(double));
    } else {
        s->y = dev_alloc(nbytes(dtype, in->n));
        s->dx = dev_alloc(nbytes(dtype, in->n));
    }
    TU_OK(rig_bind_params(&s->m, s->params, s->grads, &err), err);
    TU_OK(rig_alloc_shape(&s->m, c->B, c->T, 0, &err), err);
}

static void glu_side_free(glu_side *s)
{
    rig_destroy(&s->m);
    void *bufs[] = {s->params[0].data, s->params[1].data, s->params[2].data, s->grads[0].data,
                    s->grads[1].data, s->grads[2].data, s->x, s->dy, s->y, s->dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (s->host)
            free(bufs[i]);
        else
            k3rt_free(DEV, bufs[i]);
    }
}

/* Poisons every output and scratch buffer of the device side. */
static void glu_poison(glu_side *s, int64_t n)
{
    k3rt_error err = {0};
    dev_poison(s->y, nbytes(s->dtype, n));
    dev_poison(s->dx, nbytes(s->dtype, n));
    TU_OK(rig_fill_buffers(&s->m, 0xff, &err), err);
}

static void glu_compare(const glu_case *c, const char *act, int dtype)
{
    k3rt_error err = {0};
    char cfg[256], where[160];
    snprintf(cfg, sizeof cfg, "{%s, \"hidden\": %lld}", c->cfg, (long long)c->H);
    snprintf(where, sizeof where, "dense_glu %s B=%lld T=%lld d=%lld H=%lld %s", act,
             (long long)c->B, (long long)c->T, (long long)c->d, (long long)c->H,
             k3rt_dtype_name(dtype));
    seed_case(where);
    glu_inputs in;
    in.n = c->B * c->T * c->d;
    in.pn[0] = in.pn[1] = in.pn[2] = c->H * c->d;
    /* std 1.5/sqrt(fan-in): g and u reach where SiTU's tanh caps bend. */
    for (int i = 0; i < 3; i++) {
        in.p[i] = randn(in.pn[i], 1.5 / sqrt((double)(i == 2 ? c->H : c->d)), dtype);
        in.g0[i] = randn(in.pn[i], 0.1, dtype == K3RT_BF16 ? K3RT_F32 : dtype);
    }
    in.x = randn(in.n, 1.0, dtype);
    in.dy = randn(in.n, 1.0, dtype);

    glu_side ref, dev;
    glu_side_init(&ref, c, cfg, K3RT_F64, K3RT_DEVICE_CPU, &in);
    glu_side_init(&dev, c, cfg, dtype, DEV, &in);
    TU_OK(glu_forward(&ref, c, 1, &err), err);
    TU_OK(glu_backward(&ref, c, &err), err);

    double tol = tol_of(dtype);
    static const char *const gname[3] = {"grad gate_proj", "grad up_proj", "grad down_proj"};
    glu_poison(&dev, in.n);
    TU_OK(glu_forward(&dev, c, 1, &err), err);
    expect_dev(where, "y (training)", ref.y, dev.y, dtype, in.n, tol);
    TU_OK(glu_backward(&dev, c, &err), err);
    expect_dev(where, "dx", ref.dx, dev.dx, dtype, in.n, tol);
    for (int i = 0; i < 3; i++) {
        /* The increments: what backward added to the starting gradient. */
        double *got = dev_get(dev.grads[i].data, dev.gdtype, in.pn[i]);
        double *want = copy_of(ref.grads[i].data, in.pn[i]);
        for (int64_t j = 0; j < in.pn[i]; j++)
            got[j] -= in.g0[i][j], want[j] -= in.g0[i][j];
        expect_close(where, gname[i], want, got, in.pn[i], tol);
        free(got);
        free(want);
    }
    /* Kept for the determinism check below. */
    size_t ab = nbytes(dtype, in.n);
    void *dx1 = raw_get(dev.dx, DEV, ab), *gk[3];
    for (int i = 0; i < 3; i++)
        gk[i] = raw_get(dev.grads[i].data, DEV, nbytes(dev.gdtype, in.pn[i]));

    /* Inference: the same y. */
    glu_poison(&dev, in.n);
    TU_OK(glu_forward(&dev, c, 0, &err), err);
    expect_dev(where, "y (inference)", ref.y, dev.y, dtype, in.n, tol);

    /* Deterministic: the same inputs give the same bits (forward twice, then the backward
     * again from the same starting gradients). */
    glu_poison(&dev, in.n);
    TU_OK(glu_forward(&dev, c, 1, &err), err);
    void *y1 = raw_get(dev.y, DEV, ab);
    glu_poison(&dev, in.n);
    TU_OK(glu_forward(&dev, c, 1, &err), err);
    void *y2 = raw_get(dev.y, DEV, ab);
    ck_assert_msg(memcmp(y1, y2, ab) == 0, "%s: y differs between two runs on the same inputs",
                  where);
    for (int i = 0; i < 3; i++)
        dev_put(dev.grads[i].data, dev.gdtype, in.g0[i], in.pn[i]);
    TU_OK(glu_backward(&dev, c, &err), err);
    void *dx2 = raw_get(dev.dx, DEV, ab);
    ck_assert_msg(memcmp(dx1, dx2, ab) == 0, "%s: dx differs between two runs on the same "
                  "inputs", where);
    for (int i = 0; i < 3; i++) {
        size_t gb = nbytes(dev.gdtype, in.pn[i]);
        void *g2 = raw_get(dev.grads[i].data, DEV, gb);
        ck_assert_msg(memcmp(gk[i], g2, gb) == 0, "%s: %s differs between two runs on the same "
                      "inputs", where, gname[i]);
        free(g2);
        free(gk[i]);
    }
    free(y1), free(y2), free(dx1), free(dx2);

    glu_side_free(&ref);
    glu_side_free(&dev);
    for (int i = 0; i < 3; i++)
        free(in.p[i]), free(in.g0[i]);
    free(in.x), free(in.dy);
}

/* Ragged shapes (odd d, H, N) take the unaligned paths of the products and the GLU. With a
 * handful of elements, bf16's relative rms error is luck (one 8-element dx reaches 1.1e-2 in
 * twenty draws of an emulation of the device's rounding; 96 elements stay under 5e-3), so the
 * tiniest shape runs in f32 only and one token is tested in bf16 at d = 64. */
static const glu_case GLU_SHAPES[] = {
    {NULL, 1, 1, 8, 16, 1},  {NULL, 1, 1, 64, 96, 0},   {NULL, 2, 3, 16, 24, 0},
    {NULL, 3, 7, 37, 53, 0}, {NULL, 2, 33, 64, 96, 0}, {NULL, 1, 127, 130, 200, 0},
};

static void glu_all(const char *act, const char *cfg)
{
    const int dtypes[2] = {K3RT_F32, K3RT_BF16};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof GLU_SHAPES / sizeof GLU_SHAPES[0]; i++) {
            glu_case c = GLU_SHAPES[i];
            c.cfg = cfg;
            if (dtypes[k] == K3RT_F32 || !c.f32_only)
                glu_compare(&c, act, dtypes[k]);
        }
}

START_TEST(dense_glu_swiglu_vs_cpu)
{
    glu_all("swiglu", "\"act\": \"swiglu\"");
}
END_TEST

START_TEST(dense_glu_situ_vs_cpu)
{
    glu_all("situ", "\"act\": \"situ\"");
    /* Small caps: most of g and u in tanh's bend. */
    glu_all("situ(1.5,2)", "\"act\": \"situ\", \"beta1\": 1.5, \"beta2\": 2.0");
}
END_TEST

/* ---- standard residual --------------------------------------------------------------------- */

enum { RES_LAYERS = 2, RES_S = 2 * RES_LAYERS };

typedef struct res_side {
    rig m;  /* the instance; its saved part at B x T */
    int dtype, device;
    k3rt_stream *s;
} res_side;

typedef struct res_case {
    int64_t B, T, d, n;
    int dtype;
    char where[128];
    res_side ref, dev;
} res_case;

static void res_side_init(res_side *s, const res_case *c, int dtype, int device)
{
    memset(s, 0, sizeof *s);
    k3rt_error err = {0};
    s->dtype = dtype;
    s->device = device;
    s->s = device == K3RT_DEVICE_CPU ? H : G;
    create(&s->m, "standard", NULL, dtype, device, c->d, NULL, 0);
    TU_OK(rig_alloc_shape(&s->m, c->B, c->T, 0, &err), err);
    if (device != K3RT_DEVICE_CPU)
        TU_OK(rig_fill_buffers(&s->m, 0xff, &err), err);
}

static k3rt_tensor res_view(const res_case *c, const res_side *s, void *p)
{
    return k3rt_tensor_view(p, s->dtype, s->device, 3, c->B, c->T, c->d, 0);
}

static k3rt_residual_args res_args(const res_case *c, res_side *s, int sub, void *t)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = sub;
    a.t = res_view(c, s, t);
    a.training = 1;
    return a;
}

/* The call on both sides: an input t (same values; uploaded to a fresh device buffer), or an
 * output (ref receives into `ref_t`, the device into a poisoned buffer compared with it).
 * input: mix_backward's sublayer input (what mix wrote on the reference side), else NULL. */
static void res_call(res_case *c, rig_residual_call call, const char *name, int sub,
                     double *ref_t, int output, const double *input)
{
    k3rt_error err = {0};
    k3rt_residual_args a = res_args(c, &c->ref, sub, ref_t);
    if (input)
        a.sublayer_input = res_view(c, &c->ref, (void *)input);
    TU_OK(rig_residual(&c->ref.m, call, &a, &err), err);
    void *dt = dev_alloc(nbytes(c->dtype, c->n));
    void *din = input ? dev_from(c->dtype, input, c->n) : NULL;
    if (output)
        dev_poison(dt, nbytes(c->dtype, c->n));
    else
        dev_put(dt, c->dtype, ref_t, c->n);
    a = res_args(c, &c->dev, sub, dt);
    if (input)
        a.sublayer_input = res_view(c, &c->dev, din);
    TU_OK(rig_residual(&c->dev.m, call, &a, &err), err);
    if (din)
        k3rt_free(DEV, din);
    if (output) {
        char what[64];
        snprintf(what, sizeof what, "%s(%d)", name, sub);
        expect_dev(c->where, what, ref_t, dt, c->dtype, c->n, tol_of(c->dtype));
    }
    k3rt_free(DEV, dt);
}

/* The whole stream protocol: begin, mix/push per sublayer, finish, then the backward calls. */
static void res_stream(res_case *c)
{
    double *t = malloc((size_t)c->n * sizeof(double));
    double *xs = malloc((size_t)RES_S * (size_t)c->n * sizeof(double));
    double *in = randn(c->n, 1.0, c->dtype);
    res_call(c, RIG_BEGIN, "begin", 0, in, 0, NULL);
    free(in);
    for (int s = 0; s < RES_S; s++) {
        res_call(c, RIG_MIX, "mix", s, xs + (int64_t)s * c->n, 1, NULL);
        double *y = randn(c->n, 1.0, c->dtype);
        res_call(c, RIG_PUSH, "push", s, y, 0, NULL);
        free(y);
    }
    res_call(c, RIG_FINISH, "finish", RES_S, t, 1, NULL);
    double *dout = randn(c->n, 1.0, c->dtype);
    res_call(c, RIG_FINISH_BACKWARD, "finish_backward", RES_S, dout, 0, NULL);
    free(dout);
    for (int s = RES_S - 1; s >= 0; s--) {
        res_call(c, RIG_PUSH_BACKWARD, "push_backward", s, t, 1, NULL);
        double *dx = randn(c->n, 1.0, c->dtype);
        res_call(c, RIG_MIX_BACKWARD, "mix_backward", s, dx, 0, xs + (int64_t)s * c->n);
        free(dx);
    }
    res_call(c, RIG_BEGIN_BACKWARD, "begin_backward", 0, t, 1, NULL);
    free(t), free(xs);
}

/* op_forward / op_backward with n_src sources, with or without a partial sum. */
static void res_op(res_case *c, int n_src, int with_partial)
{
    k3rt_error err = {0};
    char what[64];
    enum { MAXS = 3 };
    double *src[MAXS], *partial = randn(c->n, 1.0, c->dtype);
    double *t = calloc((size_t)c->n, sizeof(double));
    double *d_src[MAXS], *d_partial = calloc((size_t)c->n, sizeof(double));
    void *src_d[MAXS], *partial_d = dev_from(c->dtype, partial, c->n), *d_src_d[MAXS];
    void *d_partial_d = dev_alloc(nbytes(c->dtype, c->n)), *t_d = dev_alloc(nbytes(c->dtype, c->n));
    k3rt_tensor rs[MAXS], ds[MAXS], rds[MAXS], dds[MAXS];
    for (int j = 0; j < n_src; j++) {
        src[j] = randn(c->n, 1.0, c->dtype);
        d_src[j] = calloc((size_t)c->n, sizeof(double));
        src_d[j] = dev_from(c->dtype, src[j], c->n);
        d_src_d[j] = dev_alloc(nbytes(c->dtype, c->n));
        rs[j] = res_view(c, &c->ref, src[j]);
        ds[j] = res_view(c, &c->dev, src_d[j]);
        rds[j] = res_view(c, &c->ref, d_src[j]);
        dds[j] = res_view(c, &c->dev, d_src_d[j]);
    }

    k3rt_residual_args ra = res_args(c, &c->ref, 1, t), da = res_args(c, &c->dev, 1, t_d);
    ra.sources = rs, da.sources = ds;
    ra.n_sources = da.n_sources = n_src;
    if (with_partial) {
        ra.partial = res_view(c, &c->ref, partial);
        da.partial = res_view(c, &c->dev, partial_d);
    }
    TU_OK(rig_residual(&c->ref.m, RIG_OP_FORWARD, &ra, &err), err);
    dev_poison(t_d, nbytes(c->dtype, c->n));
    TU_OK(rig_residual(&c->dev.m, RIG_OP_FORWARD, &da, &err), err);
    snprintf(what, sizeof what, "op_forward %d src%s", n_src, with_partial ? "+partial" : "");
    expect_dev(c->where, what, t, t_d, c->dtype, c->n, tol_of(c->dtype));

    /* backward: t is the output gradient, copied to every term */
    double *dt = randn(c->n, 1.0, c->dtype);
    ra = res_args(c, &c->ref, 1, dt);
    dev_put(t_d, c->dtype, dt, c->n);
    da = res_args(c, &c->dev, 1, t_d);
    ra.sources = rs, da.sources = ds;
    ra.d_sources = rds, da.d_sources = dds;
    ra.n_sources = da.n_sources = n_src;
    if (with_partial) {
        ra.partial = res_view(c, &c->ref, partial);
        da.partial = res_view(c, &c->dev, partial_d);
        ra.d_partial = res_view(c, &c->ref, d_partial);
        da.d_partial = res_view(c, &c->dev, d_partial_d);
    }
    TU_OK(rig_residual(&c->ref.m, RIG_OP_BACKWARD, &ra, &err), err);
    for (int j = 0; j < n_src; j++)
        dev_poison(d_src_d[j], nbytes(c->dtype, c->n));
    dev_poison(d_partial_d, nbytes(c->dtype, c->n));
    TU_OK(rig_residual(&c->dev.m, RIG_OP_BACKWARD, &da, &err), err);
    for (int j = 0; j < n_src; j++) {
        snprintf(what, sizeof what, "op_backward d_src.%d", j);
        expect_dev(c->where, what, d_src[j], d_src_d[j], c->dtype, c->n, tol_of(c->dtype));
    }
    if (with_partial)
        expect_dev(c->where, "op_backward d_partial", d_partial, d_partial_d, c->dtype, c->n,
                   tol_of(c->dtype));

    for (int j = 0; j < n_src; j++) {
        free(src[j]), free(d_src[j]);
        k3rt_free(DEV, src_d[j]), k3rt_free(DEV, d_src_d[j]);
    }
    free(partial), free(t), free(d_partial), free(dt);
    k3rt_free(DEV, partial_d), k3rt_free(DEV, d_partial_d), k3rt_free(DEV, t_d);
}

START_TEST(standard_residual_vs_cpu)
{
    /* B, T, d and whether bf16 runs too: a one-element sum of five bf16 terms can cancel to
     * a relative error of 0.3 (as for dense_glu's shapes, bf16 needs a few dozen elements). */
    const int64_t shapes[][4] = {{1, 1, 1, 0}, {2, 3, 8, 1}, {3, 5, 37, 1}, {2, 17, 130, 1},
                                 {1, 64, 1024, 1}};
    const int dtypes[2] = {K3RT_F32, K3RT_BF16};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (dtypes[k] == K3RT_BF16 && !shapes[i][3])
                continue;
            res_case c;
            memset(&c, 0, sizeof c);
            c.B = shapes[i][0], c.T = shapes[i][1], c.d = shapes[i][2];
            c.n = c.B * c.T * c.d;
            c.dtype = dtypes[k];
            snprintf(c.where, sizeof c.where, "standard B=%lld T=%lld d=%lld %s",
                     (long long)c.B, (long long)c.T, (long long)c.d, k3rt_dtype_name(c.dtype));
            seed_case(c.where);
            res_side_init(&c.ref, &c, K3RT_F64, K3RT_DEVICE_CPU);
            res_side_init(&c.dev, &c, c.dtype, DEV);
            res_stream(&c);
            res_op(&c, 1, 0);
            res_op(&c, 3, 1);
            res_op(&c, 2, 1);
            rig_destroy(&c.ref.m);
            rig_destroy(&c.dev.m);
        }
}
END_TEST

/* ---- adamw ---------------------------------------------------------------------------------- */

/* Odd sizes, one over several 65536-element chunks of the fused kernel; packed back to back in
 * one arena (as the engine does), so some tensors start 16-byte aligned and some do not. */
enum { AP = 6, ASTEPS = 5 };
static const int64_t ALEN[AP] = {1, 7, 1001, 65537, 3 * 65536 + 5, 4096};
static const int AROLE[AP] = {K3RT_ROLE_MATRIX, K3RT_ROLE_NORM_GAIN, K3RT_ROLE_EMBEDDING,
                              K3RT_ROLE_ROUTER, K3RT_ROLE_EXPERT_MATRIX, K3RT_ROLE_VECTOR};
static const double ALR[ASTEPS] = {1e-2, 2e-2, 5e-3, 1e-2, 3e-3};
static const char *ACFG = "{\"beta1\": 0.9, \"beta2\": 0.99, \"eps\": 1e-8, "
                          "\"weight_decay\": 0.1}";

typedef struct opt_side {
    rig m;
    int device, dtype, host;
    k3rt_param_decl decls[AP];
    k3rt_param_ref refs[AP];
    char names[AP][32];
    void *pbuf, *gbuf;  /* arenas */
} opt_side;

static int64_t a_offset(int i)
{
    int64_t o = 0;
    for (int k = 0; k < i; k++)
        o += ALEN[k];
    return o;
}

static int64_t a_total(void) { return a_offset(AP); }

/* p0: initial weights (exact in f32), total values; dtype f64 on the CPU, f32 on the device. */
static void opt_side_init(opt_side *s, int device, int dtype, const double *p0)
{
    memset(s, 0, sizeof *s);
    s->device = device;
    s->dtype = dtype;
    s->host = host_side(device, dtype);
    size_t es = k3rt_dtype_size(dtype);
    int64_t total = a_total();
    if (s->host) {
        s->pbuf = copy_of(p0, total);
        s->gbuf = calloc((size_t)total, sizeof(double));
    } else {
        s->pbuf = dev_from(K3RT_F32, p0, total);
        s->gbuf = dev_alloc(nbytes(K3RT_F32, total));
    }
    for (int i = 0; i < AP; i++) {
        k3rt_param_decl *d = &s->decls[i];
        d->struct_size = sizeof *d;
        d->role = AROLE[i];
        snprintf(s->names[i], sizeof s->names[i], "p%d", i);
        d->name = s->names[i];
        d->ndim = 1;
        d->shape[0] = ALEN[i];
        d->experts = AROLE[i] == K3RT_ROLE_EXPERT_MATRIX ? 1 : 0;
        d->layer = -1;
        d->flags = AROLE[i] == K3RT_ROLE_EMBEDDING ? K3RT_PARAM_NO_DECAY : 0;
        k3rt_param_ref *r = &s->refs[i];
        r->struct_size = sizeof *r;
        r->index = i;
        r->name = s->names[i];
        r->decl = d;
        r->param = k3rt_tensor_view((char *)s->pbuf + a_offset(i) * (int64_t)es, dtype, device, 1,
                                    ALEN[i], 0, 0, 0);
        r->grad = r->param;
        r->grad.data = (char *)s->gbuf + a_offset(i) * (int64_t)es;
    }
    create(&s->m, "adamw", ACFG, dtype, device, 0, s->refs, AP);
}

static void opt_side_free(opt_side *s)
{
    if (s->host) {
        free(s->pbuf), free(s->gbuf);
    } else {
        k3rt_free(DEV, s->pbuf), k3rt_free(DEV, s->gbuf);
    }
    rig_destroy(&s->m);
}

static int opt_step(opt_side *s, const double *g, double lr, int64_t number, k3rt_error *err)
{
    if (s->host)
        memcpy(s->gbuf, g, (size_t)a_total() * sizeof(double));
    else
        dev_put(s->gbuf, K3RT_F32, g, a_total());
    return rig_step(&s->m, NULL, lr, number, s->refs, AP, err);
}

/* The state tensor `name` of s, in double on the host. */
static double *opt_state(opt_side *s, const char *name, int64_t n)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&s->m, &sink, &err), err);
    double *out = NULL;
    for (int i = 0; i < sink.n && !out; i++) {
        const k3rt_tensor *t = &sink.items[i].t;
        if (strcmp(sink.items[i].name, name))
            continue;
        ck_assert_int_eq(k3rt_tensor_numel(t), n);
        ck_assert_msg(t->device == s->device, "adamw state %s on device %d, expected %d", name,
                      t->device, s->device);
        void *h = raw_get(t->data, t->device, k3rt_tensor_bytes(t));
        out = malloc((size_t)n * sizeof(double));
        TU_OK(k3rt_convert(out, K3RT_F64, h, t->dtype, n, &err), err);
        free(h);
    }
    tensor_sink_free(&sink);
    ck_assert_msg(out != NULL, "adamw state has no tensor %s", name);
    return out;
}

/* Weights, m and v of the device side against the CPU side. Weights per tensor <= 1e-6; the
 * moments <= 1e-6 over all tensors together and <= 1e-5 per tensor (a one-element moment that
 * cancels to near zero may lose a few more digits in f32). */
static void opt_compare(opt_side *ref, opt_side *dev, const char *when)
{
    char where[96];
    snprintf(where, sizeof where, "adamw %d tensors f32 %s", AP, when);
    int64_t total = a_total();
    double *pr = copy_of(ref->pbuf, total), *pd = dev_get(dev->pbuf, K3RT_F32, total);
    for (int i = 0; i < AP; i++) {
        char what[48];
        snprintf(what, sizeof what, "weights p%d [%lld]", i, (long long)ALEN[i]);
        expect_close(where, what, pr + a_offset(i), pd + a_offset(i), ALEN[i], 1e-6);
    }
    free(pr), free(pd);
    const char *mom[2] = {"m", "v"};
    for (int k = 0; k < 2; k++) {
        double *all_r = malloc((size_t)total * sizeof(double));
        double *all_d = malloc((size_t)total * sizeof(double));
        for (int i = 0; i < AP; i++) {
            char name[32], what[48];
            snprintf(name, sizeof name, "p%d.%s", i, mom[k]);
            double *r = opt_state(ref, name, ALEN[i]), *d = opt_state(dev, name, ALEN[i]);
            snprintf(what, sizeof what, "state %s [%lld]", name, (long long)ALEN[i]);
            expect_close(where, what, r, d, ALEN[i], 1e-5);
            memcpy(all_r + a_offset(i), r, (size_t)ALEN[i] * sizeof(double));
            memcpy(all_d + a_offset(i), d, (size_t)ALEN[i] * sizeof(double));
            free(r), free(d);
        }
        char what[48];
        snprintf(what, sizeof what, "state *.%s (all)", mom[k]);
        expect_close(where, what, all_r, all_d, total, 1e-6);
        free(all_r), free(all_d);
    }
}

/* Copies every state tensor of `from` into `to` through the host, as a checkpoint does. */
static void opt_state_copy(opt_side *from, opt_side *to)
{
    k3rt_error err = {0};
    k3rt_tensor_sink a, b;
    TU_OK(rig_state(&from->m, &a, &err), err);
    TU_OK(rig_state(&to->m, &b, &err), err);
    ck_assert_int_eq(a.n, 2 * AP + 1);
    ck_assert_int_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) {
        const k3rt_tensor *src = &a.items[i].t, *dst = NULL;
        for (int j = 0; j < b.n && !dst; j++)
            if (!strcmp(a.items[i].name, b.items[j].name))
                dst = &b.items[j].t;
        ck_assert_msg(dst != NULL, "adamw state %s missing from a fresh instance",
                      a.items[i].name);
        ck_assert_int_eq(k3rt_tensor_bytes(src), k3rt_tensor_bytes(dst));
        void *h = raw_get(src->data, src->device, k3rt_tensor_bytes(src));
        TU_OK(k3rt_memcpy(G, dst->data, dst->device, h, K3RT_DEVICE_CPU, k3rt_tensor_bytes(dst),
                          &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
        free(h);
    }
    tensor_sink_free(&a);
    tensor_sink_free(&b);
    TU_OK(rig_state_loaded(&to->m, &err), err);
}

START_TEST(adamw_vs_cpu_and_state_round_trip)
{
    k3rt_error err = {0};
    seed_case("adamw");
    int64_t total = a_total();
    double *p0 = randn(total, 1.0, K3RT_F32);
    opt_side ref, dev, restored;
    opt_side_init(&ref, K3RT_DEVICE_CPU, K3RT_F64, p0);
    opt_side_init(&dev, DEV, K3RT_F32, p0);
    for (int t = 1; t <= ASTEPS; t++) {
        double *g = randn(total, 0.5, K3RT_F32);
        if (t == 3) {
            /* Resume on a fresh device instance from the state after step 2, on a copy of the
             * weights: it must continue bit for bit. */
            opt_side_init(&restored, DEV, K3RT_F32, p0);
            TU_OK(k3rt_memcpy(G, restored.pbuf, DEV, dev.pbuf, DEV, nbytes(K3RT_F32, total),
                              &err), err);
            opt_state_copy(&dev, &restored);
        }
        TU_OK(opt_step(&ref, g, ALR[t - 1], t, &err), err);
        TU_OK(opt_step(&dev, g, ALR[t - 1], t, &err), err);
        if (t >= 3)
            TU_OK(opt_step(&restored, g, ALR[t - 1], t, &err), err);
        free(g);
        char when[32];
        snprintf(when, sizeof when, "after step %d", t);
        if (t == 2 || t == ASTEPS) {
            opt_compare(&ref, &dev, when);
        } else {
            double *pd = dev_get(dev.pbuf, K3RT_F32, total);
            char where[96];
            snprintf(where, sizeof where, "adamw %d tensors f32 %s", AP, when);
            expect_close(where, "weights (all)", ref.pbuf, pd, total, 1e-6);
            free(pd);
        }
    }
    expect_same_bits("adamw resumed after step 2", "weights", dev.pbuf, restored.pbuf,
                     nbytes(K3RT_F32, total));
    for (int i = 0; i < AP; i++) {
        char name[32];
        snprintf(name, sizeof name, "p%d.v", i);
        double *a = opt_state(&dev, name, ALEN[i]), *b = opt_state(&restored, name, ALEN[i]);
        ck_assert_msg(memcmp(a, b, (size_t)ALEN[i] * sizeof(double)) == 0,
                      "adamw resumed after step 2: state %s differs", name);
        free(a), free(b);
    }
    /* The decay rule reached the device: a decayed and an undecayed tensor both match the CPU
     * (opt_compare above), and the CPU's rule is checked by the plugin's own suite. */
    opt_side_free(&ref);
    opt_side_free(&dev);
    opt_side_free(&restored);
    free(p0);
}
END_TEST

/* ---- bad input on the device: the host refuses it with a message, nothing launched ------ */

START_TEST(host_tensors_refused_on_device)
{
    k3rt_error err = {0};
    seed_case("refused");
    /* dense_glu: x tagged as host memory */
    glu_case c = {"\"act\": \"swiglu\"", 1, 2, 8, 16, 0};
    char cfg[128];
    snprintf(cfg, sizeof cfg, "{%s, \"hidden\": 16}", c.cfg);
    glu_inputs in;
    in.n = c.B * c.T * c.d;
    for (int i = 0; i < 3; i++) {
        in.pn[i] = c.H * c.d;
        in.p[i] = randn(in.pn[i], 0.3, K3RT_F32);
        in.g0[i] = randn(in.pn[i], 0.1, K3RT_F32);
    }
    in.x = randn(in.n, 1.0, K3RT_F32);
    in.dy = randn(in.n, 1.0, K3RT_F32);
    glu_side dev;
    glu_side_init(&dev, &c, cfg, K3RT_F32, DEV, &in);
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.x = k3rt_tensor_view(in.x, K3RT_F32, K3RT_DEVICE_CPU, 3, c.B, c.T, c.d, 0);
    a.y = act_view(&dev, dev.y, &c);
    ck_assert_int_eq(rig_forward(&dev.m, &a, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "forward: x: expected f32 [1, 2, 8] on cuda:0, got f32 "
                         "[1, 2, 8] on the CPU"), "%s", err.msg);
    glu_side_free(&dev);
    /* bf16 compute accumulates weight gradients in f32 buffers (k3rt/ops.h) */
    glu_side_init(&dev, &c, cfg, K3RT_BF16, DEV, &in);
    dev.grads[0].dtype = K3RT_BF16;
    ck_assert_int_eq(rig_bind_params(&dev.m, dev.params, dev.grads, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "gradient of gate_proj.weight: expected f32"), "%s", err.msg);
    dev.grads[0].dtype = K3RT_F32;
    glu_side_free(&dev);
    for (int i = 0; i < 3; i++)
        free(in.p[i]), free(in.g0[i]);
    free(in.x), free(in.dy);

    /* adamw: a gradient tagged as host memory */
    int64_t total = a_total();
    double *p0 = randn(total, 1.0, K3RT_F32), *g = randn(total, 0.5, K3RT_F32);
    opt_side o;
    opt_side_init(&o, DEV, K3RT_F32, p0);
    o.refs[2].grad.device = K3RT_DEVICE_CPU;
    ck_assert_int_eq(opt_step(&o, g, 1e-3, 1, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "gradient of p2: expected f32 [1001] on cuda:0, got f32 "
                         "[1001] on the CPU"), "%s", err.msg);
    o.refs[2].grad.device = DEV;
    TU_OK(opt_step(&o, g, 1e-3, 1, &err), err);
    opt_side_free(&o);
    free(p0), free(g);

    /* standard residual: t tagged as host memory */
    res_case rc;
    memset(&rc, 0, sizeof rc);
    rc.B = 1, rc.T = 2, rc.d = 4, rc.n = 8, rc.dtype = K3RT_F32;
    res_side_init(&rc.dev, &rc, K3RT_F32, DEV);
    double host[8] = {0};
    k3rt_residual_args ra = res_args(&rc, &rc.dev, 0, host);
    ra.t.device = K3RT_DEVICE_CPU;
    ck_assert_int_eq(rig_residual(&rc.dev.m, RIG_BEGIN, &ra, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "begin: t: expected f32 [1, 2, 4] on cuda:0, got f32 "
                         "[1, 2, 4] on the CPU"), "%s", err.msg);
    rig_destroy(&rc.dev.m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dense_plugins_cuda");
    TCase *t = tcase_create("cuda");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, dense_glu_swiglu_vs_cpu);
    tcase_add_test(t, dense_glu_situ_vs_cpu);
    tcase_add_test(t, standard_residual_vs_cpu);
    tcase_add_test(t, adamw_vs_cpu_and_state_round_trip);
    tcase_add_test(t, host_tensors_refused_on_device);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    H = tu_cpu_stream(2);
    int rc = tu_run_gpu_suite(suite, &G);
    k3rt_stream_destroy(H);
    return rc;
}
