/* The communicators: `local` (N ranks as threads) and `tcp` (N processes, forked here);
 * every collective checked on every rank, reductions to the bit of the rank-ordered sum;
 * a tcp rank that dies is named by the others. (The mpi backend runs the same training
 * bit for bit as local: tests/integration/dist_mpi.sh.) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm/comm_reduce.h"
#include "comm/comm_tcp.h"
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
    /* a long vector not divisible by the ranks (the sliced path of comm_reduce.c) */
    enum { LONG = 10007 };
    float *big = malloc(LONG * sizeof *big), *mine_in = malloc(LONG * sizeof *big);
    for (int i = 0; i < LONG; i++)
        mine_in[i] = big[i] = (float)((i * 37 + r * 11) % 101) / 7.0f;
    EXPECT(j, k3rt_all_reduce(c, NULL, big, big, LONG, K3RT_F32, K3RT_REDUCE_AVG, &err) == 0);
    int exact = 1;
    for (int i = 0; i < LONG; i++) {
        float want = (float)((i * 37) % 101) / 7.0f;
        for (int q = 1; q < n; q++)
            want += (float)((i * 37 + q * 11) % 101) / 7.0f;
        exact &= big[i] == want / (float)n;
    }
    EXPECT(j, exact);
    /* reduce to rank 1 in place (ZeRO-1's gradients): all_reduce's bits there, the other
     * ranks' buffers untouched */
    float *kept = malloc(LONG * sizeof *kept);
    memcpy(kept, mine_in, LONG * sizeof *kept);
    EXPECT(j, comm_det_reduce(c, mine_in, mine_in, LONG, K3RT_F32, K3RT_REDUCE_AVG, 1, &err) == 0);
    EXPECT(j, !memcmp(mine_in, r == 1 ? big : kept, LONG * sizeof *big));
    EXPECT(j, comm_det_reduce(c, mine_in, mine_in, 1, K3RT_F32, K3RT_REDUCE_SUM, n, &err) ==
                  K3RT_ERR_INVALID);
    free(big), free(mine_in), free(kept);
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

/* Forks `n` processes of a tcp job at a fresh port; each runs body(c) and exits with its
 * status; returns the children's pids. */
static void tcp_job(int n, int (*body)(k3rt_comm *c), pid_t *pids)
{
    int port = 20000 + (int)(getpid() % 20000);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            comm_world w = {"test", r, n, r, n, "127.0.0.1", port};
            comm_mesh mesh = {n, 1, 1};
            k3rt_comm *c = NULL;
            k3rt_error err = {0};
            if (comm_tcp_create(&w, &mesh, 30.0, &c, &err)) {
                fprintf(stderr, "rank %d: %s\n", r, err.msg);
                _exit(100);
            }
            int rc = body(c);
            comm_tcp_destroy(c);
            _exit(rc);
        }
    }
}

static int tcp_body(k3rt_comm *c)
{
    job j = {c, 0, ""};
    rank_body(&j);
    if (j.failures)
        fprintf(stderr, "%s\n", j.why);
    return j.failures ? 1 : 0;
}

START_TEST(tcp_collectives_on_every_process)
{
    pid_t pids[RANKS];
    tcp_job(RANKS, tcp_body, pids);
    for (int r = 0; r < RANKS; r++) {
        int st;
        ck_assert_int_eq(waitpid(pids[r], &st, 0), pids[r]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tcp rank %d failed (status %d)",
                      r, st);
    }
}
END_TEST

/* Rank 1 dies at once; rank 0's next collective fails naming it (exit 0 when it does). */
static int dies_or_names(k3rt_comm *c)
{
    if (k3rt_comm_rank(c) == 1)
        _exit(3);  /* no goodbye: the kernel closes its sockets, as after SIGKILL */
    k3rt_error err = {0};
    float v[4] = {1, 2, 3, 4};
    int rc = k3rt_all_reduce(c, NULL, v, v, 4, K3RT_F32, K3RT_REDUCE_SUM, &err);
    char want[64];
    snprintf(want, sizeof want, "rank 1 (pid ");
    if (rc == K3RT_ERR_COMM && strstr(err.msg, want) && strstr(err.msg, "all_reduce"))
        return 0;
    fprintf(stderr, "rank 0: rc %d: %s\n", rc, err.msg);
    return 1;
}

START_TEST(tcp_names_a_rank_that_died)
{
    pid_t pids[2];
    tcp_job(2, dies_or_names, pids);
    int st0, st1;
    ck_assert_int_eq(waitpid(pids[0], &st0, 0), pids[0]);
    ck_assert_int_eq(waitpid(pids[1], &st1, 0), pids[1]);
    ck_assert_msg(WIFEXITED(st0) && WEXITSTATUS(st0) == 0, "rank 0 did not name rank 1");
}
END_TEST

START_TEST(tcp_refuses_a_world_that_is_not_the_plan)
{
    comm_world w = {"test", 0, 2, 0, 2, "127.0.0.1", 29999};
    comm_mesh mesh = {3, 1, 1};
    k3rt_comm *c = NULL;
    k3rt_error err = {0};
    ck_assert_int_eq(comm_tcp_create(&w, &mesh, 1.0, &c, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "the job has 2 processes"), "%s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("local");
    tcase_add_test(tc, collectives_on_every_rank);
    tcase_add_test(tc, bad_sizes_are_refused);
    suite_add_tcase(s, tc);
    TCase *tcp = tcase_create("tcp");
    tcase_add_test(tcp, tcp_collectives_on_every_process);
    tcase_add_test(tcp, tcp_names_a_rank_that_died);
    tcase_add_test(tcp, tcp_refuses_a_world_that_is_not_the_plan);
    suite_add_tcase(s, tcp);
    return tu_run_suite(s);
}
