/* Shared ops: every backward against double-precision central differences, forwards against
 * direct formulas, float against double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

static k3rt_stream *S;

/* L = sum(out * w) for a fixed random w; numeric dL/dx[i] by central differences. */
typedef void (*fwd_fn)(const double *x, double *out, void *ctx);

static double loss_of(fwd_fn f, const double *x, double *out, int64_t nout, const double *w,
                      void *ctx)
{
    f(x, out, ctx);
    double s = 0;
    for (int64_t i = 0; i < nout; i++)
        s += out[i] * w[i];
    return s;
}

/* Worst relative error between analytic grad and numeric over all entries of x. */
static double fd_worst(fwd_fn f, double *x, int64_t n, int64_t nout, const double *w,
                       const double *grad, void *ctx)
{
    double *out = malloc((size_t)nout * sizeof *out), worst = 0, eps = 1e-5, scale = 1e-12;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(grad[i]));
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + eps;
        double lp = loss_of(f, x, out, nout, w, ctx);
        x[i] = keep - eps;
        double lm = loss_of(f, x, out, nout, w, ctx);
        x[i] = keep;
        double num = (lp - lm) / (2 * eps);
        double rel = fabs(num - grad[i]) / fmax(fmax(fabs(num), fabs(grad[i])), 1e-3 * scale);
        worst = fmax(worst, rel);
    }
    free(out);
    return worst;
}

enum { N = 5, D = 7, V = 11 };

/* ---- rmsnorm --------------------------------------------------------------------------------- */
typedef struct { const double *gain; double *rstd; int which; double *xg; } norm_ctx;

static void norm_fwd(const double *x, double *y, void *vc)
{
    norm_ctx *c = vc;
    k3rt_error err;
    /* which == 0: x is the input; which == 1: x is the gain. */
    if (c->which == 0)
        k3rt_rmsnorm_fwd(S, K3RT_F64, x, c->gain, y, c->rstd, N, D, 1e-5, &err);
    else
        k3rt_rmsnorm_fwd(S, K3RT_F64, c->xg, x, y, c->rstd, N, D, 1e-5, &err);
}

START_TEST(rmsnorm_backward)
{
    double x[N * D], g[D], dy[N * D], y[N * D], rstd[N], dx[N * D], dg[D] = {0};
    tu_randn(x, N * D, 1.0, 1);
    tu_randn(g, D, 1.0, 2);
    tu_randn(dy, N * D, 1.0, 3);
    k3rt_error err = {0};
    TU_OK(k3rt_rmsnorm_fwd(S, K3RT_F64, x, g, y, rstd, N, D, 1e-5, &err), err);
    /* y = x / sqrt(mean(x^2) + eps) * g, directly */
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++)
            ss += x[i * D + j] * x[i * D + j];
        for (int j = 0; j < D; j++)
            ck_assert_double_eq_tol(y[i * D + j], x[i * D + j] / sqrt(ss / D + 1e-5) * g[j], 1e-12);
    }
    TU_OK(k3rt_rmsnorm_bwd(S, K3RT_F64, x, g, rstd, dy, dx, dg, N, D, 0, &err), err);
    norm_ctx c = {g, rstd, 0, x};
    ck_assert_double_lt(fd_worst(norm_fwd, x, N * D, N * D, dy, dx, &c), 1e-6);
    c.which = 1;
    ck_assert_double_lt(fd_worst(norm_fwd, g, D, N * D, dy, dg, &c), 1e-6);
}
END_TEST

/* ---- embedding ------------------------------------------------------------------------------- */
static const int32_t TOK[N] = {3, 0, 3, 10, 7};

static void emb_fwd(const double *table, double *out, void *ctx)
{
    (void)ctx;
    k3rt_error err;
    k3rt_embedding_fwd(S, K3RT_F64, table, TOK, out, N, V, D, &err);
}

