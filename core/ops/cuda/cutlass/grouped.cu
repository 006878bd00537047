// Which grouped products the CUTLASS kernels take, and the call to the kind's kernel.
#include "ops/cuda/cutlass/grouped.h"

int gg_run_fwd(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err);
int gg_run_dx(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err);
int gg_run_dw(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err);

bool gg_supported(const cuda_stream_ctx *ctx, int dtype, int64_t groups, int64_t in,
                  int64_t out)
{
    // The kernels are built for sm_90a only: their wgmma and TMA do not run elsewhere.
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx->device) !=
            cudaSuccess)
        return false;
    return major == 9 && minor == 0 && dtype == K3RT_BF16 && groups <= GG_MAX_GROUPS &&
           in > 0 && out > 0 && in % 8 == 0 && out % 8 == 0 && in < (1 << 30) &&
           out < (1 << 30);
}

int gg_run(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    if (c.kind == GG_FWD)
        return gg_run_fwd(ctx, c, err);
    if (c.kind == GG_DX)
        return gg_run_dx(ctx, c, err);
    return gg_run_dw(ctx, c, err);
}
