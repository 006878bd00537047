// Pieces shared by the KDA CUDA kernels: conversions, the chunk map, asynchronous copies,
// ldmatrix / mma.sync m16n8k16 (bf16 in, fp32 accumulation) and the two engines of the
// chunk-parallel kernels' products.
//
// Fragments (PTX m16n8k16, lane = 4 g + t): A 16x16, a0 (row g, cols 2t, 2t+1), a1 (row g+8),
// a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9); B 16x8, b0 (rows 2t, 2t+1, col g),
// b1 (rows 2t+8, 2t+9); C 16x8, c0 c1 (row g, cols 2t, 2t+1), c2 c3 (row g+8). The C fragments of
// two neighbouring 8-column tiles are the A fragment of one 16-deep step, and the A fragment of a
// 16x16 block X is the B fragment of X^T (b0 b1 of columns 0-7: a0 a2; of 8-15: a1 a3).
//
// The engines compute a warp's tile acc[NT][4] (16 rows x 8 NT columns, C-fragment layout) of
// A B: with bf16 operands in shared memory on the tensor cores (ldmatrix, rows 16-byte aligned,
// strides padded by 16 bytes), with float operands anywhere by scalar FMAs in the same fragment
// layout, so one kernel source serves both precisions.
#ifndef K3RT_PLUGIN_KDA_CUDA_COMMON_CUH
#define K3RT_PLUGIN_KDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kda_cuda.h"

namespace kdacu {

typedef __nv_bfloat16 bf16;

constexpr int C = KDA_CUDA_CHUNK;  // tokens per chunk
constexpr int SUB = 16;            // rows per sub-chunk (midpoint reference)
constexpr int NB = C / SUB;        // sub-chunks per chunk
constexpr float LOG2E = 1.4426950408889634f;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// Row padding of shared tiles: 16 bytes.
template <typename E> struct Pad { static constexpr int v = 16 / (int)sizeof(E); };

// ---- the chunk map -------------------------------------------------------------------------
// Global chunk c: its sequence, first token (index into the N tokens) and valid rows. Without
// cu_seqlens: c = b * NT + i. With it, chunk_map (built by map_kernel) holds (doc, t0, n).
struct Seqs {
    const int32_t *cu;     // or nullptr
    const int32_t *cidx;   // [n_docs + 1] first chunk of each document (with cu)
    const int4 *map;       // [NC] (doc, t0, n, 0) (with cu); doc < 0 past the last chunk
    int64_t T, NT;         // without cu: tokens per sequence, chunks per sequence
    int64_t row_len;       // with cu: > 0 when the states are per row of row_len tokens
};

struct ChunkInfo {
    int doc;
    int64_t t0;
    int n;
};

__device__ __forceinline__ bool chunk_info(const Seqs &s, int64_t c, ChunkInfo &ci)
{
    if (s.cu) {
        int4 m = s.map[c];
        ci.doc = m.x, ci.t0 = (int64_t)(uint32_t)m.y, ci.n = m.z;
        return m.x >= 0;
    }
    int64_t b = c / s.NT, i = c % s.NT;
    ci.doc = (int)b, ci.t0 = b * s.T + i * C;
    ci.n = (int)min((int64_t)C, s.T - i * C);
    return true;
}

// Tokens and chunks of sequence d.
__device__ __forceinline__ void seq_info(const Seqs &s, int d, int64_t &t0, int64_t &len,
                                         int64_t &c0, int64_t &nch)
{
    if (s.cu) {
        t0 = s.cu[d], len = (int64_t)s.cu[d + 1] - s.cu[d];
        c0 = s.cidx[d], nch = (int64_t)s.cidx[d + 1] - s.cidx[d];
    } else {
        t0 = (int64_t)d * s.T, len = s.T, c0 = (int64_t)d * s.NT, nch = s.NT;
    }
}

// The state slot (index into s0 / d_s0, resp. s_final / d_s_final and the summary) that
// sequence d starts from and ends in: d itself, or with rows (cu and row_len > 0) the row it
// starts / ends, and -1 for a document that does not start / end a row (it starts from zero;
// its final state is not asked for).
__device__ __forceinline__ int64_t slot_in(const Seqs &s, int d)
{
    if (!s.cu || s.row_len <= 0)
        return d;
    const int64_t t = s.cu[d];
    return t % s.row_len == 0 ? t / s.row_len : -1;
}

__device__ __forceinline__ int64_t slot_out(const Seqs &s, int d)
{
    if (!s.cu || s.row_len <= 0)
        return d;
    const int64_t t = s.cu[d + 1];
    return t % s.row_len == 0 ? t / s.row_len - 1 : -1;
}

// ---- PTX primitives ------------------------------------------------------------------------
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
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

// ---- fragment coordinates ------------------------------------------------------------------
__device__ __forceinline__ int frow(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
__device__ __forceinline__ int fcol(int lane, int nt, int e)
{
    return nt * 8 + 2 * (lane & 3) + (e & 1);
}

template <int NT> __device__ __forceinline__ void zero(float (&acc)[NT][4])
{
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = 0.0f;
}

// ---- the engines: acc += A B over K (a multiple of 16) -----------------------------------------
// A(m, k) = AT ? a[k * lda + m] : a[m * lda + k]     (a at the tile's row 0, k 0)
// B(k, n) = BT ? b[k * ldb + n] : b[n * ldb + k]     (b at the tile's column 0, k 0)
template <int NT, bool AT, bool BT>
__device__ __forceinline__ void mm(float (&acc)[NT][4], const float *a, int lda, const float *b,
                                   int ldb, int K, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    for (int k = 0; k < K; k++) {
        float a0 = AT ? a[k * lda + g] : a[g * lda + k];
        float a1 = AT ? a[k * lda + g + 8] : a[(g + 8) * lda + k];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int n = nt * 8 + 2 * t;
            float b0 = BT ? b[k * ldb + n] : b[n * ldb + k];
            float b1 = BT ? b[k * ldb + n + 1] : b[(n + 1) * ldb + k];
            acc[nt][0] = fmaf(a0, b0, acc[nt][0]);
            acc[nt][1] = fmaf(a0, b1, acc[nt][1]);
            acc[nt][2] = fmaf(a1, b0, acc[nt][2]);
            acc[nt][3] = fmaf(a1, b1, acc[nt][3]);
        }
    }
}

template <int NT, bool AT, bool BT>
__device__ __forceinline__ void mm(float (&acc)[NT][4], const bf16 *a, int lda, const bf16 *b,
                                   int ldb, int K, int lane)
{
    static_assert(NT % 2 == 0, "the tensor-core engine takes pairs of 8-column tiles");
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[4];
        if (AT)
            ldsm_t(af, a + (k0 + (lane >> 4) * 8 + (lane & 7)) * lda + ((lane >> 3) & 1) * 8);
        else
            ldsm(af, a + (lane & 15) * lda + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < NT / 2; p++) {
            uint32_t bf[4];
            if (BT)
                ldsm_t(bf, b + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ldb + p * 16 +
                               (lane >> 4) * 8);
            else
                ldsm(bf, b + (p * 16 + (lane >> 4) * 8 + (lane & 7)) * ldb + k0 +
                             ((lane >> 3) & 1) * 8);
            mma(acc[2 * p], af, bf[0], bf[1]);
            mma(acc[2 * p + 1], af, bf[2], bf[3]);
        }
    }
}

