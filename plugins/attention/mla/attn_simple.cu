// Causal attention in fp32 arithmetic for any head widths (f32 data, and bf16 data whose widths
// the tensor-core kernels do not take). Tiles of 32 rows and 32 keys in shared memory as
// floats; 8 warps, each owning 4 rows (or 4 keys), a lane per key (or per query row) for the
// dot products and a lane per column for the accumulations. Every sum runs in a fixed order.
//
//   forward  one block per (b*h, 32 rows): online softmax over the key tiles up to the rows.
//   dK, dV   one block per (b*h, 32 keys) over the query tiles at and after the keys.
//   dQ       one block per (b*h, 32 rows) over the key tiles up to the rows.
// Row strides of tiles read by lane-per-row dot products are odd, so the lanes hit different
// banks. Packed documents (DOCS, docs not NULL) bound the loops by the documents of the block's
// first row (last key) and mask per row (key); without them (DOCS false) the kernels compile
// to what they were before documents, doc_span folding to the whole row.
//
// Kept for f32 runs (cuDNN's fused attention and the tensor-core kernels are bf16 only) and for
// bf16 head widths other than (192, 128) and (128, 128).
#include "cuda_common.cuh"

namespace {

constexpr int kTile = 32, kWarps = 8, kThreads = kWarps * 32, kRows = kTile / kWarps;

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Rows [r0, r0 + kTile) of a [T, ld] matrix, w values per row, into floats of row stride s;
// rows at or past T are zeros.
template <typename E>
__device__ void load_rows(float *dst, int s, const E *src, int64_t ld, int w, int r0, int T)
{
    for (int i = threadIdx.x; i < kTile * w; i += kThreads) {
        int r = i / w, c = i % w, row = r0 + r;
        dst[r * s + c] = row < T ? to_f(src[(int64_t)row * ld + c]) : 0.0f;
    }
}

__device__ void zero(float *p, int n)
{
    for (int i = threadIdx.x; i < n; i += kThreads)
        p[i] = 0.0f;
}

// Shared floats of each kernel (also checked against the device limit before launching).
inline int64_t fwd_floats(int64_t dqk, int64_t dv)
{
    return kTile * (dqk + (dqk | 1) + 2 * dv) + kWarps * kRows * kTile + kWarps;
}
inline int64_t dkdv_floats(int64_t dqk, int64_t dv)
{
    return kTile * (2 * dqk + 2 * dv + (dqk | 1) + (dv | 1)) + 2 * kTile +
           2 * kWarps * kRows * kTile;
}
inline int64_t dq_floats(int64_t dqk, int64_t dv)
{
    return kTile * (2 * dqk + dv + (dqk | 1) + (dv | 1)) + 2 * kTile + kWarps * kRows * kTile;
}

template <typename E, bool DOCS>
__global__ void __launch_bounds__(kThreads)
simple_fwd(const E *q, const E *k, const E *v, E *o, float *lse, float *bmax, const int *docs,
           int n_docs, int T, int H, int dqk, int dv, float scale)
{
    if constexpr (!DOCS)
        docs = nullptr;  // doc_span folds to the whole row
    extern __shared__ float sm[];
    const int ks = dqk | 1;
    float *sQ = sm, *sK = sQ + kTile * dqk, *sV = sK + kTile * ks, *sO = sV + kTile * dv;
    float *sP = sO + kTile * dv, *sMax = sP + kWarps * kRows * kTile;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
    const int64_t ldq = (int64_t)H * dqk, ldv = (int64_t)H * dv, tok = (int64_t)b * T * H + h;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    load_rows(sQ, dqk, q + tok * dqk, ldq, dqk, q0, T);
    zero(sO, kTile * dv);
    float m[kRows], l[kRows];
    int first[kRows];  // each row's first key
#pragma unroll
    for (int rr = 0; rr < kRows; rr++) {
        m[rr] = -INFINITY, l[rr] = 0.0f;
        first[rr] = doc_span(docs, n_docs, b, T, q0 + warp * kRows + rr).first;
    }
    const int nkt = (min(T, q0 + kTile) + kTile - 1) / kTile;
    for (int j = doc_span(docs, n_docs, b, T, q0).first / kTile; j < nkt; j++) {
        const int k0 = j * kTile, key = k0 + lane;
        __syncthreads();  // the previous tile's readers are done
        load_rows(sK, ks, k + tok * dqk, ldq, dqk, k0, T);
        load_rows(sV, dv, v + tok * dv, ldv, dv, k0, T);
        __syncthreads();
        float alpha[kRows];
#pragma unroll
        for (int rr = 0; rr < kRows; rr++) {
            const int r = warp * kRows + rr, row = q0 + r;
            float s = 0.0f;
            for (int c = 0; c < dqk; c++)
                s += sQ[r * dqk + c] * sK[lane * ks + c];
            const bool ok = key <= row && key < T && key >= first[rr];
            const float x = ok ? s * scale : -INFINITY;
            const float mn = fmaxf(m[rr], warp_max(x)), base = mn == -INFINITY ? 0.0f : mn;
            const float p = ok ? expf(x - base) : 0.0f;
            alpha[rr] = expf(m[rr] - base);
            l[rr] = l[rr] * alpha[rr] + warp_sum(p);
            m[rr] = mn;
            sP[r * kTile + lane] = p;
        }
        __syncwarp();
        for (int c = lane; c < dv; c += 32)
#pragma unroll
            for (int rr = 0; rr < kRows; rr++) {
                const int r = warp * kRows + rr;
                float acc = sO[r * dv + c] * alpha[rr];
                for (int kk = 0; kk < kTile; kk++)
                    acc += sP[r * kTile + kk] * sV[kk * dv + c];
                sO[r * dv + c] = acc;
            }
        __syncwarp();
    }
    float wmax = -INFINITY;
#pragma unroll
    for (int rr = 0; rr < kRows; rr++) {
        const int r = warp * kRows + rr, row = q0 + r;
        if (row >= T)
            continue;
        const float inv = 1.0f / l[rr];
        E *orow = o + tok * dv + (int64_t)row * ldv;
        for (int c = lane; c < dv; c += 32)
            orow[c] = from_f<E>(sO[r * dv + c] * inv);
        if (lane == 0)
            lse[(int64_t)bh * T + row] = m[rr] + logf(l[rr]);
        wmax = nan_max(wmax, l[rr] != l[rr] ? l[rr] : m[rr]);
    }
    if (lane == 0)
        sMax[warp] = wmax;
    __syncthreads();
    if (threadIdx.x == 0 && bmax) {
        float bm = -INFINITY;
        for (int w = 0; w < kWarps; w++)
            bm = nan_max(bm, sMax[w]);
        bmax[(int64_t)bh * ((T + kTile - 1) / kTile) + q0 / kTile] = bm;
    }
}

template <typename E, bool DOCS>
__global__ void __launch_bounds__(kThreads)
simple_dkdv(const E *q, const E *k, const E *v, const E *dout, const float *lse,
            const float *drow, E *dk, E *dvo, const int *docs, int n_docs, int T, int H, int dqk,
            int dv, float scale)
{
    if constexpr (!DOCS)
        docs = nullptr;  // doc_span folds to the whole row
    extern __shared__ float sm[];
    const int qs = dqk | 1, os = dv | 1;
    float *sK = sm, *sV = sK + kTile * dqk, *sQ = sV + kTile * dv, *sO = sQ + kTile * qs;
    float *sL = sO + kTile * os, *sD = sL + kTile, *sdK = sD + kTile, *sdV = sdK + kTile * dqk;
    float *sP = sdV + kTile * dv, *sS = sP + kWarps * kRows * kTile;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, k0 = blockIdx.y * kTile;
    const int64_t ldq = (int64_t)H * dqk, ldv = (int64_t)H * dv, tok = (int64_t)b * T * H + h;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    load_rows(sK, dqk, k + tok * dqk, ldq, dqk, k0, T);
    load_rows(sV, dv, v + tok * dv, ldv, dv, k0, T);
    zero(sdK, kTile * dqk);
    zero(sdV, kTile * dv);
    int end[kRows];  // the rows that see each key end here
#pragma unroll
    for (int rr = 0; rr < kRows; rr++)
        end[rr] = doc_span(docs, n_docs, b, T, k0 + warp * kRows + rr).end;
    const int nqt = (doc_span(docs, n_docs, b, T, min(k0 + kTile, T) - 1).end + kTile - 1) / kTile;
    for (int i = k0 / kTile; i < nqt; i++) {
        const int r0 = i * kTile, row = r0 + lane;
        __syncthreads();
        load_rows(sQ, qs, q + tok * dqk, ldq, dqk, r0, T);
        load_rows(sO, os, dout + tok * dv, ldv, dv, r0, T);
        if (threadIdx.x < kTile) {
            const int rr = r0 + threadIdx.x;
            sL[threadIdx.x] = rr < T ? lse[(int64_t)bh * T + rr] : 0.0f;
            sD[threadIdx.x] = rr < T ? drow[(int64_t)bh * T + rr] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < kRows; rr++) {
            const int kr = warp * kRows + rr, key = k0 + kr;
            float s = 0.0f, dp = 0.0f;
            for (int c = 0; c < dqk; c++)
                s += sQ[lane * qs + c] * sK[kr * dqk + c];
            for (int c = 0; c < dv; c++)
                dp += sO[lane * os + c] * sV[kr * dv + c];
            const bool ok = row < T && key <= row && key < T && row < end[rr];
            const float p = ok ? expf(s * scale - sL[lane]) : 0.0f;
            sP[kr * kTile + lane] = p;
            sS[kr * kTile + lane] = p * (dp - sD[lane]);
        }
        __syncwarp();
        for (int c = lane; c < dv; c += 32)
#pragma unroll
            for (int rr = 0; rr < kRows; rr++) {
                const int kr = warp * kRows + rr;
                float acc = sdV[kr * dv + c];
                for (int j = 0; j < kTile; j++)
                    acc += sP[kr * kTile + j] * sO[j * os + c];
                sdV[kr * dv + c] = acc;
            }
        for (int c = lane; c < dqk; c += 32)
#pragma unroll
            for (int rr = 0; rr < kRows; rr++) {
                const int kr = warp * kRows + rr;
                float acc = sdK[kr * dqk + c];
                for (int j = 0; j < kTile; j++)
                    acc += sS[kr * kTile + j] * sQ[j * qs + c];
                sdK[kr * dqk + c] = acc;
            }
        __syncwarp();
    }
#pragma unroll
    for (int rr = 0; rr < kRows; rr++) {
        const int kr = warp * kRows + rr, key = k0 + kr;
        if (key >= T)
            continue;
        for (int c = lane; c < dqk; c += 32)
            dk[tok * dqk + (int64_t)key * ldq + c] = from_f<E>(sdK[kr * dqk + c] * scale);
        for (int c = lane; c < dv; c += 32)
            dvo[tok * dv + (int64_t)key * ldv + c] = from_f<E>(sdV[kr * dv + c]);
    }
}

template <typename E, bool DOCS>
__global__ void __launch_bounds__(kThreads)
simple_dq(const E *q, const E *k, const E *v, const E *dout, const float *lse, const float *drow,
          E *dq, const int *docs, int n_docs, int T, int H, int dqk, int dv, float scale)
{
    if constexpr (!DOCS)
        docs = nullptr;  // doc_span folds to the whole row
    extern __shared__ float sm[];
    const int ks = dqk | 1, vs = dv | 1;
    float *sQ = sm, *sO = sQ + kTile * dqk, *sK = sO + kTile * dv, *sV = sK + kTile * ks;
    float *sL = sV + kTile * vs, *sD = sL + kTile, *sdQ = sD + kTile, *sS = sdQ + kTile * dqk;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
    const int64_t ldq = (int64_t)H * dqk, ldv = (int64_t)H * dv, tok = (int64_t)b * T * H + h;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    load_rows(sQ, dqk, q + tok * dqk, ldq, dqk, q0, T);
    load_rows(sO, dv, dout + tok * dv, ldv, dv, q0, T);
    if (threadIdx.x < kTile) {
        const int row = q0 + threadIdx.x;
        sL[threadIdx.x] = row < T ? lse[(int64_t)bh * T + row] : 0.0f;
        sD[threadIdx.x] = row < T ? drow[(int64_t)bh * T + row] : 0.0f;
    }
    zero(sdQ, kTile * dqk);
    int first[kRows];  // each row's first key
#pragma unroll
    for (int rr = 0; rr < kRows; rr++)
        first[rr] = doc_span(docs, n_docs, b, T, q0 + warp * kRows + rr).first;
    const int nkt = (min(T, q0 + kTile) + kTile - 1) / kTile;
    for (int j = doc_span(docs, n_docs, b, T, q0).first / kTile; j < nkt; j++) {
        const int k0 = j * kTile, key = k0 + lane;
        __syncthreads();
        load_rows(sK, ks, k + tok * dqk, ldq, dqk, k0, T);
        load_rows(sV, vs, v + tok * dv, ldv, dv, k0, T);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < kRows; rr++) {
            const int r = warp * kRows + rr, row = q0 + r;
            float s = 0.0f, dp = 0.0f;
            for (int c = 0; c < dqk; c++)
                s += sQ[r * dqk + c] * sK[lane * ks + c];
            for (int c = 0; c < dv; c++)
                dp += sO[r * dv + c] * sV[lane * vs + c];
            const bool ok = row < T && key <= row && key >= first[rr];
            const float p = ok ? expf(s * scale - sL[r]) : 0.0f;
            sS[r * kTile + lane] = p * (dp - sD[r]);
        }
        __syncwarp();
        for (int c = lane; c < dqk; c += 32)
#pragma unroll
            for (int rr = 0; rr < kRows; rr++) {
                const int r = warp * kRows + rr;
                float acc = sdQ[r * dqk + c];
                for (int kk = 0; kk < kTile; kk++)
                    acc += sS[r * kTile + kk] * sK[kk * ks + c];
                sdQ[r * dqk + c] = acc;
            }
        __syncwarp();
    }
#pragma unroll
    for (int rr = 0; rr < kRows; rr++) {
        const int r = warp * kRows + rr, row = q0 + r;
        if (row >= T)
            continue;
        for (int c = lane; c < dqk; c += 32)
            dq[tok * dqk + (int64_t)row * ldq + c] = from_f<E>(sdQ[r * dqk + c] * scale);
    }
}

