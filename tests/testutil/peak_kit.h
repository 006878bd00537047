/* k3rt_device_memory_peak on one device (the CPU's host counter or a CUDA allocator): the
 * peak of a window holds the most bytes in use at once, a reset starts the next window at what
 * is in use then, and frees lower what is in use, not the peak. Blocks are powers of two, which
 * the CUDA size classes hold exactly and the host allocator within a page of bookkeeping. */
#ifndef K3RT_TEST_PEAK_KIT_H
#define K3RT_TEST_PEAK_KIT_H

#include <k3rt/host.h>

#include "testutil/testutil.h"

static inline void pk_check_peak(int device)
{
    const size_t MB = (size_t)1 << 20, slack = 64 << 10;
    k3rt_error err = {0};
    k3rt_device_memory_peak(device, 1);
    size_t base = k3rt_device_memory_peak(device, 0);
    void *a = k3rt_alloc(device, 8 * MB, &err);
    ck_assert_msg(a != NULL, "%s", err.msg);
    void *b = k3rt_alloc(device, 4 * MB, &err);
    ck_assert_msg(b != NULL, "%s", err.msg);
    k3rt_free(device, b);
    k3rt_free(device, a);
    size_t peak = k3rt_device_memory_peak(device, 1);
    ck_assert_msg(peak >= base + 12 * MB && peak <= base + 12 * MB + slack,
                  "device %d: peak %zu over a base of %zu with 12 MiB held at once", device,
                  peak, base);
    /* the next window starts at what is in use: both blocks are free again */
    ck_assert_uint_eq(k3rt_device_memory_peak(device, 0), base);
    void *c = k3rt_alloc(device, 2 * MB, &err);
    ck_assert_msg(c != NULL, "%s", err.msg);
    k3rt_free(device, c);
    peak = k3rt_device_memory_peak(device, 0);
    ck_assert_msg(peak >= base + 2 * MB && peak <= base + 2 * MB + slack,
                  "device %d: peak %zu over a base of %zu with 2 MiB held", device, peak, base);
}

#endif
