// The tensor-core kernels' primitives (attn_tc.cu, attn_tc_bwd.cu): asynchronous copies,
// ldmatrix, mma.sync m16n8k16 (bf16 in, fp32 accumulation) and the tile loads.
//
// Fragments (PTX m16n8k16, lane = 4 g + t): A 16x16 row-major, a0 (row g, cols 2t, 2t+1),
// a1 (row g+8), a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9); B 16x8, b0 (rows
// 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9); C 16x8, c0 c1 (row g, cols 2t, 2t+1), c2 c3 (row g+8).
// The C fragments of two neighbouring 8-column tiles are the A fragment of one 16-deep step,
// so probabilities go from one product to the next in registers. Shared-memory rows are padded
// by 16 bytes, so the 8 row addresses of each ldmatrix fall in different banks.
#ifndef K3RT_PLUGIN_MLA_TC_CUH
#define K3RT_PLUGIN_MLA_TC_CUH

#include "cuda_common.cuh"

namespace mla_tc {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; zeros when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_t(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// Two 8x8 matrices, transposed: the b0 b1 of one 8-column tile (addresses of lanes 0-15).
__device__ __forceinline__ void ldsm_t2(uint32_t (&r)[2], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x on the special-function unit (relative error ~2^-22; 2^-inf = 0, NaN stays NaN).
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// A fragment of one 16-deep step from the C fragments of column tiles 2kk and 2kk+1.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                       const float (&c1)[4])
{
    a[0] = pack(c0[0], c0[1]);
    a[1] = pack(c0[2], c0[3]);
    a[2] = pack(c1[0], c1[1]);
    a[3] = pack(c1[2], c1[3]);
}

// The ldmatrix row address each lane gives, for a 16x16 block at (r0, c0) of a tile with row
// stride S:  A operand (rows = M) and the "trans" B operand (rows = K): lanes 0-15 rows 0-15 at
// column 0, lanes 16-31 at column 8 ... in the order each use needs:
//   a_addr: matrices (r0-7,c0) (r8-15,c0) (r0-7,c8) (r8-15,c8)   -> a0 a1 a2 a3
//   b_addr: matrices (n0-7,k0) (n0-7,k8) (n8-15,k0) (n8-15,k8)   -> b0 b1 of n-tile 0, of 1
//   bt_addr (trans): (k0-7,n0) (k8-15,n0) (k0-7,n8) (k8-15,n8)   -> b0 b1 of n-tile 0, of 1
template <int S> __device__ __forceinline__ const bf16 *a_addr(const bf16 *t, int r0, int c0,
                                                               int lane)
{
    return t + (r0 + (lane & 15)) * S + c0 + (lane >> 4) * 8;
}
template <int S> __device__ __forceinline__ const bf16 *b_addr(const bf16 *t, int n0, int k0,
                                                               int lane)
{
    return t + (n0 + (lane >> 4) * 8 + (lane & 7)) * S + k0 + ((lane >> 3) & 1) * 8;
}
template <int S> __device__ __forceinline__ const bf16 *bt_addr(const bf16 *t, int k0, int n0,
                                                                int lane)
{
    return t + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * S + n0 + (lane >> 4) * 8;
}

// Rows [r0, r0 + ROWS) of a matrix with D contiguous bf16 per row and row pitch ld into shared
// memory of row stride S; rows at or past T read as zeros.
template <int ROWS, int D, int S, int THREADS>
__device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *g, int64_t ld, int r0, int T,
                                          int tid)
{
    constexpr int CH = D / 8;
    static_assert(D % 8 == 0 && (ROWS * CH) % THREADS == 0, "tile not divisible");
#pragma unroll
    for (int it = 0; it < ROWS * CH / THREADS; it++) {
        int i = it * THREADS + tid, r = i / CH, c = (i % CH) * 8, row = r0 + r;
        bool ok = row < T;
        cp_async16(sm + r * S + c, g + (int64_t)(ok ? row : 0) * ld + c, ok);
    }
}

// Row statistics over the 4 lanes that share a row (t = 0..3).
__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Query rows [r0, r0 + BM) of Q and dO into buffer `buf`, with their lse (base 2) and D.
template <int BM, int DQK, int DV, int QS, int VS, int THREADS>
__device__ __forceinline__ void load_rows(bf16 *sQ, bf16 *sO, float *sL, float *sD,
                                          const bf16 *Qg, const bf16 *Og, const float *Lg,
                                          const float *Dg, int64_t ldq, int64_t ldv, int r0,
                                          int T, int tid)
{
    load_tile<BM, DQK, QS, THREADS>(sQ, Qg, ldq, r0, T, tid);
    load_tile<BM, DV, VS, THREADS>(sO, Og, ldv, r0, T, tid);
    static_assert(BM <= THREADS, "one thread per row statistic");
    if (tid < BM) {
        int row = r0 + tid;
        sL[tid] = row < T ? Lg[row] * kLog2e : INFINITY;
        sD[tid] = row < T ? Dg[row] : 0.0f;
    }
}


template <typename K> int allow_smem(K kernel, int bytes, k3rt_error *err)
{
    MLA_CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "cudaFuncSetAttribute (shared memory of the attention kernels)");
    return K3RT_OK;
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

}  // namespace mla_tc

#endif
