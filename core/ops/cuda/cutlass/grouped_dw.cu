// The grouped weight gradient dW_g(out,in) += dy_g^T x_g, reduced over the group's own rows
// (ragged K): A = dy_g^T (column-major M x K, M = out contiguous), B = x_g (row-major K x N),
// C = D = dW_g in fp32 with beta 1.
#include "ops/cuda/cutlass/grouped_kernel.cuh"

using dw_cfg = gg::config<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float>;

int gg_run_dw(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    gg::geometry geo = {{c.out_features, 0}, {c.in, 0}, {0, c.out_features * c.in},
                        (int)c.out_features, (int)c.in, 1, 2};
    return gg::launch<dw_cfg>(ctx, c, geo, (const gg::bf16c *)c.dy, (const gg::bf16c *)c.x,
                              (float *)c.out, 1.0f, err);
}
