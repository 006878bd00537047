// The weight gradient's pingpong instantiation (grouped_dw.cuh), apart so that it compiles in
// parallel with the cooperative one.
#include "ops/cuda/cutlass/grouped_dw.cuh"

int gg::launch_dw_pingpong(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    return launch_dw<pingpong>(ctx, c, err);
}