START_TEST(embedding_backward_and_bounds)
{
    double table[V * D], dout[N * D], dt[V * D] = {0}, out[N * D];
    tu_randn(table, V * D, 1.0, 4);
    tu_randn(dout, N * D, 1.0, 5);
    k3rt_error err = {0};
    TU_OK(k3rt_embedding_fwd(S, K3RT_F64, table, TOK, out, N, V, D, &err), err);
    ck_assert_double_eq(out[3 * D + 2], table[10 * D + 2]);
    TU_OK(k3rt_embedding_bwd(S, K3RT_F64, TOK, dout, dt, N, V, D, &err), err);
    ck_assert_double_lt(fd_worst(emb_fwd, table, V * D, N * D, dout, dt, NULL), 1e-6);
    int32_t bad[N] = {1, 2, 11, 0, 0};
    ck_assert_int_eq(k3rt_embedding_fwd(S, K3RT_F64, table, bad, out, N, V, D, &err),
                     K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "token 11 at position 2"), "%s", err.msg);
}
END_TEST

/* ---- cross-entropy --------------------------------------------------------------------------- */
static const int32_t TGT[N] = {1, 10, -1, 0, 4};

static void xent_fwd(const double *logits, double *loss, void *ctx)
{
    (void)ctx;
    k3rt_error err;
    double lse[N];
    k3rt_xent_fwd(S, K3RT_F64, logits, TGT, loss, lse, N, V, &err);
}

START_TEST(xent_backward_and_ignore)
{
    double logits[N * V], loss[N], lse[N], dl[N * V], w[N];
    tu_randn(logits, N * V, 2.0, 6);
    for (int i = 0; i < N; i++)
        w[i] = 0.25;  /* the scale the backward applies */
    k3rt_error err = {0};
    TU_OK(k3rt_xent_fwd(S, K3RT_F64, logits, TGT, loss, lse, N, V, &err), err);
    double s = 0;
    for (int j = 0; j < V; j++)
        s += exp(logits[j]);
    ck_assert_double_eq_tol(loss[0], log(s) - logits[1], 1e-12);
    ck_assert_double_eq(loss[2], 0.0);
    TU_OK(k3rt_xent_bwd(S, K3RT_F64, logits, TGT, lse, 0.25, dl, N, V, &err), err);
    for (int j = 0; j < V; j++)
        ck_assert_double_eq(dl[2 * V + j], 0.0);
    ck_assert_double_lt(fd_worst(xent_fwd, logits, N * V, N, w, dl, NULL), 1e-6);
}
END_TEST

/* ---- activations and GLUs -------------------------------------------------------------------- */
typedef struct { int act; int glu; int part; const double *other; } act_ctx;

static void act_fwd(const double *x, double *y, void *vc)
{
    act_ctx *c = vc;
    k3rt_error err;
    if (c->glu < 0)
        k3rt_act_fwd(S, K3RT_F64, c->act, x, y, N * D, &err);
    else if (c->part == 0)
        k3rt_glu_fwd(S, K3RT_F64, c->glu, x, c->other, y, N * D, 4.0, 25.0, &err);
    else
        k3rt_glu_fwd(S, K3RT_F64, c->glu, c->other, x, y, N * D, 4.0, 25.0, &err);
}

START_TEST(activation_backwards)
{
    double x[N * D], dy[N * D], dx[N * D];
    tu_randn(x, N * D, 3.0, 7);
    tu_randn(dy, N * D, 1.0, 8);
    k3rt_error err = {0};
    for (int act = K3RT_ACT_SILU; act <= K3RT_ACT_TANH; act++) {
        TU_OK(k3rt_act_bwd(S, K3RT_F64, act, x, dy, dx, N * D, 0, &err), err);
        act_ctx c = {act, -1, 0, NULL};
        double w = fd_worst(act_fwd, x, N * D, N * D, dy, dx, &c);
        ck_assert_msg(w < 1e-6, "activation %d: worst relative error %g", act, w);
    }
    double big = 800, y;
    TU_OK(k3rt_act_fwd(S, K3RT_F64, K3RT_ACT_SOFTPLUS, &big, &y, 1, &err), err);
    ck_assert_double_eq_tol(y, 800.0, 1e-9);
}
END_TEST

