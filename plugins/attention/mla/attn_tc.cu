// Causal flash attention forward for bf16 on the tensor cores (mma.sync m16n8k16, fp32
// accumulation; primitives in tc.cuh), for the head widths of MLA: (dqk, dv) = (192, 128) and
// (128, 128). The backward is attn_tc_bwd.cu.
//
// Kept beside cuDNN's fused attention (attn_cudnn.c, which attn.cu prefers: 0.95-1.00x of
// PyTorch's SDPA against this kernel's 0.42-0.47x, docs/PERFORMANCE.md "MLA attention core vs
// PyTorch SDPA") for what cuDNN does not give: the per-head max logits QK-clip needs
// (report_max_logit; cuDNN 9.14/9.19 leave the row maximum unwritten) and bf16 lengths that
// are not a multiple of 128.
//
// One block per (b*h, 32*NW query rows), NW warps of 32 rows; key tiles of 32, online softmax
// in base 2; K of the next tile loads while P V runs, V while Q K^T runs. Warps whose rows all
// precede a tile's keys skip it. With packed documents (DOCS) the block starts at the key tile
// of its first row's document start, a warp skips the tiles before its own first row's, and
// the tiles that begin before its last row's are masked per row (the document starts of the
// block's rows are kept in shared memory, off the registers the 192-wide kernel is short of).
#include "tc.cuh"

