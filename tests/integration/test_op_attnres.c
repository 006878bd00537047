/* `k3rt op block_attnres`: one mixing op from a safetensors file and back (DESIGN.md, "k3rt
 * op"): sources.{j}, partial, dy and parameters by their model names in; y, grad.sources.{j},
 * grad.partial, grad.<param>, every parameter and stats.depth_weights out. Checked against the
 * direct op and its central differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/attnres_ref.h"
#include "testutil/testutil.h"
#include "train/safetensors.h"

enum { B = 2, T = 3, D = 8, NE = B * T * D, NS = 3, SUB = 3 };

#define QUERY "layers.1.residual.ffn.query"
#define GAIN "layers.1.residual.ffn.key_norm"

typedef struct op_input {
    double src[NS + 1][NE];  /* the three sources, then the partial */
    double dy[NE], w[D], g[D];
} op_input;

static void make_input(op_input *in)
{
    for (int j = 0; j <= NS; j++)
        tu_randn(in->src[j], NE, 1.0 + 0.5 * j, 100 + (uint64_t)j);
    tu_randn(in->dy, NE, 1.0, 110);
    tu_randn(in->w, D, 0.7, 111);
    tu_randn(in->g, D, 0.3, 112);
    for (int k = 0; k < D; k++)
        in->g[k] += 1;
}

static st_entry entry(const char *name, int dtype, const void *data, int ndim)
{
    st_entry e;
    memset(&e, 0, sizeof e);
    e.name = name;
    e.dtype = dtype;
    e.ndim = ndim;
    if (ndim == 3)
        e.shape[0] = B, e.shape[1] = T, e.shape[2] = D;
    else
        e.shape[0] = D;
    e.data = data;
    return e;
}

/* L = sum(y * dy) of the direct op over the four sources. */
static double loss(const op_input *in)
{
    const double *v[NS + 1] = {in->src[0], in->src[1], in->src[2], in->src[3]};
    double y[NE], l = 0;
    attnres_ref(NS + 1, v, in->w, in->g, 1e-5, B * T, D, y, NULL);
    for (int i = 0; i < NE; i++)
        l += y[i] * in->dy[i];
    return l;
}

/* Five-point central difference of loss() in x[i]. */
static double numeric(op_input *in, double *x, int i)
{
    const double h = 1e-3;
    double keep = x[i], f[4];
    static const double at[4] = {-2, -1, 1, 2};
    for (int k = 0; k < 4; k++) {
        x[i] = keep + at[k] * h;
        f[k] = loss(in);
    }
    x[i] = keep;
    return (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h);
}

static const double *tensor(const st_file *f, const char *name, int dtype, int64_t n)
{
    const st_entry *e = st_find(f, name);
    ck_assert_msg(e != NULL, "output has no %s", name);
    int64_t got = 1;
    for (int i = 0; i < e->ndim; i++)
        got *= e->shape[i];
    ck_assert_msg(e->dtype == dtype && got == n, "%s: dtype %d, %lld elements", name, e->dtype,
                  (long long)got);
    return e->data;
}

static double worst_rel(const double *want, const double *got, int64_t n, double floor)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++)
        w = fmax(w, fabs(want[i] - got[i]) / fmax(fabs(want[i]), floor));
    return w;
}

static void run_op(const char *dir, const char *extra)
{
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s op block_attnres --config '{\"block_layers\": 1}' --in %s/in"
             ".safetensors --out %s/out.safetensors --layers 3 --sublayer %d %s", tu_k3rt_bin(),
             dir, dir, SUB, extra);
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "k3rt op failed (%d): %s", rc, out);
    free(out);
}