START_TEST(glu_backwards_and_situ_bound)
{
    double g[N * D], u[N * D], dy[N * D], dg[N * D], du[N * D], out[N * D];
    tu_randn(g, N * D, 4.0, 9);
    tu_randn(u, N * D, 30.0, 10);
    tu_randn(dy, N * D, 1.0, 11);
    k3rt_error err = {0};
    for (int glu = K3RT_GLU_SWIGLU; glu <= K3RT_GLU_SIGMOID; glu++) {
        TU_OK(k3rt_glu_bwd(S, K3RT_F64, glu, g, u, dy, dg, du, N * D, 4.0, 25.0, &err), err);
        act_ctx cg = {0, glu, 0, u}, cu = {0, glu, 1, g};
        ck_assert_double_lt(fd_worst(act_fwd, g, N * D, N * D, dy, dg, &cg), 1e-6);
        ck_assert_double_lt(fd_worst(act_fwd, u, N * D, N * D, dy, du, &cu), 1e-6);
    }
    /* the sigmoid gate: out = sigmoid(g) u, and dup may be dout itself */
    TU_OK(k3rt_glu_fwd(S, K3RT_F64, K3RT_GLU_SIGMOID, g, u, out, N * D, 0, 0, &err), err);
    ck_assert_double_eq_tol(out[5], u[5] / (1 + exp(-g[5])), 1e-12);
    double d_in_place[N * D];
    memcpy(d_in_place, dy, sizeof dy);
    TU_OK(k3rt_glu_bwd(S, K3RT_F64, K3RT_GLU_SIGMOID, g, u, d_in_place, dg, d_in_place, N * D, 0,
                       0, &err), err);
    ck_assert_mem_eq(d_in_place, du, sizeof du);
    /* SiTU: a(g) = 4 tanh(g/4) sigmoid(g), b(u) = 25 tanh(u/25); |out| <= 100 (ERRATA) */
    double gg[3] = {2.0, -1.219, 1e4}, uu[3] = {1.0, 1.0, 1e4};
    TU_OK(k3rt_glu_fwd(S, K3RT_F64, K3RT_GLU_SITU, gg, uu, out, 3, 4.0, 25.0, &err), err);
    ck_assert_double_eq_tol(out[0], 4 * tanh(0.5) / (1 + exp(-2.0)) * 25 * tanh(1.0 / 25), 1e-12);
    ck_assert_double_eq_tol(out[1] / (25 * tanh(1.0 / 25)), -0.2698, 1e-4);  /* the minimum */
    ck_assert_double_le(fabs(out[2]), 100.0);
}
END_TEST

/* ---- linear and grouped linear ---------------------------------------------------------------- */
enum { IN = 6, OUT = 4 };
typedef struct { double *x, *w, *b; int which; } lin_ctx;

static void lin_fwd(const double *v, double *y, void *vc)
{
    lin_ctx *c = vc;
    k3rt_error err;
    k3rt_linear_fwd(S, K3RT_F64, c->which == 0 ? v : c->x, c->which == 1 ? v : c->w,
                    c->which == 2 ? v : c->b, y, N, IN, OUT, &err);
}

START_TEST(linear_backward)
{
    double x[N * IN], w[OUT * IN], b[OUT], dy[N * OUT], y[N * OUT];
    double dx[N * IN], dw[OUT * IN] = {0}, db[OUT] = {0};
    tu_randn(x, N * IN, 1.0, 12);
    tu_randn(w, OUT * IN, 1.0, 13);
    tu_randn(b, OUT, 1.0, 14);
    tu_randn(dy, N * OUT, 1.0, 15);
    k3rt_error err = {0};
    TU_OK(k3rt_linear_fwd(S, K3RT_F64, x, w, b, y, N, IN, OUT, &err), err);
    double direct = b[2];
    for (int k = 0; k < IN; k++)
        direct += x[3 * IN + k] * w[2 * IN + k];
    ck_assert_double_eq_tol(y[3 * OUT + 2], direct, 1e-12);
    TU_OK(k3rt_linear_bwd(S, K3RT_F64, x, w, dy, dx, dw, db, N, IN, OUT, 0, &err), err);
    lin_ctx c = {x, w, b, 0};
    ck_assert_double_lt(fd_worst(lin_fwd, x, N * IN, N * OUT, dy, dx, &c), 1e-6);
    c.which = 1;
    ck_assert_double_lt(fd_worst(lin_fwd, w, OUT * IN, N * OUT, dy, dw, &c), 1e-6);
    c.which = 2;
    ck_assert_double_lt(fd_worst(lin_fwd, b, OUT, N * OUT, dy, db, &c), 1e-6);
}
END_TEST

static const int64_t OFFS[4] = {0, 2, 2, 5};  /* three groups, one of them empty */
typedef struct { double *x, *w; int which; } grp_ctx;

