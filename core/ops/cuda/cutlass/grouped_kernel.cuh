// One CUTLASS sm90 ptr-array grouped GEMM (TMA loads, warp-specialised cooperative mainloop,
// TMA epilogue, the persistent grouped tile scheduler) and the device kernel that writes its
// per-group tables from the group offsets. Each kind (grouped.h) instantiates it once, in its
// own file, so the three compile in parallel.
//
// The schedule, and what decides it:
// - gg_prepare reads the offsets on the device (no host copy, no synchronisation) and writes
//   the groups in order of decreasing rows n_g (ties by index). Every tile of a group costs the
//   same, K/BK k-steps, and in the weight gradient K = n_g itself, so the costliest groups come
//   first; the tile scheduler deals tiles to the CTAs in this order and the small groups fill
//   the tail.
// - An empty group gets M = 0, hence no tile: the scheduler steps over it (for dW that is the
//   right answer, dW_g += 0, and it avoids the K = 0 mainloop).
// - CUTLASS's PersistentTileSchedulerSm90Group launches one CTA per SM (the host does not know
//   the counts, so the grid is not truncated) and deals linear tile indices to them round
//   robin over the concatenated tiles of all groups: a big group is spread over every SM, a
//   small one shares an SM's turn with its neighbours. Tiles per group are rounded up to the
//   2x1 cluster along M.
// - Tile 128x256x64, cluster 2x1x1, cooperative (two consumer warp groups on one tile), the
//   configuration torch._grouped_mm takes for groups with more than 128 rows and columns (its
//   GroupMM.cu); it serves the K3-mini and K3 shapes, where an expert gets thousands of rows.
//   The weight gradient can take pingpong instead (grouped_dw.cu says when).
#ifndef K3RT_OPS_CUDA_CUTLASS_GROUPED_KERNEL_CUH
#define K3RT_OPS_CUDA_CUTLASS_GROUPED_KERNEL_CUH

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "ops/cuda/cutlass/grouped.h"

namespace gg {

using namespace cute;
using bf16c = cutlass::bfloat16_t;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = ProblemShape::UnderlyingProblemShape;

// The two schedules. Cooperative: both consumer warp groups on one 128x256 tile, the
// epilogue after the tile's last k-step (nothing overlaps it but the producer's loads).
// Pingpong: each consumer warp group on its own 128x128 tile, turns alternating, so one
// group's epilogue runs under the other's mainloop: the weight gradient's fp32 C is read and
// written once per tile after a short ragged K (n_g rows), so there the epilogue is as long as
// the math.
struct cooperative {
    using TileShape = Shape<_128, _256, _64>;
    using ClusterShape = Shape<_2, _1, _1>;
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
    using Epi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct pingpong {
    using TileShape = Shape<_128, _128, _64>;
    using ClusterShape = Shape<_2, _1, _1>;
    using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
    using Epi = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

template <class LayoutA, class LayoutB, class ElementC, class ElementD,
          class Sched = cooperative>
struct config {
    using TileShape = typename Sched::TileShape;
    using ClusterShape = typename Sched::ClusterShape;
    using LayoutD = cutlass::layout::RowMajor;
    static constexpr int kAlignAB = 16 / sizeof(bf16c);
    static constexpr int kAlignD = 16 / sizeof(ElementD);

    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD *,
        kAlignD, ElementD, LayoutD *, kAlignD, typename Sched::Epi,
        cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;

    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16c, LayoutA *, kAlignAB, bf16c,
        LayoutB *, kAlignAB, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename Epilogue::SharedStorage))>,
        typename Sched::Kernel>::CollectiveOp;

