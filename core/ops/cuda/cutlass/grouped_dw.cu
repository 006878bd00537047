// The grouped weight gradient (grouped_dw.cuh): the schedule for the call, the cooperative
// instantiation, and the zeroing of empty groups when it overwrites.
//
// Schedule, from the H200 benchmark of 2026-12-02 (docs/PERFORMANCE.md): dW's K is a group's
// own rows, so with skewed counts one heavy expert's tiles each run a long mainloop while the
// other SMs idle; how many SMs that expert can use is its count of output tiles. The
// cooperative kernel tiles dW_g at 128x256, pingpong at 128x128 (twice the tiles). Where one
// expert's dW has fewer 128x256 tiles than the GPU has SMs (K3-mini: 512x1536 = 24 tiles, 768x
// 512 = 12), pingpong spreads a heavy expert over twice the SMs: 1.24x and 1.61x the
// cooperative kernel on Zipf(1.2) counts, within 0-6% of it on uniform ones. Where it has many
// (K3: 3584x6144 = 672 tiles) the smaller tile only costs: 0.83x cooperative on Zipf counts.
// The counts stay on the device, so the rule reads only the shape. K3RT_GG_DW_KERNEL=
// cooperative or =pingpong forces one (the tests check both, the benchmark times both:
// grouped_dw_co / grouped_dw_pp).
#include <stdlib.h>
#include <string.h>

#include "ops/cuda/cutlass/grouped_dw.cuh"

namespace {

bool use_pingpong(const cuda_stream_ctx *ctx, const gg_call &c)
{
    const char *f = getenv("K3RT_GG_DW_KERNEL");
    if (f && !strcmp(f, "cooperative"))
        return false;
    if (f && !strcmp(f, "pingpong"))
        return true;
    int64_t tiles = ((c.out_features + 127) / 128) * ((c.in + 255) / 256);
    return tiles < ctx->sms;
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
    return use_pingpong(ctx, c) ? gg::launch_dw_pingpong(ctx, c, err)
                           : gg::launch_dw<gg::cooperative>(ctx, c, err);
}