static void grp_fwd(const double *v, double *y, void *vc)
{
    grp_ctx *c = vc;
    k3rt_error err;
    k3rt_grouped_linear_fwd(S, K3RT_F64, c->which == 0 ? v : c->x, c->which == 1 ? v : c->w, y,
                            OFFS, 3, IN, OUT, &err);
}

START_TEST(grouped_linear_backward)
{
    double x[N * IN], w[3 * OUT * IN], dy[N * OUT], dx[N * IN], dw[3 * OUT * IN] = {0};
    tu_randn(x, N * IN, 1.0, 16);
    tu_randn(w, 3 * OUT * IN, 1.0, 17);
    tu_randn(dy, N * OUT, 1.0, 18);
    k3rt_error err = {0};
    TU_OK(k3rt_grouped_linear_bwd(S, K3RT_F64, x, w, dy, dx, dw, OFFS, 3, IN, OUT, 0, &err), err);
    grp_ctx c = {x, w, 0};
    ck_assert_double_lt(fd_worst(grp_fwd, x, N * IN, N * OUT, dy, dx, &c), 1e-6);
    c.which = 1;
    ck_assert_double_lt(fd_worst(grp_fwd, w, 3 * OUT * IN, N * OUT, dy, dw, &c), 1e-6);
    int64_t bad[4] = {0, 3, 2, 5};
    ck_assert_int_eq(k3rt_grouped_linear_fwd(S, K3RT_F64, x, w, dy, bad, 3, IN, OUT, &err),
                     K3RT_ERR_INVALID);
}
END_TEST

START_TEST(grouped_linear_int32_offsets_match)
{
    /* The _dev forms on a CPU stream: int32 and int64 offsets, the same numbers as the host
     * forms; an end past `rows`, or offsets of another dtype, are refused. */
    double x[N * IN], w[3 * OUT * IN], dy[N * OUT], y[N * OUT], y32[N * OUT];
    double dx[N * IN], dx32[N * IN], dw[3 * OUT * IN] = {0}, dw32[3 * OUT * IN] = {0};
    tu_randn(x, N * IN, 1.0, 19);
    tu_randn(w, 3 * OUT * IN, 1.0, 20);
    tu_randn(dy, N * OUT, 1.0, 21);
    const int32_t offs32[4] = {0, 2, 2, 5};
    k3rt_error err = {0};
    TU_OK(k3rt_grouped_linear_fwd(S, K3RT_F64, x, w, y, OFFS, 3, IN, OUT, &err), err);
    TU_OK(k3rt_grouped_linear_fwd_dev(S, K3RT_F64, x, w, y32, offs32, K3RT_I32, 3, N, IN, OUT,
                                      &err), err);
    TU_OK(k3rt_grouped_linear_bwd(S, K3RT_F64, x, w, dy, dx, dw, OFFS, 3, IN, OUT, 0, &err), err);
    TU_OK(k3rt_grouped_linear_bwd_dev(S, K3RT_F64, x, w, dy, dx32, dw32, offs32, K3RT_I32, 3, N,
                                      IN, OUT, 0, &err), err);
    ck_assert_mem_eq(y, y32, sizeof y);
    ck_assert_mem_eq(dx, dx32, sizeof dx);
    ck_assert_mem_eq(dw, dw32, sizeof dw);
    memset(y32, 0, sizeof y32);
    TU_OK(k3rt_grouped_linear_fwd_dev(S, K3RT_F64, x, w, y32, OFFS, K3RT_I64, 3, N, IN, OUT,
                                      &err), err);
    ck_assert_mem_eq(y, y32, sizeof y);
    ck_assert_int_eq(k3rt_grouped_linear_fwd_dev(S, K3RT_F64, x, w, y32, offs32, K3RT_I32, 3, 4,
                                                 IN, OUT, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "rows = 4") != NULL, "message: %s", err.msg);
    ck_assert_int_eq(k3rt_grouped_linear_fwd_dev(S, K3RT_F64, x, w, y32, offs32, K3RT_F32, 3, N,
                                                 IN, OUT, &err), K3RT_ERR_INVALID);
}
END_TEST