namespace {

using namespace mla_tc;

// ---- forward ------------------------------------------------------------------------------

template <int DQK, int DV, int NW, bool DOCS> struct Fwd {
    static constexpr int THREADS = NW * 32, BM = NW * 32, BN = 32, QS = DQK + 8, VS = DV + 8;
    static constexpr int SMEM = (BM * QS + BN * QS + BN * VS) * 2 + (DOCS ? BM * 4 : 0);
    static_assert(BM <= THREADS, "one thread per row's document start");
};

template <int DQK, int DV, int NW, bool DOCS>
__global__ void __launch_bounds__(NW * 32, 8 / NW)
fwd_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
           bf16 *__restrict__ o, float *__restrict__ lse, float *__restrict__ bmax,
           const int *__restrict__ docs, int n_docs, int T, int H, float sl2)
{
    using C = Fwd<DQK, DV, NW, DOCS>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem), *sK = sQ + C::BM * C::QS,
         *sV = sK + C::BN * C::QS;
    int *sF = reinterpret_cast<int *>(sV + C::BN * C::VS);  // DOCS: first key of each row
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * C::BM;  // the longest rows start first
    const int64_t ldq = (int64_t)H * DQK, ldv = (int64_t)H * DV, tok = (int64_t)b * T * H + h;
    const bf16 *Qg = q + tok * DQK, *Kg = k + tok * DQK, *Vg = v + tok * DV;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int wr = warp * 32;
    const int nkt = (min(T, q0 + C::BM) + C::BN - 1) / C::BN;
    int j0 = 0;  // the first key tile any row of the block sees
    if constexpr (DOCS) {
        if (tid < C::BM)
            sF[tid] = doc_span(docs, n_docs, b, T, q0 + tid).first;
        j0 = doc_span(docs, n_docs, b, T, q0).first / C::BN;
    }

    load_tile<C::BM, DQK, C::QS, C::THREADS>(sQ, Qg, ldq, q0, T, tid);
    load_tile<C::BN, DQK, C::QS, C::THREADS>(sK, Kg, ldq, j0 * C::BN, T, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    float acc[2][DV / 8][4], mx[2][2], ls[2][2];
#pragma unroll
    for (int ms = 0; ms < 2; ms++) {
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[ms][n][e] = 0.0f;
        mx[ms][0] = mx[ms][1] = -INFINITY;
        ls[ms][0] = ls[ms][1] = 0.0f;
    }

    for (int j = j0; j < nkt; j++) {
        const int k0 = j * C::BN;
        load_tile<C::BN, DV, C::VS, C::THREADS>(sV, Vg, ldv, k0, T, tid);
        cp_async_commit();

        // A warp whose rows all precede the tile's keys, or whose documents all begin after
        // them, has nothing to add (loads and barriers still run for the block).
        const bool live = k0 <= q0 + wr + 31 && (!DOCS || k0 + C::BN > sF[wr]);
        float s[2][C::BN / 8][4];
#pragma unroll
        for (int ms = 0; ms < 2; ms++)
#pragma unroll
            for (int n = 0; n < C::BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[ms][n][e] = 0.0f;
        if (live) {
#pragma unroll 4
            for (int ks = 0; ks < DQK / 16; ks++) {
                uint32_t a[2][4];
#pragma unroll
                for (int ms = 0; ms < 2; ms++)
                    ldsm(a[ms], a_addr<C::QS>(sQ, wr + ms * 16, ks * 16, lane));
#pragma unroll
                for (int np = 0; np < C::BN / 16; np++) {
                    uint32_t bb[4];
                    ldsm(bb, b_addr<C::QS>(sK, np * 16, ks * 16, lane));
#pragma unroll
                    for (int ms = 0; ms < 2; ms++) {
                        mma(s[ms][2 * np], a[ms], bb[0], bb[1]);
                        mma(s[ms][2 * np + 1], a[ms], bb[2], bb[3]);
                    }
                }
            }

            // Online softmax in base 2 (sl2 = scale log2 e); masked logits are -inf.
            const bool masked =
                k0 + C::BN - 1 > q0 + wr || k0 + C::BN > T || (DOCS && k0 < sF[wr + 31]);
#pragma unroll
            for (int ms = 0; ms < 2; ms++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int row = q0 + wr + ms * 16 + g + hf * 8;
                    float m = mx[ms][hf];
#pragma unroll
                    for (int n = 0; n < C::BN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float x = s[ms][n][2 * hf + e] * sl2;
                            int key = k0 + n * 8 + 2 * t4 + e;
                            if (masked && (key > row || key >= T ||
                                           (DOCS && key < sF[row - q0])))
                                x = -INFINITY;
                            s[ms][n][2 * hf + e] = x;
                            m = fmaxf(m, x);
                        }
                    m = quad_max(m);
                    const float base = m == -INFINITY ? 0.0f : m;
                    const float alpha = ex2(mx[ms][hf] - base);
                    float sum = 0.0f;
#pragma unroll
                    for (int n = 0; n < C::BN / 8; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float p = ex2(s[ms][n][2 * hf + e] - base);
                            s[ms][n][2 * hf + e] = p;
                            sum += p;
                        }
                    ls[ms][hf] = ls[ms][hf] * alpha + sum;
                    mx[ms][hf] = m;
#pragma unroll
                    for (int n = 0; n < DV / 8; n++) {
                        acc[ms][n][2 * hf] *= alpha;
                        acc[ms][n][2 * hf + 1] *= alpha;
                    }
                }
        }

        cp_async_wait_all();  // V of this tile
        __syncthreads();      // ... for every warp, and every warp is done with K
        if (j + 1 < nkt)
            load_tile<C::BN, DQK, C::QS, C::THREADS>(sK, Kg, ldq, k0 + C::BN, T, tid);
        cp_async_commit();

#pragma unroll
        for (int kk = 0; kk < C::BN / 16 && live; kk++) {
            uint32_t pa[2][4];
#pragma unroll
            for (int ms = 0; ms < 2; ms++)
                c_to_a(pa[ms], s[ms][2 * kk], s[ms][2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < DV / 16; dp++) {
                uint32_t bb[4];
                ldsm_t(bb, bt_addr<C::VS>(sV, kk * 16, dp * 16, lane));
#pragma unroll
                for (int ms = 0; ms < 2; ms++) {
                    mma(acc[ms][2 * dp], pa[ms], bb[0], bb[1]);
                    mma(acc[ms][2 * dp + 1], pa[ms], bb[2], bb[3]);
                }
            }
        }
        cp_async_wait_all();  // K of the next tile
        __syncthreads();      // ... and every warp is done with V
    }

    // O = acc / l; lse = (m + log2 l) ln 2; the warp's largest scaled logit (NaN if a sum is).
    bf16 *Og = o + tok * DV;
    float wmax = -INFINITY;
#pragma unroll
    for (int ms = 0; ms < 2; ms++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float l = quad_sum(ls[ms][hf]), inv = 1.0f / l;
            const int row = q0 + wr + ms * 16 + g + hf * 8;
            if (row < T) {
                bf16 *orow = Og + (int64_t)row * ldv + 2 * t4;
#pragma unroll
                for (int n = 0; n < DV / 8; n++)
                    *reinterpret_cast<__nv_bfloat162 *>(orow + n * 8) = __floats2bfloat162_rn(
                        acc[ms][n][2 * hf] * inv, acc[ms][n][2 * hf + 1] * inv);
                if (t4 == 0)
                    lse[(int64_t)bh * T + row] = (mx[ms][hf] + log2f(l)) * kLn2;
                wmax = nan_max(wmax, l != l ? l : mx[ms][hf] * kLn2);
            }
        }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        wmax = nan_max(wmax, __shfl_xor_sync(0xffffffffu, wmax, off));
    if (bmax && lane == 0 && q0 + wr < T)
        bmax[(int64_t)bh * ((T + 31) / 32) + (q0 + wr) / 32] = wmax;
}

// ---- launchers --------------------------------------------------------------------------------

template <int DQK, int DV, int NW, bool DOCS>
int fwd_t(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    using C = Fwd<DQK, DV, NW, DOCS>;
    K3RT_TRY(allow_smem(fwd_kernel<DQK, DV, NW, DOCS>, C::SMEM, err));
    dim3 grid((unsigned)(a->B * a->H), (unsigned)((a->T + C::BM - 1) / C::BM));
    fwd_kernel<DQK, DV, NW, DOCS><<<grid, C::THREADS, C::SMEM, st>>>(
        (const bf16 *)a->q, (const bf16 *)a->k, (const bf16 *)a->v, (bf16 *)a->o, a->lse,
        a->block_max, a->docs, (int)a->n_docs, (int)a->T, (int)a->H,
        (float)(a->scale * kLog2e));
    MLA_LAUNCHED("mla fwd_kernel");
    return K3RT_OK;
}

// Warps per block, measured on the H200 (B=8, T=4096, H=8, 192/128): 9% faster with 4 than
// with 8 (two blocks per multiprocessor). Key tiles of 64 would halve the barriers and the K
// fragment loads per product but spill (56 bytes at 128/128, 280 at 192/128).
constexpr int kFwdWarps = 4;

// Without documents the kernel has none of their loads and compares (DOCS false).
template <int DQK> int fwd_docs(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    return a->docs ? fwd_t<DQK, 128, kFwdWarps, true>(st, a, err)
                   : fwd_t<DQK, 128, kFwdWarps, false>(st, a, err);
}

}  // namespace

int mla_tc_supported(const mla_attn *a)
{
    bool dims = (a->dqk == 192 || a->dqk == 128) && a->dv == 128;
    return a->dtype == K3RT_BF16 && dims && aligned16(a->q) && aligned16(a->k) &&
           aligned16(a->v) && aligned16(a->o) && (!a->dout || aligned16(a->dout)) &&
           (!a->dq || aligned16(a->dq)) && (!a->dk || aligned16(a->dk)) &&
           (!a->dv_out || aligned16(a->dv_out));
}

int mla_tc_fwd(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    return a->dqk == 192 ? fwd_docs<192>(st, a, err) : fwd_docs<128>(st, a, err);
}
