/* The host side of the peak-memory report (k3rt_device_memory_peak on the CPU): the counter
 * every progress record's peak_mem_bytes comes from on a CPU run. */
#include "testutil/peak_kit.h"

START_TEST(host_peak_windows)
{
    pk_check_peak(K3RT_DEVICE_CPU);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory_peak");
    TCase *tc = tcase_create("peak");
    tcase_add_test(tc, host_peak_windows);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
