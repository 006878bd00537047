/* The `local` communicator: N ranks as threads; every collective checked on every rank. */
#include <pthread.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "testutil/testutil.h"

enum { RANKS = 3, COUNT = 5 };

typedef struct job {
    k3rt_comm *c;
    int failures;
    char why[256];
} job;

#define EXPECT(j, cond)                                                         \
    do {                                                                        \
        if (!(cond) && !(j)->failures++)                                        \
            snprintf((j)->why, sizeof (j)->why, "rank %d: %s (line %d)",        \
                     k3rt_comm_rank((j)->c), #cond, __LINE__);                  \
    } while (0)

static void *rank_body(void *arg)
{
    job *j = arg;
    k3rt_comm *c = j->c;
    int r = k3rt_comm_rank(c), n = k3rt_comm_size(c);
    k3rt_error err = {0};
    float v[COUNT], sum[COUNT];
    for (int i = 0; i < COUNT; i++)
        v[i] = (float)(r + 1) * 0.1f + (float)i;
    EXPECT(j, k3rt_all_reduce(c, NULL, v, sum, COUNT, K3RT_F32, K3RT_REDUCE_SUM, &err) == 0);
    for (int i = 0; i < COUNT; i++) {
        /* summed in rank order: the same bits on every rank */
        float want = ((0.1f + (float)i) + (0.2f + (float)i)) + (0.3f + (float)i);
        EXPECT(j, sum[i] == want);
    }
    /* in place, average */
    double a[2] = {(double)r, 10.0 * r};
    EXPECT(j, k3rt_all_reduce(c, NULL, a, a, 2, K3RT_F64, K3RT_REDUCE_AVG, &err) == 0);
    EXPECT(j, a[0] == 1.0 && a[1] == 10.0);
    int64_t mx = r * 7;
    EXPECT(j, k3rt_all_reduce(c, NULL, &mx, &mx, 1, K3RT_I64, K3RT_REDUCE_MAX, &err) == 0);
    EXPECT(j, mx == 14);
    int32_t mine[2] = {r, -r}, all[2 * RANKS];
    EXPECT(j, k3rt_all_gather(c, NULL, mine, all, 2, K3RT_I32, &err) == 0);
    for (int q = 0; q < n; q++)
        EXPECT(j, all[2 * q] == q && all[2 * q + 1] == -q);
    double rs_in[RANKS * 2], rs_out[2];
    for (int i = 0; i < RANKS * 2; i++)
        rs_in[i] = i + 100.0 * r;
    EXPECT(j, k3rt_reduce_scatter(c, NULL, rs_in, rs_out, 2, K3RT_F64, K3RT_REDUCE_SUM, &err) == 0);
    EXPECT(j, rs_out[0] == 3.0 * (2 * r) + 300.0 && rs_out[1] == 3.0 * (2 * r + 1) + 300.0);
    /* all_to_all_v: rank r sends q + 1 copies of r to rank q */
    int64_t sc[RANKS], sd[RANKS], rc[RANKS], rd[RANKS], at = 0;
    int32_t sbuf[16], rbuf[16];
    for (int q = 0; q < n; q++) {
        sc[q] = q + 1;
        sd[q] = at;
        for (int k = 0; k < q + 1; k++)
            sbuf[at++] = r;
    }
    at = 0;
    for (int q = 0; q < n; q++) {
        rc[q] = r + 1;
        rd[q] = at;
        at += r + 1;
    }
    EXPECT(j, k3rt_all_to_all_v(c, NULL, sbuf, sc, sd, rbuf, rc, rd, K3RT_I32, &err) == 0);
    for (int q = 0; q < n; q++)
        for (int k = 0; k < r + 1; k++)
            EXPECT(j, rbuf[rd[q] + k] == q);
    int64_t token = r == 1 ? 4242 : 0;
    EXPECT(j, k3rt_broadcast(c, NULL, &token, 1, K3RT_I64, 1, &err) == 0);
    EXPECT(j, token == 4242);
    /* a ring of point-to-point messages */
    int32_t out = 1000 + r, in = -1;
    if (r % 2 == 0) {
        EXPECT(j, k3rt_send(c, NULL, &out, 1, K3RT_I32, (r + 1) % n, &err) == 0);
        EXPECT(j, k3rt_recv(c, NULL, &in, 1, K3RT_I32, (r + n - 1) % n, &err) == 0);
    } else {
        EXPECT(j, k3rt_recv(c, NULL, &in, 1, K3RT_I32, (r + n - 1) % n, &err) == 0);
        EXPECT(j, k3rt_send(c, NULL, &out, 1, K3RT_I32, (r + 1) % n, &err) == 0);
    }
    EXPECT(j, in == 1000 + (r + n - 1) % n);
    EXPECT(j, k3rt_barrier(c, NULL, &err) == 0);
    EXPECT(j, k3rt_send(c, NULL, &out, 1, K3RT_I32, r, &err) == K3RT_ERR_INVALID);
    return NULL;
}

START_TEST(collectives_on_every_rank)
{
    k3rt_comm **comms;
    k3rt_error err = {0};
    TU_OK(comm_local_create(RANKS, &comms, &err), err);
    ck_assert_str_eq(k3rt_comm_backend(comms[0]), "local");
    ck_assert_int_eq(k3rt_comm_size(k3rt_comm_group(comms[1], K3RT_GROUP_DP)), RANKS);
    ck_assert_int_eq(k3rt_comm_size(k3rt_comm_group(comms[1], K3RT_GROUP_EP)), 1);
    pthread_t th[RANKS];
    job jobs[RANKS];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < RANKS; r++) {
        jobs[r].c = comms[r];
        pthread_create(&th[r], NULL, rank_body, &jobs[r]);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++)
        ck_assert_msg(jobs[r].failures == 0, "%s", jobs[r].why);
    comm_local_destroy(comms, RANKS);
}
END_TEST

START_TEST(bad_sizes_are_refused)
{
    k3rt_comm **comms;
    k3rt_error err = {0};
    ck_assert_int_eq(comm_local_create(0, &comms, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(comm_local_create(1000, &comms, &err), K3RT_ERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("local");
    tcase_add_test(tc, collectives_on_every_rank);
    tcase_add_test(tc, bad_sizes_are_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