START_TEST(grouped_linear_dw_overwrites_or_accumulates)
{
    /* dW alone: accumulate = 0 overwrites a gradient full of garbage (the empty group's block
     * comes out zero), accumulate = 1 adds onto it, both as the full backward into zeros. */
    double x[N * IN], w[3 * OUT * IN], dy[N * OUT], dw[3 * OUT * IN] = {0}, got[3 * OUT * IN];
    tu_randn(x, N * IN, 1.0, 22);
    tu_randn(w, 3 * OUT * IN, 1.0, 23);
    tu_randn(dy, N * OUT, 1.0, 24);
    const int32_t offs32[4] = {0, 2, 2, 5};
    k3rt_error err = {0};
    TU_OK(k3rt_grouped_linear_bwd(S, K3RT_F64, x, w, dy, NULL, dw, OFFS, 3, IN, OUT, 0, &err),
          err);
    for (int i = 0; i < 3 * OUT * IN; i++)
        got[i] = 1e300;
    TU_OK(k3rt_grouped_linear_dw_dev(S, K3RT_F64, x, dy, got, offs32, K3RT_I32, 3, N, IN, OUT, 0,
                                     &err), err);
    ck_assert_mem_eq(dw, got, sizeof dw);
    ck_assert(got[OUT * IN] == 0.0 && got[2 * OUT * IN - 1] == 0.0);
    TU_OK(k3rt_grouped_linear_dw_dev(S, K3RT_F64, x, dy, got, OFFS, K3RT_I64, 3, N, IN, OUT, 1,
                                     &err), err);
    for (int i = 0; i < 3 * OUT * IN; i++)
        ck_assert_double_eq_tol(got[i], 2 * dw[i], 1e-12);
}
END_TEST

/* ---- float against double; determinism across thread counts ---------------------------------- */
START_TEST(float_matches_double_and_threads_do_not_change_bits)
{
    enum { R = 300, C = 64 };
    double *x = malloc(R * C * sizeof(double)), *dy = malloc(R * C * sizeof(double));
    double *dx = malloc(R * C * sizeof(double)), g[C], dg[C] = {0}, rstd[R];
    float *xf = malloc(R * C * sizeof(float)), *dyf = malloc(R * C * sizeof(float));
    float *dxf = malloc(R * C * sizeof(float)), gf[C], dgf1[C] = {0}, dgf2[C] = {0}, rf[R];
    tu_randn(x, R * C, 1.0, 19);
    tu_randn(dy, R * C, 1.0, 20);
    tu_randn(g, C, 1.0, 21);
    for (int i = 0; i < R * C; i++)
        xf[i] = (float)x[i], dyf[i] = (float)dy[i];
    for (int j = 0; j < C; j++)
        gf[j] = (float)g[j];
    k3rt_error err = {0};
    TU_OK(k3rt_rmsnorm_fwd(S, K3RT_F64, x, g, dx, rstd, R, C, 1e-5, &err), err);
    TU_OK(k3rt_rmsnorm_bwd(S, K3RT_F64, x, g, rstd, dy, dx, dg, R, C, 0, &err), err);
    k3rt_stream *one = tu_cpu_stream(1), *two = tu_cpu_stream(2);
    TU_OK(k3rt_rmsnorm_fwd(one, K3RT_F32, xf, gf, dxf, rf, R, C, 1e-5, &err), err);
    TU_OK(k3rt_rmsnorm_bwd(one, K3RT_F32, xf, gf, rf, dyf, dxf, dgf1, R, C, 0, &err), err);
    TU_OK(k3rt_rmsnorm_bwd(two, K3RT_F32, xf, gf, rf, dyf, dxf, dgf2, R, C, 0, &err), err);
    ck_assert_int_eq(memcmp(dgf1, dgf2, sizeof dgf1), 0);
    double ref[C], got[C];
    for (int j = 0; j < C; j++)
        ref[j] = dg[j], got[j] = dgf1[j];
    ck_assert_double_lt(tu_rel_rms(ref, got, C), 1e-5);
    k3rt_stream_destroy(one);
    k3rt_stream_destroy(two);
    free(x), free(dy), free(dx), free(xf), free(dyf), free(dxf);
}
END_TEST

