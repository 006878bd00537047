// The grouped input gradient dx(rows,in) (=|+=) dy W_g: A = dy (row-major, K = out
// contiguous), B = W_g read as K x N row-major, C = D = dx in bf16 (beta 1 to accumulate).
#include "ops/cuda/cutlass/grouped_kernel.cuh"

using dx_cfg = gg::config<cutlass::layout::RowMajor, cutlass::layout::RowMajor, gg::bf16c,
                          gg::bf16c>;

int gg_run_dx(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err)
{
    gg::geometry geo = {{c.out_features, 0}, {0, c.out_features * c.in}, {c.in, 0},
                        1, (int)c.in, (int)c.out_features, 0};
    return gg::launch<dx_cfg>(ctx, c, geo, (const gg::bf16c *)c.dy, (const gg::bf16c *)c.w,
                              (gg::bf16c *)c.out, c.accumulate ? 1.0f : 0.0f, err);
}
