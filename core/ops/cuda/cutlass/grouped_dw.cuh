// The grouped weight gradient dW_g(out,in) (+=|=) dy_g^T x_g, reduced over the group's own rows
// (ragged K): A = dy_g^T (column-major M x K, M = out contiguous), B = x_g (row-major K x N),
// C = D = dW_g in fp32, beta 1 to accumulate, 0 to overwrite (C is then never read). One
// launch per schedule (grouped_kernel.cuh), each instantiated in its own file.
#ifndef K3RT_OPS_CUDA_CUTLASS_GROUPED_DW_CUH
#define K3RT_OPS_CUDA_CUTLASS_GROUPED_DW_CUH

#include "ops/cuda/cutlass/grouped_kernel.cuh"

namespace gg {

template <class Sched>
using dw_cfg = config<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float,
                      Sched>;

template <class Sched> int launch_dw(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    geometry geo = {{c.out_features, 0}, {c.in, 0}, {0, c.out_features * c.in},
                    (int)c.out_features, (int)c.in, 1, 2};
    return launch<dw_cfg<Sched>>(ctx, c, geo, (const bf16c *)c.dy, (const bf16c *)c.x,
                                 (float *)c.out, c.accumulate ? 1.0f : 0.0f, err);
}

int launch_dw_pingpong(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err);

}  // namespace gg

#endif