START_TEST(gemm_split_matches_one_thread)
{
    enum { M = 300, K = 70, NN = 50 };
    float *a = malloc(M * K * sizeof(float)), *b = malloc(K * NN * sizeof(float));
    float *c1 = malloc(M * NN * sizeof(float)), *c2 = malloc(M * NN * sizeof(float));
    tu_randnf(a, M * K, 1.0, 30);
    tu_randnf(b, K * NN, 1.0, 31);
    k3rt_stream *one = tu_cpu_stream(1), *two = tu_cpu_stream(2);
    k3rt_error err = {0};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* the same logical product with A and B stored as their transposes when asked */
            TU_OK(k3rt_gemm(one, K3RT_F32, ta, tb, M, NN, K, 1.0, a, ta ? M : K, b, tb ? K : NN,
                            0.0, c1, NN, &err), err);
            TU_OK(k3rt_gemm(two, K3RT_F32, ta, tb, M, NN, K, 1.0, a, ta ? M : K, b, tb ? K : NN,
                            0.0, c2, NN, &err), err);
            double worst = 0;
            for (int i = 0; i < M * NN; i++)
                worst = fmax(worst, fabs((double)c1[i] - c2[i]) / (1 + fabs((double)c1[i])));
            ck_assert_msg(worst < 1e-5, "ta=%d tb=%d: 1 vs 2 threads differ by %g", ta, tb,
                          worst);
        }
    k3rt_stream_destroy(one);
    k3rt_stream_destroy(two);
    free(a), free(b), free(c1), free(c2);
}
END_TEST

START_TEST(dtype_conversions)
{
    ck_assert_float_eq(k3rt_bf16_to_f32(k3rt_f32_to_bf16(1.0f)), 1.0f);
    ck_assert_float_eq(k3rt_bf16_to_f32(k3rt_f32_to_bf16(3.140625f)), 3.140625f);
    /* round to nearest even: 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7 */
    ck_assert_float_eq(k3rt_bf16_to_f32(k3rt_f32_to_bf16(1.00390625f)), 1.0f);
    ck_assert_float_eq(k3rt_fp8e4m3_to_f32(k3rt_f32_to_fp8e4m3(448.0f)), 448.0f);
    ck_assert_float_eq(k3rt_fp8e4m3_to_f32(k3rt_f32_to_fp8e4m3(1e6f)), 448.0f);
    ck_assert_float_eq(k3rt_fp8e4m3_to_f32(k3rt_f32_to_fp8e4m3(-0.3125f)), -0.3125f);
    ck_assert(isnan(k3rt_fp8e4m3_to_f32(0x7f)));
    ck_assert_int_eq(k3rt_dtype_from_name("bf16"), K3RT_BF16);
    ck_assert_uint_eq(k3rt_dtype_size(K3RT_FP8_E4M3), 1);
}
END_TEST

START_TEST(adamw_step_matches_formula)
{
    double p[3] = {1.0, -2.0, 0.5}, g[3] = {0.1, -0.2, 0.3}, m[3] = {0}, v[3] = {0};
    double p0[3];
    memcpy(p0, p, sizeof p);
    k3rt_error err = {0};
    TU_OK(k3rt_adamw_step(S, K3RT_F64, p, g, m, v, 3, 0.01, 0.9, 0.95, 1e-8, 0.1, 1, &err), err);
    for (int i = 0; i < 3; i++) {
        /* step 1: mhat = g, vhat = g^2 -> update = g / (|g| + eps) */
        double want = p0[i] * (1 - 0.01 * 0.1) - 0.01 * g[i] / (fabs(g[i]) + 1e-8);
        ck_assert_double_eq_tol(p[i], want, 1e-14);
    }
    ck_assert_int_eq(k3rt_adamw_step(S, K3RT_F64, p, g, m, v, 3, 0.01, 0.9, 0.95, 1e-8, 0.1, 0,
                                     &err), K3RT_ERR_INVALID);
}
END_TEST

/* D = alpha A B + beta C with C apart equals the in-place product on a copy of C, in f64, and
 * leaves C (and D's padding) alone; beta 0 never reads C (NaN there). */