START_TEST(forward_backward_round_trip)
{
    k3rt_error err = {0};
    char dir[512], path[1024];
    tu_tmpdir(dir, sizeof dir);
    static op_input in;
    make_input(&in);
    st_entry e[8];
    char names[NS][32];
    for (int j = 0; j < NS; j++) {
        snprintf(names[j], sizeof names[j], "sources.%d", j);
        e[j] = entry(names[j], K3RT_F64, in.src[j], 3);
    }
    e[NS] = entry("partial", K3RT_F64, in.src[NS], 3);
    e[NS + 1] = entry("dy", K3RT_F64, in.dy, 3);
    e[NS + 2] = entry(QUERY, K3RT_F64, in.w, 1);
    e[NS + 3] = entry(GAIN, K3RT_F64, in.g, 1);
    snprintf(path, sizeof path, "%s/in.safetensors", dir);
    TU_OK(st_write(path, e, NS + 4, NULL, &err), err);
    run_op(dir, "");

    st_file *f;
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    TU_OK(st_open(path, &f, &err), err);
    const double *v[NS + 1] = {in.src[0], in.src[1], in.src[2], in.src[3]};
    double y[NE], alpha[B * T * (NS + 1)];
    attnres_ref(NS + 1, v, in.w, in.g, 1e-5, B * T, D, y, alpha);
    double e_y = worst_rel(y, tensor(f, "y", K3RT_F64, NE), NE, 1e-3);
    /* every source and the partial, then the query and the gain, against differences */
    double e_grad = 0;
    char name[64];
    for (int j = 0; j <= NS; j++) {
        if (j < NS)
            snprintf(name, sizeof name, "grad.sources.%d", j);
        else
            snprintf(name, sizeof name, "grad.partial");
        const double *g = tensor(f, name, K3RT_F64, NE);
        double num[NE];
        for (int i = 0; i < NE; i++)
            num[i] = numeric(&in, in.src[j], i);
        e_grad = fmax(e_grad, worst_rel(num, g, NE, 1e-3));
    }
    double nw[D], ng[D];
    for (int k = 0; k < D; k++) {
        nw[k] = numeric(&in, in.w, k);
        ng[k] = numeric(&in, in.g, k);
    }
    e_grad = fmax(e_grad, worst_rel(nw, tensor(f, "grad." QUERY, K3RT_F64, D), D, 1e-3));
    e_grad = fmax(e_grad, worst_rel(ng, tensor(f, "grad." GAIN, K3RT_F64, D), D, 1e-3));
    printf("k3rt op block_attnres: y %.2e, gradients %.2e (worst relative)\n", e_y, e_grad);
    ck_assert(e_y < 1e-12);
    ck_assert(e_grad < 1e-8);
    /* the given parameters come back as given; the others as initialised */
    ck_assert(memcmp(tensor(f, QUERY, K3RT_F64, D), in.w, sizeof in.w) == 0);
    const double *q0 = tensor(f, "layers.0.residual.attn.query", K3RT_F64, D);
    const double *gout = tensor(f, "residual.out.key_norm", K3RT_F64, D);
    for (int k = 0; k < D; k++)
        ck_assert(q0[k] == 0.0 && gout[k] == 1.0);
    /* an op that did not run has zero gradients */
    const double *gq0 = tensor(f, "grad.layers.0.residual.attn.query", K3RT_F64, D);
    for (int k = 0; k < D; k++)
        ck_assert(gq0[k] == 0.0);
    /* 3 layers in blocks of 1: 7 rows (6 sublayers + output) of 4 sources; row 3 is this op */
    const st_entry *sw = st_find(f, "stats.depth_weights");
    ck_assert(sw && sw->dtype == K3RT_F32 && sw->ndim == 2 && sw->shape[0] == 7 &&
              sw->shape[1] == 4);
    const float *dw = sw->data;
    for (int i = 0; i < NS + 1; i++) {
        double mean = 0;
        for (int t = 0; t < B * T; t++)
            mean += alpha[t * (NS + 1) + i] / (B * T);
        ck_assert_msg(fabs(dw[SUB * 4 + i] - mean) < 1e-6, "source %d: %g, want %g", i,
                      dw[SUB * 4 + i], mean);
        ck_assert(dw[0 * 4 + i] == 0.0f);  /* rows of other sublayers stay empty */
    }
    st_close(f);
}
END_TEST

/* f32 inputs without a partial and without dy: the forward alone, in float. */
START_TEST(float_forward_without_partial)
{
    k3rt_error err = {0};
    char dir[512], path[1024];
    tu_tmpdir(dir, sizeof dir);
    static op_input in;
    make_input(&in);
    float src[NS][NE], w[D];
    st_entry e[NS + 1];
    char names[NS][32];
    for (int j = 0; j < NS; j++) {
        for (int i = 0; i < NE; i++)
            src[j][i] = (float)in.src[j][i];
        snprintf(names[j], sizeof names[j], "sources.%d", j);
        e[j] = entry(names[j], K3RT_F32, src[j], 3);
    }
    for (int k = 0; k < D; k++)
        w[k] = (float)in.w[k];
    e[NS] = entry(QUERY, K3RT_F32, w, 1);
    snprintf(path, sizeof path, "%s/in.safetensors", dir);
    TU_OK(st_write(path, e, NS + 1, NULL, &err), err);
    run_op(dir, "--seed 7");
    st_file *f;
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    TU_OK(st_open(path, &f, &err), err);
    double vs[NS][NE], wd[D], ones[D], y[NE];
    const double *v[NS] = {vs[0], vs[1], vs[2]};
    for (int j = 0; j < NS; j++)
        for (int i = 0; i < NE; i++)
            vs[j][i] = src[j][i];
    for (int k = 0; k < D; k++)
        wd[k] = w[k], ones[k] = 1;
    attnres_ref(NS, v, wd, ones, 1e-5, B * T, D, y, NULL);
    const st_entry *ye = st_find(f, "y");
    ck_assert(ye && ye->dtype == K3RT_F32);
    double got[NE];
    for (int i = 0; i < NE; i++)
        got[i] = ((const float *)ye->data)[i];
    double e_y = worst_rel(y, got, NE, 1e-2);
    printf("k3rt op block_attnres f32, no partial: y %.2e\n", e_y);
    ck_assert(e_y < 1e-5);
    ck_assert(st_find(f, "grad.sources.0") == NULL && st_find(f, "grad.partial") == NULL);
    st_close(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("op_attnres");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, forward_backward_round_trip);
    tcase_add_test(tc, float_forward_without_partial);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
