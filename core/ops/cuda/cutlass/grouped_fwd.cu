// The grouped forward y(rows,out) = x W_g^T: A = x (row-major, K = in contiguous), B = W_g
// ([out, in]: CUTLASS's column-major K x N), D = y in bf16, no C.
#include "ops/cuda/cutlass/grouped_kernel.cuh"

using fwd_cfg = gg::config<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void,
                           gg::bf16c>;

int gg_run_fwd(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    gg::geometry geo = {{c.in, 0}, {0, c.out_features * c.in}, {c.out_features, 0},
                        1, (int)c.out_features, (int)c.in, 0};
    return gg::launch<fwd_cfg>(ctx, c, geo, (const gg::bf16c *)c.x, (const gg::bf16c *)c.w,
                               (gg::bf16c *)c.out, 0.0f, err);
}