START_TEST(gemm_into_matches_in_place)
{
    enum { M = 5, K = 7, NN = 6, LD = 8, BATCH = 3, SC = M * LD + 2 };
    double a[BATCH * M * K], b[BATCH * K * NN], c[BATCH * SC], d[BATCH * SC], ref[BATCH * SC];
    k3rt_error err = {0};
    for (int beta_on = 0; beta_on < 2; beta_on++) {
        const double beta = beta_on ? -4.775 : 0.0;
        tu_randn(a, BATCH * M * K, 1.0, 40);
        tu_randn(b, BATCH * K * NN, 1.0, 41);
        tu_randn(c, BATCH * SC, 1.0, 42);
        if (!beta_on)
            for (int i = 0; i < BATCH * SC; i++)
                c[i] = NAN;
        for (int i = 0; i < BATCH * SC; i++)
            d[i] = -1.0, ref[i] = beta_on ? c[i] : -1.0;
        double c0[BATCH * SC];
        memcpy(c0, c, sizeof c);
        TU_OK(k3rt_gemm_strided_batched(S, K3RT_F64, 0, 0, M, NN, K, 2.0315, a, K, M * K, b, NN,
                                        K * NN, beta, ref, LD, SC, BATCH, &err), err);
        TU_OK(k3rt_gemm_strided_batched_into(S, K3RT_F64, 0, 0, M, NN, K, 2.0315, a, K, M * K, b,
                                             NN, K * NN, beta, c, d, LD, SC, BATCH, &err), err);
        for (int bi = 0; bi < BATCH; bi++)
            for (int i = 0; i < M; i++)
                for (int j = 0; j < LD; j++) {
                    const int at = bi * SC + i * LD + j;
                    if (j < NN)
                        ck_assert_msg(d[at] == ref[at], "beta %g: D[%d,%d,%d] = %g, in place "
                                      "%g", beta, bi, i, j, d[at], ref[at]);
                    else
                        ck_assert_msg(d[at] == -1.0, "beta %g: D's padding written", beta);
                }
        ck_assert_msg(memcmp(c0, c, sizeof c) == 0, "beta %g: C changed", beta);
    }
}
END_TEST

/* On the CPU the f32-output linear is the f32 linear, and other input dtypes are refused with
 * the op's name rather than read as f32. */
START_TEST(linear_fwd_f32_on_cpu)
{
    enum { N = 9, IN = 13, OUT = 5 };
    float x[N * IN], w[OUT * IN], y[N * OUT], ref[N * OUT];
    double xd[N * IN], wd[OUT * IN];
    k3rt_error err = {0};
    tu_randn(xd, N * IN, 1.0, 50);
    tu_randn(wd, OUT * IN, 0.3, 51);
    for (int i = 0; i < N * IN; i++)
        x[i] = (float)xd[i];
    for (int i = 0; i < OUT * IN; i++)
        w[i] = (float)wd[i];
    for (int i = 0; i < N * OUT; i++)
        y[i] = NAN;
    TU_OK(k3rt_linear_fwd(S, K3RT_F32, x, w, NULL, ref, N, IN, OUT, &err), err);
    TU_OK(k3rt_linear_fwd_f32(S, K3RT_F32, x, w, y, N, IN, OUT, &err), err);
    ck_assert(memcmp(y, ref, sizeof y) == 0);
    ck_assert_int_eq(k3rt_linear_fwd_f32(S, K3RT_BF16, x, w, y, N, IN, OUT, &err),
                     K3RT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "linear_fwd_f32") && strstr(err.msg, "bf16"), "%s", err.msg);
}
END_TEST

int main(void)
{
    S = tu_cpu_stream(2);
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_add_test(tc, rmsnorm_backward);
    tcase_add_test(tc, embedding_backward_and_bounds);
    tcase_add_test(tc, xent_backward_and_ignore);
    tcase_add_test(tc, activation_backwards);
    tcase_add_test(tc, glu_backwards_and_situ_bound);
    tcase_add_test(tc, linear_backward);
    tcase_add_test(tc, grouped_linear_backward);
    tcase_add_test(tc, grouped_linear_int32_offsets_match);
    tcase_add_test(tc, grouped_linear_dw_overwrites_or_accumulates);
    tcase_add_test(tc, float_matches_double_and_threads_do_not_change_bits);
    tcase_add_test(tc, gemm_split_matches_one_thread);
    tcase_add_test(tc, gemm_into_matches_in_place);
    tcase_add_test(tc, linear_fwd_f32_on_cpu);
    tcase_add_test(tc, dtype_conversions);
    tcase_add_test(tc, adamw_step_matches_formula);
    suite_add_tcase(s, tc);
    int rc = tu_run_suite(s);
    k3rt_stream_destroy(S);
    return rc;
}