    using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using SA = typename Kernel::InternalStrideA;
    using SB = typename Kernel::InternalStrideB;
    using SC = typename Kernel::InternalStrideC;
    using SD = typename Kernel::InternalStrideD;
    using EC = cute::conditional_t<cute::is_void_v<ElementC>, ElementD, ElementC>;
};

// Where group g's operands start, in elements: base + r0 * row + g * grp, r0 its first row.
struct place {
    int64_t row, grp;
};

// The per-group shape: M, N, K fixed, except the one that is the group's row count.
struct geometry {
    place a, b, d;
    int m, n, k;
    int rows_dim;  // 0: M = n_g; 2: K = n_g (and M = 0 when n_g = 0)
};

template <class Cfg> struct tables {
    Shape3 *shape;
    const bf16c **a, **b;
    const typename Cfg::EC **c;
    typename Cfg::EC **d;
    typename Cfg::SA *sa;
    typename Cfg::SB *sb;
    typename Cfg::SC *sc;
    typename Cfg::SD *sd;
};

template <class Cfg> struct strides {
    typename Cfg::SA sa;
    typename Cfg::SB sb;
    typename Cfg::SC sc;
    typename Cfg::SD sd;
};

template <bool kHost>
__device__ __forceinline__ int64_t offset_at(const void *dev, int dev_i64,
                                             const gg_host_offsets &host, int64_t i)
{
    if (kHost)
        return host.v[i];
    return dev_i64 ? ((const int64_t *)dev)[i] : ((const int32_t *)dev)[i];
}

// Group g's rows [lo, hi): offsets clamped to [0, rows] and made nondecreasing, so a bad
// offset on the device can empty a group but never point outside the buffers.
template <bool kHost>
__device__ __forceinline__ void group_span(const void *dev, int dev_i64,
                                           const gg_host_offsets &host, int64_t rows, int g,
                                           int64_t *lo, int64_t *hi)
{
    int64_t l = offset_at<kHost>(dev, dev_i64, host, g);
    int64_t h = offset_at<kHost>(dev, dev_i64, host, g + 1);
    l = l < 0 ? 0 : (l > rows ? rows : l);
    *lo = l;
    *hi = h < l ? l : (h > rows ? rows : h);
}

// One block of GG_MAX_GROUPS threads.
template <class Cfg, bool kHost>
__global__ void __launch_bounds__(GG_MAX_GROUPS)
    prepare(tables<Cfg> t, strides<Cfg> s, geometry geo, const void *off_dev, int off_i64,
            gg_host_offsets off_host, int groups, int64_t rows, const bf16c *a, const bf16c *b,
            typename Cfg::EC *d)
{
    __shared__ int32_t n_sh[GG_MAX_GROUPS], r0_sh[GG_MAX_GROUPS];
    int g = threadIdx.x;
    if (g < groups) {
        int64_t lo, hi;
        group_span<kHost>(off_dev, off_i64, off_host, rows, g, &lo, &hi);
        r0_sh[g] = (int32_t)lo;
        n_sh[g] = (int32_t)(hi - lo);
    }
    __syncthreads();
    if (g >= groups)
        return;
    int n = n_sh[g], rank = 0;
    for (int h = 0; h < groups; h++) {
        int nh = n_sh[h];
        rank += nh > n || (nh == n && h < g);
    }
    int64_t r0 = r0_sh[g];
    int m = geo.m, nn = geo.n, k = geo.k;
    if (geo.rows_dim == 0)
        m = n;
    else {
        k = n;
        m = n ? m : 0;
    }
    t.shape[rank] = Shape3(m, nn, k);
    t.a[rank] = a + r0 * geo.a.row + g * geo.a.grp;
    t.b[rank] = b + r0 * geo.b.row + g * geo.b.grp;
    t.d[rank] = d + r0 * geo.d.row + g * geo.d.grp;
    t.c[rank] = t.d[rank];
    t.sa[rank] = s.sa;
    t.sb[rank] = s.sb;
    t.sc[rank] = s.sc;
    t.sd[rank] = s.sd;
}

inline size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

// The tables and CUTLASS's workspace in the stream's scratch; then prepare and the GEMM, both
// on the stream. geo's fixed dimensions give the leading dimensions (every group is packed).
template <class Cfg>
int launch(cuda_stream_ctx *ctx, const gg_call &c, const geometry &geo, const bf16c *a,
           const bf16c *b, typename Cfg::EC *d, float beta, k3rt_error *err)
{
    using Gemm = typename Cfg::Gemm;
    int groups = (int)c.groups;
    if (groups == 0)
        return K3RT_OK;
    // Leading dimensions: A is M x K, B is N x K (CUTLASS's view), C/D M x N.
    int lm = geo.m, ln = geo.n, lk = geo.k;
    strides<Cfg> s;
    s.sa = cutlass::make_cute_packed_stride(typename Cfg::SA{}, make_shape(lm, lk, 1));
    s.sb = cutlass::make_cute_packed_stride(typename Cfg::SB{}, make_shape(ln, lk, 1));
    s.sc = cutlass::make_cute_packed_stride(typename Cfg::SC{}, make_shape(lm, ln, 1));
    s.sd = cutlass::make_cute_packed_stride(typename Cfg::SD{}, make_shape(lm, ln, 1));

    size_t g = (size_t)groups, at = 0;
    size_t o_shape = at;
    at += round256(g * sizeof(Shape3));
    size_t o_ptr = at;
    at += 4 * round256(g * sizeof(void *));
    size_t o_str = at;
    at += round256(g * sizeof(s.sa)) + round256(g * sizeof(s.sb)) + round256(g * sizeof(s.sc)) +
          round256(g * sizeof(s.sd));
    size_t o_ws = at;

    cutlass::KernelHardwareInfo hw;
    hw.device_id = ctx->device;
    hw.sm_count = ctx->sms;
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {groups, nullptr, nullptr},
                                  {nullptr, nullptr, nullptr, nullptr},
                                  {{}, nullptr, nullptr, nullptr, nullptr},
                                  hw};
    size_t ws = Gemm::get_workspace_size(args);
    char *base;
    K3RT_TRY(cuda_ctx_scratch(ctx, o_ws + ws, (void **)&base, err));

