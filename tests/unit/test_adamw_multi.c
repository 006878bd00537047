/* k3rt_adamw_step_multi on the CPU: the same bits as k3rt_adamw_step per tensor (each tensor
 * with its own decay, empty tensors skipped), NULL decays meaning none, and bad arguments
 * refused with a message naming the tensor. (The CUDA kernel is compared with the CPU in
 * tests/gpu.) */
#include "testutil/testutil.h"

#include <stdlib.h>
#include <string.h>

enum { T = 4 };
static const int64_t LEN[T] = {5, 0, 1000, 3};
static const double WD[T] = {0.1, 0.1, 0.0, 0.3};

typedef struct state {
    void *p[T], *g[T], *m[T], *v[T];
} state;

/* Parameters, gradients and moments with seeded values (empty tensors get NULL pointers). */
static void state_init(state *s, int dtype)
{
    k3rt_error err = {0};
    for (int i = 0; i < T; i++) {
        void **arrays[4] = {&s->p[i], &s->g[i], &s->m[i], &s->v[i]};
        for (int k = 0; k < 4; k++) {
            *arrays[k] = NULL;
            if (!LEN[i])
                continue;
            double *tmp = malloc((size_t)LEN[i] * sizeof(double));
            tu_randn(tmp, LEN[i], 1.0, 10 * (uint64_t)i + (uint64_t)k + 1);
            for (int64_t j = 0; k == 3 && j < LEN[i]; j++)
                tmp[j] *= tmp[j];  /* v >= 0 */
            *arrays[k] = malloc((size_t)LEN[i] * k3rt_dtype_size(dtype));
            TU_OK(k3rt_convert(*arrays[k], dtype, tmp, K3RT_F64, LEN[i], &err), err);
            free(tmp);
        }
    }
}

static void state_free(state *s)
{
    for (int i = 0; i < T; i++)
        free(s->p[i]), free(s->g[i]), free(s->m[i]), free(s->v[i]);
}

static int same(const state *a, const state *b, int dtype)
{
    for (int i = 0; i < T; i++) {
        size_t bytes = (size_t)LEN[i] * k3rt_dtype_size(dtype);
        if (LEN[i] && (memcmp(a->p[i], b->p[i], bytes) || memcmp(a->m[i], b->m[i], bytes) ||
                       memcmp(a->v[i], b->v[i], bytes)))
            return 0;
    }
    return 1;
}

static int multi(k3rt_stream *s, int dtype, state *st, const double *wd, int64_t step,
                 k3rt_error *err)
{
    return k3rt_adamw_step_multi(s, dtype, T, st->p, (const void *const *)st->g, st->m, st->v,
                                 LEN, wd, 3e-3, 0.9, 0.95, 1e-8, step, err);
}

START_TEST(equals_per_tensor_steps)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    const int dtypes[2] = {K3RT_F32, K3RT_F64};
    for (int k = 0; k < 2; k++) {
        int dt = dtypes[k];
        state a, b, c;
        state_init(&a, dt), state_init(&b, dt), state_init(&c, dt);
        for (int64_t step = 1; step <= 3; step++) {
            TU_OK(multi(s, dt, &a, WD, step, &err), err);
            for (int i = 0; i < T; i++)
                TU_OK(k3rt_adamw_step(s, dt, b.p[i], b.g[i], b.m[i], b.v[i], LEN[i], 3e-3, 0.9,
                                      0.95, 1e-8, WD[i], step, &err), err);
        }
        ck_assert_msg(same(&a, &b, dt), "%s: multi-tensor step differs from per-tensor steps",
                      k3rt_dtype_name(dt));
        /* NULL decays mean none on any tensor, and they matter: one step without them lands
         * elsewhere than one with them. */
        state d, e;
        state_init(&d, dt), state_init(&e, dt);
        TU_OK(multi(s, dt, &c, NULL, 1, &err), err);
        TU_OK(multi(s, dt, &e, WD, 1, &err), err);
        ck_assert(!same(&c, &e, dt));
        for (int i = 0; i < T; i++)
            TU_OK(k3rt_adamw_step(s, dt, d.p[i], d.g[i], d.m[i], d.v[i], LEN[i], 3e-3, 0.9,
                                  0.95, 1e-8, 0.0, 1, &err), err);
        ck_assert(same(&c, &d, dt));
        state_free(&e);
        state_free(&a), state_free(&b), state_free(&c), state_free(&d);
    }
    k3rt_stream_destroy(s);
}
END_TEST

START_TEST(bad_arguments_refused)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    state a;
    state_init(&a, K3RT_F32);
    ck_assert_int_eq(multi(s, K3RT_F32, &a, WD, 0, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "step must be >= 1, got 0"), "%s", err.msg);
    ck_assert_int_eq(k3rt_adamw_step_multi(s, K3RT_F32, 2, NULL, NULL, NULL, NULL, NULL, NULL,
                                           1e-3, 0.9, 0.95, 1e-8, 1, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "2 tensors without the pointer and length arrays"), "%s",
                  err.msg);
    void *keep = a.m[3];
    a.m[3] = NULL;
    ck_assert_int_eq(multi(s, K3RT_F32, &a, WD, 1, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "tensor 3 of 3 elements has a NULL m pointer"), "%s", err.msg);
    a.m[3] = keep;
    const int64_t neg[T] = {5, -1, 1000, 3};
    ck_assert_int_eq(k3rt_adamw_step_multi(s, K3RT_F32, T, a.p, (const void *const *)a.g, a.m,
                                           a.v, neg, WD, 1e-3, 0.9, 0.95, 1e-8, 1, &err),
                     K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "tensor 1 has negative length -1"), "%s", err.msg);
    ck_assert_int_eq(multi(s, K3RT_BF16, &a, WD, 1, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "bf16"), "%s", err.msg);
    /* No tensors at all: nothing to do. */
    TU_OK(k3rt_adamw_step_multi(s, K3RT_F32, 0, NULL, NULL, NULL, NULL, NULL, NULL, 1e-3, 0.9,
                                0.95, 1e-8, 1, &err), err);
    state_free(&a);
    k3rt_stream_destroy(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adamw_multi");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, equals_per_tensor_steps);
    tcase_add_test(tc, bad_arguments_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