int smem_for(int64_t floats, const mla_attn *a, const char *which, int *bytes, k3rt_error *err)
{
    int limit;
    K3RT_TRY(mla_smem_limit(&limit, err));
    if (floats * 4 > limit)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                         "mla attention: head widths dqk %lld and dv %lld need %lld bytes of "
                         "shared memory in the fp32 %s kernel; this device allows %d",
                         (long long)a->dqk, (long long)a->dv, (long long)(floats * 4), which,
                         limit);
    *bytes = (int)(floats * 4);
    return K3RT_OK;
}

template <typename K> int allow(K kernel, int bytes, k3rt_error *err)
{
    MLA_CU_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "cudaFuncSetAttribute (shared memory of the fp32 attention kernels)");
    return K3RT_OK;
}

template <typename E, bool DOCS> int fwd_t(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    int bytes = 0;
    K3RT_TRY(smem_for(fwd_floats(a->dqk, a->dv), a, "forward", &bytes, err));
    K3RT_TRY(allow(simple_fwd<E, DOCS>, bytes, err));
    dim3 grid((unsigned)(a->B * a->H), (unsigned)((a->T + kTile - 1) / kTile));
    simple_fwd<E, DOCS><<<grid, kThreads, bytes, st>>>(
        (const E *)a->q, (const E *)a->k, (const E *)a->v, (E *)a->o, a->lse, a->block_max,
        a->docs, (int)a->n_docs, (int)a->T, (int)a->H, (int)a->dqk, (int)a->dv,
        (float)a->scale);
    MLA_LAUNCHED("mla simple_fwd");
    return K3RT_OK;
}