// ---- tiles into shared memory ------------------------------------------------------------------
// rows x cols elements (cols * sizeof(E) a multiple of 16) from src (row pitch lds elements) to
// dst (row pitch ldd); rows at or past `valid` become zeros. bf16: cp.async (commit and wait
// yourself); float: plain loads (the scalar engine's path).
template <typename E>
__device__ __forceinline__ void tile_in(E *dst, int ldd, const E *src, int64_t lds, int rows,
                                        int cols, int valid, int tid, int nthreads)
{
    constexpr int V = 16 / (int)sizeof(E);
    const int per = cols / V;
    for (int i = tid; i < rows * per; i += nthreads) {
        int r = i / per, c = (i % per) * V;
        bool ok = r < valid;
        if (sizeof(E) == 2) {
            cp_async16(dst + r * ldd + c, src + (ok ? (int64_t)r * lds + c : 0), ok);
        } else {
            float4 x = ok ? *reinterpret_cast<const float4 *>(src + (int64_t)r * lds + c)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4 *>(dst + r * ldd + c) = x;
        }
    }
}

__device__ __forceinline__ float ex2(float x) { return exp2f(x); }

}  // namespace kdacu

// Internal launchers (kernels' .cu files), called by api.cu with checked arguments.
namespace kdacu {

struct Dims {
    int64_t B, T, H, HV, D, N, NC, n_seq;
    float scale;
    Seqs seqs;
};

// Workspace / saved arrays of one call (element pointers of the compute type E = dtype).
struct Bufs {
    // prep outputs, chunk-major [NC][HV][...]
    void *Qg, *Kb, *W, *A, *Ut, *Tm, *Lk;  // [64][D], [64][D], [64][D], [64][64], [D][64], [64][64] x2
    float *gam;                           // [NC][HV][D]
    // saved
    void *St, *Dt;                        // [NC][HV][D][D], [NC][HV][D][64]
    // backward
    void *dSt, *dDt, *dAs, *dLk;          // [D][D], [D][64], [64][64], [64][64]
    float *part, *dGl, *dd;               // [NC][HV][3*64*D], [NC][HV][D], [NC][HV][64]
    float *dqv, *dkv;                     // GVA: [N][HV][D] each, or nullptr
};

int launch_prep(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a, const Bufs &b,
                bool bwd, k3rt_error *err);
int launch_state_fwd(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                     const Bufs &b, k3rt_error *err);
int launch_state_bwd(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                     const Bufs &b, k3rt_error *err);
int launch_summary(cudaStream_t st, int dtype, const Dims &d, const Bufs &b, float *m, float *bm,
                   k3rt_error *err);
int launch_bwd_chunks(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                      const Bufs &b, k3rt_error *err);

int cu_fail(k3rt_error *err, cudaError_t e, const char *what);

// Lets `kernel` take `bytes` of dynamic shared memory (above the default 48 KB).
template <typename K>
inline int allow_smem(K kernel, size_t bytes, const char *name, k3rt_error *err)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes);
    if (e != cudaSuccess)
        return cu_fail(err, e, name);
    return K3RT_OK;
}

}  // namespace kdacu

#define KDA_CU_TRY(call, what)                       \
    do {                                             \
        cudaError_t e_ = (call);                     \
        if (e_ != cudaSuccess)                       \
            return ::kdacu::cu_fail(err, e_, what);  \
    } while (0)

// After a launch: a bad configuration shows here, not at the next synchronisation.
#define KDA_LAUNCHED(name) KDA_CU_TRY(cudaGetLastError(), "launch of " name)

#endif
