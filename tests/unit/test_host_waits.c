/* k3rt_host_wait_count, what `k3rt train --profile` shows as host waits per step: one for every
 * k3rt_stream_sync (on the CPU too, where it waits nowhere), none for a host-to-host copy or
 * a memset. The copies from a CUDA device into host memory it also counts need a GPU. */
#include <k3rt/host.h>

#include "testutil/testutil.h"

START_TEST(syncs_count_host_copies_do_not)
{
    k3rt_error err = {0};
    k3rt_stream *s = NULL;
    TU_OK(k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &s, &err), err);
    int64_t w0 = k3rt_host_wait_count();
    TU_OK(k3rt_stream_sync(s, &err), err);
    TU_OK(k3rt_stream_sync(s, &err), err);
    ck_assert_int_eq(k3rt_host_wait_count() - w0, 2);

    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    TU_OK(k3rt_memcpy(s, b, K3RT_DEVICE_CPU, a, K3RT_DEVICE_CPU, sizeof a, &err), err);
    TU_OK(k3rt_memset(s, a, K3RT_DEVICE_CPU, 0, sizeof a, &err), err);
    ck_assert_int_eq(k3rt_host_wait_count() - w0, 2);
    ck_assert(b[3] == 4.0f && a[3] == 0.0f);

    TU_OK(k3rt_stream_sync(NULL, &err), err);  /* no stream: still a place a run waits */
    ck_assert_int_eq(k3rt_host_wait_count() - w0, 3);
    k3rt_stream_destroy(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("host_waits");
    TCase *tc = tcase_create("count");
    tcase_add_test(tc, syncs_count_host_copies_do_not);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