template <typename E, bool DOCS> int bwd_t(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    int bkv = 0, bq = 0;
    K3RT_TRY(smem_for(dkdv_floats(a->dqk, a->dv), a, "dK/dV", &bkv, err));
    K3RT_TRY(smem_for(dq_floats(a->dqk, a->dv), a, "dQ", &bq, err));
    K3RT_TRY(allow(simple_dkdv<E, DOCS>, bkv, err));
    K3RT_TRY(allow(simple_dq<E, DOCS>, bq, err));
    dim3 grid((unsigned)(a->B * a->H), (unsigned)((a->T + kTile - 1) / kTile));
    simple_dkdv<E, DOCS><<<grid, kThreads, bkv, st>>>(
        (const E *)a->q, (const E *)a->k, (const E *)a->v, (const E *)a->dout, a->lse, a->drow,
        (E *)a->dk, (E *)a->dv_out, a->docs, (int)a->n_docs, (int)a->T, (int)a->H,
        (int)a->dqk, (int)a->dv, (float)a->scale);
    MLA_LAUNCHED("mla simple_dkdv");
    simple_dq<E, DOCS><<<grid, kThreads, bq, st>>>(
        (const E *)a->q, (const E *)a->k, (const E *)a->v, (const E *)a->dout, a->lse, a->drow,
        (E *)a->dq, a->docs, (int)a->n_docs, (int)a->T, (int)a->H, (int)a->dqk, (int)a->dv,
        (float)a->scale);
    MLA_LAUNCHED("mla simple_dq");
    return K3RT_OK;
}

}  // namespace

int mla_simple_fwd(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    if (a->dtype == K3RT_BF16)
        return a->docs ? fwd_t<bf16, true>(st, a, err) : fwd_t<bf16, false>(st, a, err);
    return a->docs ? fwd_t<float, true>(st, a, err) : fwd_t<float, false>(st, a, err);
}

int mla_simple_bwd(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    if (a->dtype == K3RT_BF16)
        return a->docs ? bwd_t<bf16, true>(st, a, err) : bwd_t<bf16, false>(st, a, err);
    return a->docs ? bwd_t<float, true>(st, a, err) : bwd_t<float, false>(st, a, err);
}
