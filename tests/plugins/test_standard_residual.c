/* standard residual: the stream protocol against a direct sum, finite differences, the op
 * mode and counts (the host's argument checks are tests/unit/test_rig.c's). */
#include "testutil/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"

enum { B = 2, T = 3, D = 8, LAYERS = 2, S = 2 * LAYERS, N = B * T * D };

static const plugin_entry *plugin(void) { return tu_plugin("standard"); }

typedef struct harness {
    rig m;  /* the instance; its saved part at B x T */
    k3rt_stream *s;
} harness;

static void harness_init(harness *h)
{
    k3rt_error err = {0};
    memset(h, 0, sizeof *h);
    h->s = tu_cpu_stream(1);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F64;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = D;
    a.n_layers = LAYERS;
    a.layer = -1;
    a.stream = h->s;
    TU_OK(rig_create(&h->m, plugin(), NULL, &a, "model.residual", &err), err);
    TU_OK(rig_alloc_shape(&h->m, B, T, 0, &err), err);
}

static void harness_free(harness *h)
{
    rig_destroy(&h->m);
    k3rt_stream_destroy(h->s);
}

static k3rt_tensor view(double *p) { return k3rt_tensor_view(p, K3RT_F64, -1, 3, B, T, D, 0); }

static k3rt_residual_args args(harness *h, int s, double *t)
{
    (void)h;
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s;
    a.t = view(t);
    a.training = 1;
    return a;
}

/* input: the sublayer's input (mix_backward), else NULL */
static void call(harness *h, rig_residual_call which, int s, double *t, double *input)
{
    k3rt_error err = {0};
    k3rt_residual_args a = args(h, s, t);
    if (input)
        a.sublayer_input = view(input);
    TU_OK(rig_residual(&h->m, which, &a, &err), err);
}

START_TEST(fd_check)
{
    k3rt_error err = {0};
    fd_options o;
    memset(&o, 0, sizeof o);
    o.batch = 2, o.seq = 5, o.d_model = 16, o.n_layers = 3, o.seed = 5, o.samples = 40;
    o.eps = 1e-5;  /* the toy tanh stack is smooth: truncation ~eps^2 is below rounding */
    fd_result r;
    TU_OK(fd_check_residual(plugin(), NULL, &o, &r, &err), err);
    printf("standard fd: %d entries, worst %.2e (%s)\n", r.n_checked, r.worst, r.worst_what);
    ck_assert_int_eq(r.n_checked, 40);  /* no parameters: the embedding's gradient */
    ck_assert_msg(r.worst < 1e-6, "%s", r.worst_what);
}
END_TEST

/* Sublayers are toys (y_s = tanh((s+1) x_s / 2)); the stream must hand each the running sum
 * embedding + y_0 + ... + y_{s-1} and return embedding + sum of all outputs; the backward
 * must hand sublayer s the sum of d out and the input gradients of the later sublayers. */
START_TEST(stream_is_a_running_sum)
{
    harness h;
    harness_init(&h);
    static double emb[N], x[S][N], y[N], out[N], ref[N];
    tu_randn(emb, N, 1.0, 1);
    memcpy(ref, emb, sizeof ref);
    call(&h, RIG_BEGIN, 0, emb, NULL);
    for (int s = 0; s < S; s++) {
        call(&h, RIG_MIX, s, x[s], NULL);
        ck_assert(memcmp(x[s], ref, sizeof ref) == 0);
        for (int i = 0; i < N; i++)
            y[i] = tanh(0.5 * (s + 1) * x[s][i]);
        call(&h, RIG_PUSH, s, y, NULL);
        for (int i = 0; i < N; i++)
            ref[i] += y[i];
    }
    call(&h, RIG_FINISH, S, out, NULL);
    ck_assert(memcmp(out, ref, sizeof out) == 0);
    double e_out = 0;
    for (int i = 0; i < N; i++)
        e_out = fmax(e_out, fabs(out[i] - emb[i]));
    ck_assert(e_out > 0.1);  /* the outputs really were added */

    double dout[N], dy[N], dx[N], demb[N], dref[N];
    tu_randn(dout, N, 1.0, 2);
    memcpy(dref, dout, sizeof dref);
    call(&h, RIG_FINISH_BACKWARD, S, dout, NULL);
    for (int s = S - 1; s >= 0; s--) {
        call(&h, RIG_PUSH_BACKWARD, s, dy, NULL);
        ck_assert(memcmp(dy, dref, sizeof dy) == 0);
        tu_randn(dx, N, 1.0, 10 + (uint64_t)s);
        call(&h, RIG_MIX_BACKWARD, s, dx, x[s]);
        for (int i = 0; i < N; i++)
            dref[i] += dx[i];
    }
    call(&h, RIG_BEGIN_BACKWARD, 0, demb, NULL);
    ck_assert(memcmp(demb, dref, sizeof demb) == 0);
    harness_free(&h);
}
END_TEST

START_TEST(op_sums_sources_and_partial)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h);
    static double src[3][N], partial[N], t[N], d_src[3][N], d_partial[N];
    k3rt_tensor sources[3], d_sources[3];
    for (int j = 0; j < 3; j++) {
        tu_randn(src[j], N, 1.0, 20 + (uint64_t)j);
        sources[j] = view(src[j]);
        d_sources[j] = view(d_src[j]);
    }
    tu_randn(partial, N, 1.0, 30);
    k3rt_residual_args a = args(&h, 3, t);
    a.sources = sources;
    a.n_sources = 3;
    a.partial = view(partial);
    TU_OK(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), err);
    for (int i = 0; i < N; i++)
        ck_assert(fabs(t[i] - (src[0][i] + src[1][i] + src[2][i] + partial[i])) < 1e-14);
    a.partial.ndim = 0;  /* no partial sum: the sources alone */
    TU_OK(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), err);
    for (int i = 0; i < N; i++)
        ck_assert(fabs(t[i] - (src[0][i] + src[1][i] + src[2][i])) < 1e-14);

    tu_randn(t, N, 1.0, 40);
    a = args(&h, 3, t);
    a.sources = sources, a.d_sources = d_sources;
    a.n_sources = 3;
    a.partial = view(partial), a.d_partial = view(d_partial);
    TU_OK(rig_residual(&h.m, RIG_OP_BACKWARD, &a, &err), err);
    for (int j = 0; j < 3; j++)
        ck_assert(memcmp(d_src[j], t, sizeof t) == 0);
    ck_assert(memcmp(d_partial, t, sizeof t) == 0);
    harness_free(&h);
}
END_TEST

START_TEST(counts)
{
    harness h;
    harness_init(&h);
    k3rt_error err = {0};
    ck_assert_int_eq(rig_n_params(&h.m), 0);
    ck_assert_int_eq(h.m.mem.saved_bytes, 2 * N * (int64_t)sizeof(double));
    ck_assert_int_eq(h.m.mem.workspace_bytes, 0);
    k3rt_flops f;
    TU_OK(rig_flops(&h.m, B, T, &f, &err), err);
    ck_assert(f.forward == (double)S * N && f.backward == (double)S * N);
    harness_free(&h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("standard_residual");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, fd_check);
    tcase_add_test(tc, stream_is_a_running_sum);
    tcase_add_test(tc, op_sums_sources_and_partial);
    tcase_add_test(tc, counts);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