    tables<Cfg> t;
    t.shape = (Shape3 *)(base + o_shape);
    size_t pb = round256(g * sizeof(void *));
    t.a = (const bf16c **)(base + o_ptr);
    t.b = (const bf16c **)(base + o_ptr + pb);
    t.c = (const typename Cfg::EC **)(base + o_ptr + 2 * pb);
    t.d = (typename Cfg::EC **)(base + o_ptr + 3 * pb);
    char *sp = base + o_str;
    t.sa = (typename Cfg::SA *)sp;
    sp += round256(g * sizeof(s.sa));
    t.sb = (typename Cfg::SB *)sp;
    sp += round256(g * sizeof(s.sb));
    t.sc = (typename Cfg::SC *)sp;
    sp += round256(g * sizeof(s.sc));
    t.sd = (typename Cfg::SD *)sp;

    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (c.offsets_dev) {
        static const gg_host_offsets none = {};
        prepare<Cfg, false><<<1, GG_MAX_GROUPS, 0, st>>>(t, s, geo, c.offsets_dev,
                                                        c.offsets_i64, none, groups, c.rows, a,
                                                        b, d);
    } else {
        prepare<Cfg, true><<<1, GG_MAX_GROUPS, 0, st>>>(t, s, geo, nullptr, 0, *c.host,
                                                       groups, c.rows, a, b, d);
    }
    CU_LAUNCHED("grouped GEMM prepare");

    args.problem_shape = {groups, t.shape, nullptr};
    args.mainloop = {t.a, t.sa, t.b, t.sb};
    if constexpr (!cute::is_void_v<typename Cfg::Epilogue::ElementC>)
        args.epilogue.ptr_C = beta != 0.0f ? t.c : nullptr;
    args.epilogue.dC = t.sc;
    args.epilogue.ptr_D = t.d;
    args.epilogue.dD = t.sd;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = beta;
    args.epilogue.thread.dAlpha = {_0{}, _0{}, 0};
    args.epilogue.thread.dBeta = {_0{}, _0{}, 0};

    Gemm gemm;
    cutlass::Status st_impl = gemm.can_implement(args);
    if (st_impl != cutlass::Status::kSuccess)
        return k3rt_fail(err, K3RT_ERR_INVALID, "grouped GEMM: CUTLASS cannot implement it (%s)",
                         cutlass::cutlassGetStatusString(st_impl));
    cutlass::Status st_init = gemm.initialize(args, base + o_ws, st);
    if (st_init != cutlass::Status::kSuccess)
        return k3rt_fail(err, K3RT_ERR_DEVICE, "grouped GEMM: CUTLASS initialize failed (%s)",
                         cutlass::cutlassGetStatusString(st_init));
    cutlass::Status st_run = gemm.run(st);
    if (st_run != cutlass::Status::kSuccess)
        return k3rt_fail(err, K3RT_ERR_DEVICE, "grouped GEMM: CUTLASS launch failed (%s)",
                         cutlass::cutlassGetStatusString(st_run));
    CU_LAUNCHED("grouped GEMM");
    return K3RT_OK;
}

}  // namespace gg

#endif
