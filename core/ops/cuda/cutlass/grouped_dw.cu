// The grouped weight gradient (grouped_dw.cuh): the schedule for the call, the cooperative
// instantiation, and the zeroing of empty groups when it overwrites.
//
// Schedule: dW's K is a group's own rows, so a tile's mainloop is n_g / 64 k-steps while its
// epilogue reads and writes the 128x256 (or 128x128) fp32 block of dW_g whatever n_g is. Where
// the mean group is short (K3: 512 rows an expert) the epilogue is as long as the math, which
// pingpong can hide (one warp group's epilogue under the other's mainloop); where it is long
// the cooperative 128x256 tile moves fewer operand bytes per flop. The host knows only the
// mean (the counts stay on the device), so the choice is by rows / groups. Not yet timed on a
// GPU: until it is, the threshold keeps the cooperative kernel, the one measured in
// docs/PERFORMANCE.md. K3RT_GG_DW_KERNEL=cooperative or =pingpong forces one (the tests check
// both, the benchmark times both: grouped_dw_co / grouped_dw_pp).
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/cutlass/grouped_dw.cuh"

namespace {

// Mean rows per group below which pingpong is taken (0: never, until the benchmark says).
constexpr int64_t kPingpongBelow = 0;

bool use_pingpong(const gg_call &c)
{
    const char *f = getenv("K3RT_GG_DW_KERNEL");
    if (f && !strcmp(f, "cooperative"))
        return false;
    if (f && !strcmp(f, "pingpong"))
        return true;
    return c.rows < kPingpongBelow * c.groups;
}

// dW_g = 0 for every empty group (which gets no tile): each block walks the groups and zeroes
// its stride of the empty ones.
template <bool kHost>
__global__ void zero_empty(float *dw, int64_t per_group, const void *off_dev, int off_i64,
                           gg_host_offsets off_host, int groups, int64_t rows)
{
    int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int g = 0; g < groups; g++) {
        int64_t lo, hi;
        gg::group_span<kHost>(off_dev, off_i64, off_host, rows, g, &lo, &hi);
        if (hi > lo)
            continue;
        float *d = dw + g * per_group;
        for (int64_t i = i0; i < per_group; i += stride)
            d[i] = 0.0f;
    }
}

int zero_empty_groups(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    int blocks = 2 * ctx->sms, groups = (int)c.groups;
    int64_t per_group = c.out_features * c.in;
    if (c.offsets_dev) {
        static const gg_host_offsets none = {};
        zero_empty<false><<<blocks, 256, 0, st>>>((float *)c.out, per_group, c.offsets_dev,
                                                 c.offsets_i64, none, groups, c.rows);
    } else {
        zero_empty<true><<<blocks, 256, 0, st>>>((float *)c.out, per_group, nullptr, 0, *c.host,
                                                groups, c.rows);
    }
    CU_LAUNCHED("grouped dW zeroing of empty groups");
    return K3RT_OK;
}

}  // namespace

int gg_run_dw(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    if (c.groups == 0)
        return K3RT_OK;
    if (!c.accumulate)
        K3RT_TRY(zero_empty_groups(ctx, c, err));
    if (c.rows == 0)
        return K3RT_OK;
    return use_pingpong(c) ? gg::launch_dw_pingpong(ctx, c, err)
                           : gg::launch_dw<gg::cooperative>(ctx, c, err);
}
