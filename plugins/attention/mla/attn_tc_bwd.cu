// Causal flash attention backward for bf16 on the tensor cores (tc.cuh), MLA's head widths
// (dqk, dv) = (192, 128) and (128, 128); the forward is attn_tc.cu. Two schedules:
//
//   one pass (not deterministic)  one block per (b*h, 16*NW keys), NW warps of 16 keys; the
//            query tiles (BM rows, double buffered) at and after the keys: S^T = K Q^T,
//            P^T = exp2(S^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
//            dK += dS^T Q, all per warp in registers; dS^T goes to shared memory, and one tile
//            later (behind the next tile's barrier, no barrier of its own) the block adds dS K
//            into an f32 dQ accumulator with float2 atomics (a small kernel scales it into dq).
//            Five products, the usual FLOP count; the order of the dQ sums varies between runs.
//   two passes (deterministic)  the same dK/dV kernel without the dQ stage (BM = 32), then
//            one block per (b*h, 16*NW query rows), NW warps of 16 rows whose Q fragments stay
//            in registers; key tiles of 32 (double buffered) up to the rows: S, P, dP, dS as
//            above, dQ += dS K. Each sum has a fixed order, no atomics; the price is
//            recomputing S and dP: 7 products.
// Warps whose keys all follow a tile's rows (or whose rows all precede a tile's keys) skip it.
// With packed documents (DOCS) a key block ends its query tiles at its last key's document end
// and a row block starts its key tiles at its first row's document start; a warp skips the
// tiles entirely outside its keys' (rows') documents, and the tiles a boundary crosses are
// masked per key (row), the ends (starts) kept in shared memory.
//
// Kept beside cuDNN's backward (attn_cudnn.c, faster where it runs) for the deterministic
// backward (plan.deterministic: cuDNN sums dQ with atomics; the two-pass schedule) and for bf16
// lengths that are not a multiple of 128 (the one-pass schedule).
#include "tc.cuh"

namespace {

using namespace mla_tc;

// ---- dK and dV (and the one-pass dQ stage) -----------------------------------------------------

// ATOMIC adds the dQ stage: dS^T of each tile into shared memory ([BN keys][BM rows], rows padded
// by 16 bytes, double buffered), then dQ (BM x DQK) = dS K with the warps as MW row groups of WM
// rows times CW column groups of WN columns.
template <int DQK, int DV, int NW, int BM_, bool ATOMIC, bool DOCS> struct BwdKV {
    static constexpr int THREADS = NW * 32, BN = NW * 16, BM = BM_, QS = DQK + 8, VS = DV + 8;
    static constexpr int DSS = BM + 8, WM = 32, MW = BM / WM, CW = NW / MW, WN = DQK / CW;
    static constexpr int SMEM =
        (BN * QS + BN * VS + 2 * BM * QS + 2 * BM * VS + (ATOMIC ? 2 * BN * DSS : 0)) * 2 +
        4 * BM * 4 + (DOCS ? BN * 4 : 0);
    static_assert(BN % BM == 0 && BM % 16 == 0, "key blocks begin at query tiles");
    static_assert(BN <= THREADS, "one thread per key's document end");
    static_assert(!ATOMIC || (BM % WM == 0 && NW % MW == 0 && DQK % CW == 0 && WN % 8 == 0),
                  "the dQ stage's warp grid does not divide the tile");
};

// The dQ stage of the one-pass backward: rows [r0, r0 + BM) of dQ += dS K over the block's keys
// k0 + [0, BN) (unscaled; dq_out applies the scale), added to the f32 accumulator acc (row
// pitch ld) with float2 atomics. Only the keys of warps that were live for the tile (at most the
// tile's last row, before T, and a 16-key step not wholly before `first`, the document start of
// the tile's first row) are summed: exactly the 16-key steps whose dS^T was written.
template <typename C>
__device__ __forceinline__ void dq_stage(const bf16 *sdS, const bf16 *sK, float *acc, int64_t ld,
                                         int k0, int r0, int first, int T, int warp, int lane)
{
    const int g = lane >> 2, t4 = lane & 3;
    const int ks0 = max(first - k0, 0) / 16;
    const int nks = (min(min(C::BN, r0 + C::BM - k0), T - k0) + 15) / 16;
    const int mr = (warp / C::CW) * C::WM, nc = (warp % C::CW) * C::WN;
    float d[C::WM / 16][C::WN / 8][4];
#pragma unroll
    for (int mt = 0; mt < C::WM / 16; mt++)
#pragma unroll
        for (int n = 0; n < C::WN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                d[mt][n][e] = 0.0f;
#pragma unroll 2
    for (int ks = ks0; ks < nks; ks++) {
        // A = dS (rows x keys) from its transpose; B = K (keys x columns).
        uint32_t a[C::WM / 16][4];
#pragma unroll
        for (int mt = 0; mt < C::WM / 16; mt++)
            ldsm_t(a[mt], b_addr<C::DSS>(sdS, ks * 16, mr + mt * 16, lane));
#pragma unroll
        for (int np = 0; np < C::WN / 16; np++) {
            uint32_t bb[4];
            ldsm_t(bb, bt_addr<C::QS>(sK, ks * 16, nc + np * 16, lane));
#pragma unroll
            for (int mt = 0; mt < C::WM / 16; mt++) {
                mma(d[mt][2 * np], a[mt], bb[0], bb[1]);
                mma(d[mt][2 * np + 1], a[mt], bb[2], bb[3]);
            }
        }
        if constexpr (C::WN % 16 != 0) {  // the last 8 columns
            uint32_t b2[2];
            ldsm_t2(b2, bt_addr<C::QS>(sK, ks * 16, nc + C::WN - 8, lane));
#pragma unroll
            for (int mt = 0; mt < C::WM / 16; mt++)
                mma(d[mt][C::WN / 8 - 1], a[mt], b2[0], b2[1]);
        }
    }
#pragma unroll
    for (int mt = 0; mt < C::WM / 16; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = r0 + mr + mt * 16 + g + hf * 8;
            if (row >= T)
                continue;
            float *dst = acc + (int64_t)row * ld + nc + 2 * t4;
#pragma unroll
            for (int n = 0; n < C::WN / 8; n++)
                atomicAdd(reinterpret_cast<float2 *>(dst + n * 8),
                          make_float2(d[mt][n][2 * hf], d[mt][n][2 * hf + 1]));
        }
}

template <int DQK, int DV, int NW, int BM, bool ATOMIC, bool DOCS>
__global__ void __launch_bounds__(NW * 32, 8 / NW)
kv_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
          const bf16 *__restrict__ dout, const float *__restrict__ lse,
          const float *__restrict__ drow, bf16 *__restrict__ dk, bf16 *__restrict__ dv,
          float *__restrict__ dq_acc, const int *__restrict__ docs, int n_docs, int T, int H,
          float sl2, float scale)
{
    using C = BwdKV<DQK, DV, NW, BM, ATOMIC, DOCS>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem), *sV = sK + C::BN * C::QS,
         *sQ = sV + C::BN * C::VS, *sO = sQ + 2 * C::BM * C::QS, *sdS = sO + 2 * C::BM * C::VS;
    float *sL = reinterpret_cast<float *>(sdS + (ATOMIC ? 2 * C::BN * C::DSS : 0)),
          *sD = sL + 2 * C::BM;
    int *sE = reinterpret_cast<int *>(sD + 2 * C::BM);  // DOCS: each key's document end
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int k0 = blockIdx.y * C::BN;  // the first key blocks have the most rows: first
    const int64_t ldq = (int64_t)H * DQK, ldv = (int64_t)H * DV, tok = (int64_t)b * T * H + h;
    const bf16 *Qg = q + tok * DQK, *Kg = k + tok * DQK, *Vg = v + tok * DV, *Og = dout + tok * DV;
    const float *Lg = lse + (int64_t)bh * T, *Dg = drow + (int64_t)bh * T;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int kw = warp * 16, i0 = k0 / C::BM;
    const int wkey0 = k0 + kw;  // this warp's first key
    // The rows that see the block's keys end at its last key's document end (T without
    // documents); `doc` follows the document of each tile's first row (rows only rise).
    int nqt = (T + C::BM - 1) / C::BM, doc = 0;
    if constexpr (DOCS) {
        if (tid < C::BN)
            sE[tid] = doc_span(docs, n_docs, b, T, k0 + tid).end;
        nqt = (doc_span(docs, n_docs, b, T, min(k0 + C::BN, T) - 1).end + C::BM - 1) / C::BM;
        doc = doc_index(docs, n_docs, b * T + i0 * C::BM);
    }
    // The document start of query row r, r at or after the previous call's.
    auto first_of = [&](int r) {
        if constexpr (DOCS) {
            while (doc + 1 < n_docs && docs[doc + 1] <= b * T + r)
                doc++;
            return min(max(docs[doc] - b * T, 0), r);
        } else {
            return 0;
        }
    };
    int first = first_of(i0 * C::BM), prev_first = first;

    load_tile<C::BN, DQK, C::QS, C::THREADS>(sK, Kg, ldq, k0, T, tid);
    load_tile<C::BN, DV, C::VS, C::THREADS>(sV, Vg, ldv, k0, T, tid);
    load_rows<C::BM, DQK, DV, C::QS, C::VS, C::THREADS>(sQ, sO, sL, sD, Qg, Og, Lg, Dg, ldq,
                                                        ldv, i0 * C::BM, T, tid);
    cp_async_commit();

    float dka[DQK / 8][4], dva[DV / 8][4];
#pragma unroll
    for (int n = 0; n < DQK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dka[n][e] = 0.0f;
#pragma unroll
    for (int n = 0; n < DV / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dva[n][e] = 0.0f;

    for (int i = i0; i < nqt; i++) {
        const int buf = (i - i0) & 1, r0 = i * C::BM;
        cp_async_wait_all();
        __syncthreads();  // this buffer is in; every warp is done with the other one
        if (i + 1 < nqt) {
            const int nb = buf ^ 1;
            load_rows<C::BM, DQK, DV, C::QS, C::VS, C::THREADS>(
                sQ + nb * C::BM * C::QS, sO + nb * C::BM * C::VS, sL + nb * C::BM,
                sD + nb * C::BM, Qg, Og, Lg, Dg, ldq, ldv, r0 + C::BM, T, tid);
        }
        cp_async_commit();
        const bf16 *tQ = sQ + buf * C::BM * C::QS, *tO = sO + buf * C::BM * C::VS;
        const float *tL = sL + buf * C::BM, *tD = sD + buf * C::BM;
        bf16 *tdS = sdS + buf * C::BN * C::DSS;  // this tile's dS^T (ATOMIC)
        prev_first = first, first = first_of(r0);
        // A warp whose keys all follow the tile's rows, are all past T, or all precede the
        // rows' documents has nothing to add (barriers still run for the block).
        const bool live = r0 + C::BM - 1 >= wkey0 && wkey0 < T && (!DOCS || wkey0 + 16 > first);
        if (!ATOMIC && !live)
            continue;

        // S^T = K_w Q^T and dP^T = V_w dO^T (16 keys x BM rows), one 16-deep step at a time.
        float st[C::BM / 8][4], dpt[C::BM / 8][4];
#pragma unroll
        for (int n = 0; n < C::BM / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                st[n][e] = dpt[n][e] = 0.0f;
        auto s_step = [&](int ks) {
            uint32_t a[4];
            ldsm(a, a_addr<C::QS>(sK, kw, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < C::BM / 16; np++) {
                uint32_t bb[4];
                ldsm(bb, b_addr<C::QS>(tQ, np * 16, ks * 16, lane));
                mma(st[2 * np], a, bb[0], bb[1]);
                mma(st[2 * np + 1], a, bb[2], bb[3]);
            }
        };
        auto dp_step = [&](int ks) {
            uint32_t a[4];
            ldsm(a, a_addr<C::VS>(sV, kw, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < C::BM / 16; np++) {
                uint32_t bb[4];
                ldsm(bb, b_addr<C::VS>(tO, np * 16, ks * 16, lane));
                mma(dpt[2 * np], a, bb[0], bb[1]);
                mma(dpt[2 * np + 1], a, bb[2], bb[3]);
            }
        };
        // P^T = exp2(S^T sl2 - lse2), masked to 0, in st; dS^T = P^T (dP^T - D) in dpt. A row
        // past the document of the warp's first key needs the document mask.
        const bool masked = r0 < wkey0 + 15 || r0 + C::BM > T || wkey0 + 16 > T ||
                            (DOCS && r0 + C::BM > sE[kw]);
        auto to_p = [&]() {
#pragma unroll
            for (int n = 0; n < C::BM / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = n * 8 + 2 * t4 + (e & 1), row = r0 + c;
                    const int kr = kw + g + (e >> 1) * 8, key = k0 + kr;
                    float p = ex2(st[n][e] * sl2 - tL[c]);
                    st[n][e] = masked && (row < key || row >= T || key >= T ||
                                          (DOCS && row >= sE[kr]))
                                   ? 0.0f
                                   : p;
                }
        };
        auto to_ds = [&]() {
#pragma unroll
            for (int n = 0; n < C::BM / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dpt[n][e] = st[n][e] * (dpt[n][e] - tD[n * 8 + 2 * t4 + (e & 1)]);
        };
        // dV += P^T dO;  dK += dS^T Q (the scale is applied once, at the store)
        auto dv_update = [&]() {
#pragma unroll
            for (int kk = 0; kk < C::BM / 16; kk++) {
                uint32_t pa[4];
                c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < DV / 16; dp++) {
                    uint32_t bb[4];
                    ldsm_t(bb, bt_addr<C::VS>(tO, kk * 16, dp * 16, lane));
                    mma(dva[2 * dp], pa, bb[0], bb[1]);
                    mma(dva[2 * dp + 1], pa, bb[2], bb[3]);
                }
            }
        };
        auto dk_update = [&]() {
#pragma unroll
            for (int kk = 0; kk < C::BM / 16; kk++) {
                uint32_t da[4];
                c_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
                if constexpr (ATOMIC) {  // dS^T as bf16 pairs: keys g, g+8 x rows 2t, 2t+1
                    bf16 *lo = tdS + (kw + g) * C::DSS + kk * 16 + 2 * t4,
                         *hi = lo + 8 * C::DSS;
                    *reinterpret_cast<uint32_t *>(lo) = da[0];
                    *reinterpret_cast<uint32_t *>(hi) = da[1];
                    *reinterpret_cast<uint32_t *>(lo + 8) = da[2];
                    *reinterpret_cast<uint32_t *>(hi + 8) = da[3];
                }
#pragma unroll
                for (int dp = 0; dp < DQK / 16; dp++) {
                    uint32_t bb[4];
                    ldsm_t(bb, bt_addr<C::QS>(tQ, kk * 16, dp * 16, lane));
                    mma(dka[2 * dp], da, bb[0], bb[1]);
                    mma(dka[2 * dp + 1], da, bb[2], bb[3]);
                }
            }
        };

        // dV before dP^T: P^T and dP^T are live together only briefly, which keeps the kernel
        // within 255 registers without spills (computing S^T and dP^T side by side spilled and
        // ran 7% slower at 192/128).
        if (live) {
#pragma unroll 4
            for (int ks = 0; ks < DQK / 16; ks++)
                s_step(ks);
            to_p();
            dv_update();
#pragma unroll 4
            for (int ks = 0; ks < DV / 16; ks++)
                dp_step(ks);
            to_ds();
            dk_update();
        }
        // The previous tile's dQ: its dS^T was complete at this iteration's barrier, and its
        // buffer is rewritten only after the next one. Running it here, not behind a barrier of
        // its own, lets the warps drift apart and overlap its atomics with other warps' products.
        if constexpr (ATOMIC)
            if (i > i0)
                dq_stage<C>(tdS == sdS ? sdS + C::BN * C::DSS : sdS, sK, dq_acc + tok * DQK, ldq,
                            k0, r0 - C::BM, prev_first, T, warp, lane);
    }
    if constexpr (ATOMIC) {  // the last tile's dQ
        __syncthreads();
        dq_stage<C>(sdS + ((nqt - 1 - i0) & 1) * C::BN * C::DSS, sK, dq_acc + tok * DQK, ldq, k0,
                    (nqt - 1) * C::BM, first, T, warp, lane);
    }

    bf16 *dKg = dk + tok * DQK, *dVg = dv + tok * DV;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int key = wkey0 + g + hf * 8;
        if (key >= T)
            continue;
        bf16 *kr = dKg + (int64_t)key * ldq + 2 * t4, *vr = dVg + (int64_t)key * ldv + 2 * t4;
#pragma unroll
        for (int n = 0; n < DQK / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(kr + n * 8) = __floats2bfloat162_rn(
                dka[n][2 * hf] * scale, dka[n][2 * hf + 1] * scale);
#pragma unroll
        for (int n = 0; n < DV / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(vr + n * 8) =
                __floats2bfloat162_rn(dva[n][2 * hf], dva[n][2 * hf + 1]);
    }
}

// ---- the deterministic dQ pass -----------------------------------------------------------------

template <int DQK, int DV, int NW, bool DOCS> struct BwdQ {
    static constexpr int THREADS = NW * 32, BM = NW * 16, BN = 32, QS = DQK + 8, VS = DV + 8;
    static constexpr int SMEM = (BM * QS + BM * VS + 2 * BN * QS + 2 * BN * VS) * 2 + 2 * BM * 4 +
                                (DOCS ? BM * 4 : 0);
    static_assert(BM <= THREADS, "one thread per row's document start");
};

// The warp's rows of Q are the A operand of every S product: they stay in registers (dO's
// too would spill).
template <int DQK, int DV, int NW, bool DOCS>
__global__ void __launch_bounds__(NW * 32, 8 / NW)
dq_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
          const bf16 *__restrict__ dout, const float *__restrict__ lse,
          const float *__restrict__ drow, bf16 *__restrict__ dq, const int *__restrict__ docs,
          int n_docs, int T, int H, float sl2, float scale)
{
    using C = BwdQ<DQK, DV, NW, DOCS>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem), *sO = sQ + C::BM * C::QS,
         *sK = sO + C::BM * C::VS, *sV = sK + 2 * C::BN * C::QS;
    float *sL = reinterpret_cast<float *>(sV + 2 * C::BN * C::VS), *sD = sL + C::BM;
    int *sF = reinterpret_cast<int *>(sD + C::BM);  // DOCS: each row's document start
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * C::BM;
    const int64_t ldq = (int64_t)H * DQK, ldv = (int64_t)H * DV, tok = (int64_t)b * T * H + h;
    const bf16 *Qg = q + tok * DQK, *Kg = k + tok * DQK, *Vg = v + tok * DV, *Og = dout + tok * DV;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int qw = warp * 16, wrow0 = q0 + qw;
    const int nkt = (min(T, q0 + C::BM) + C::BN - 1) / C::BN;
    int j0 = 0;  // the first key tile any row of the block sees
    if constexpr (DOCS) {
        if (tid < C::BM)
            sF[tid] = doc_span(docs, n_docs, b, T, q0 + tid).first;
        j0 = doc_span(docs, n_docs, b, T, q0).first / C::BN;
    }

    load_rows<C::BM, DQK, DV, C::QS, C::VS, C::THREADS>(sQ, sO, sL, sD, Qg, Og,
                                                        lse + (int64_t)bh * T,
                                                        drow + (int64_t)bh * T, ldq, ldv, q0, T,
                                                        tid);
    load_tile<C::BN, DQK, C::QS, C::THREADS>(sK, Kg, ldq, j0 * C::BN, T, tid);
    load_tile<C::BN, DV, C::VS, C::THREADS>(sV, Vg, ldv, j0 * C::BN, T, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    uint32_t qf[DQK / 16][4];
#pragma unroll
    for (int ks = 0; ks < DQK / 16; ks++)
        ldsm(qf[ks], a_addr<C::QS>(sQ, qw, ks * 16, lane));
    float dqa[DQK / 8][4];
#pragma unroll
    for (int n = 0; n < DQK / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dqa[n][e] = 0.0f;

    for (int j = j0; j < nkt; j++) {
        const int buf = (j - j0) & 1, k0 = j * C::BN;
        if (j + 1 < nkt) {  // every warp passed the barrier that ended its use of buf ^ 1
            const int nb = buf ^ 1;
            load_tile<C::BN, DQK, C::QS, C::THREADS>(sK + nb * C::BN * C::QS, Kg, ldq,
                                                     k0 + C::BN, T, tid);
            load_tile<C::BN, DV, C::VS, C::THREADS>(sV + nb * C::BN * C::VS, Vg, ldv, k0 + C::BN,
                                                    T, tid);
        }
        cp_async_commit();
        const bf16 *tK = sK + buf * C::BN * C::QS, *tV = sV + buf * C::BN * C::VS;

        // Rows all before the tile's keys, all past T, or all in documents that begin after
        // the tile: nothing to add.
        if (k0 <= wrow0 + 15 && wrow0 < T && (!DOCS || k0 + C::BN > sF[qw])) {
            float s[C::BN / 8][4], dp[C::BN / 8][4];
#pragma unroll
            for (int n = 0; n < C::BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = dp[n][e] = 0.0f;
            // S = Q_w K^T and dP = dO_w V^T.
            auto s_step = [&](int ks) {
#pragma unroll
                for (int np = 0; np < C::BN / 16; np++) {
                    uint32_t bb[4];
                    ldsm(bb, b_addr<C::QS>(tK, np * 16, ks * 16, lane));
                    mma(s[2 * np], qf[ks], bb[0], bb[1]);
                    mma(s[2 * np + 1], qf[ks], bb[2], bb[3]);
                }
            };
            auto dp_step = [&](int ks) {
                uint32_t a[4];
                ldsm(a, a_addr<C::VS>(sO, qw, ks * 16, lane));
#pragma unroll
                for (int np = 0; np < C::BN / 16; np++) {
                    uint32_t bb[4];
                    ldsm(bb, b_addr<C::VS>(tV, np * 16, ks * 16, lane));
                    mma(dp[2 * np], a, bb[0], bb[1]);
                    mma(dp[2 * np + 1], a, bb[2], bb[3]);
                }
            };
#pragma unroll
            for (int ks = 0; ks < DQK / 16; ks++)
                s_step(ks);
#pragma unroll 4
            for (int ks = 0; ks < DV / 16; ks++)
                dp_step(ks);
            // dS = P (dP - D), P = exp2(S sl2 - lse2), masked to 0.
            const bool masked = k0 + C::BN - 1 > wrow0 || k0 + C::BN > T || wrow0 + 16 > T ||
                                (DOCS && k0 < sF[qw + 15]);
#pragma unroll
            for (int n = 0; n < C::BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = qw + g + (e >> 1) * 8, row = q0 + r;
                    const int key = k0 + n * 8 + 2 * t4 + (e & 1);
                    float p = ex2(s[n][e] * sl2 - sL[r]);
                    if (masked && (key > row || key >= T || row >= T || (DOCS && key < sF[r])))
                        p = 0.0f;
                    s[n][e] = p * (dp[n][e] - sD[r]);
                }
            // dQ += dS K
#pragma unroll
            for (int kk = 0; kk < C::BN / 16; kk++) {
                uint32_t da[4];
                c_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int d = 0; d < DQK / 16; d++) {
                    uint32_t bb[4];
                    ldsm_t(bb, bt_addr<C::QS>(tK, kk * 16, d * 16, lane));
                    mma(dqa[2 * d], da, bb[0], bb[1]);
                    mma(dqa[2 * d + 1], da, bb[2], bb[3]);
                }
            }
        }
        cp_async_wait_all();  // the next tile
        __syncthreads();      // ... for every warp, and every warp is done with this one
    }

    bf16 *dQg = dq + tok * DQK;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int row = wrow0 + g + hf * 8;
        if (row >= T)
            continue;
        bf16 *qr = dQg + (int64_t)row * ldq + 2 * t4;
#pragma unroll
        for (int n = 0; n < DQK / 8; n++)
            *reinterpret_cast<__nv_bfloat162 *>(qr + n * 8) = __floats2bfloat162_rn(
                dqa[n][2 * hf] * scale, dqa[n][2 * hf + 1] * scale);
    }
}

// ---- launchers --------------------------------------------------------------------------------

// f32 dQ accumulator -> dq as bf16, times the softmax scale; 4 elements per thread and step.
__global__ void dq_out_kernel(const float4 *__restrict__ acc, uint2 *__restrict__ dq, int64_t n4,
                              float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = acc[i];
        uint2 y;
        y.x = pack(x.x * scale, x.y * scale);
        y.y = pack(x.z * scale, x.w * scale);
        dq[i] = y;
    }
}

template <int DQK, int DV, int NW, bool DOCS>
int two_pass(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    using KV = BwdKV<DQK, DV, NW, 32, false, DOCS>;
    using Q = BwdQ<DQK, DV, NW, DOCS>;
    const float sl2 = (float)(a->scale * kLog2e), scale = (float)a->scale;
    const unsigned bh = (unsigned)(a->B * a->H);
    K3RT_TRY(allow_smem(kv_kernel<DQK, DV, NW, 32, false, DOCS>, KV::SMEM, err));
    K3RT_TRY(allow_smem(dq_kernel<DQK, DV, NW, DOCS>, Q::SMEM, err));
    kv_kernel<DQK, DV, NW, 32, false, DOCS>
        <<<dim3(bh, (unsigned)((a->T + KV::BN - 1) / KV::BN)), KV::THREADS, KV::SMEM, st>>>(
            (const bf16 *)a->q, (const bf16 *)a->k, (const bf16 *)a->v, (const bf16 *)a->dout,
            a->lse, a->drow, (bf16 *)a->dk, (bf16 *)a->dv_out, nullptr, a->docs,
            (int)a->n_docs, (int)a->T, (int)a->H, sl2, scale);
    MLA_LAUNCHED("mla kv_kernel (dK, dV)");
    dq_kernel<DQK, DV, NW, DOCS><<<dim3(bh, (unsigned)((a->T + Q::BM - 1) / Q::BM)), Q::THREADS,
                                   Q::SMEM, st>>>(
        (const bf16 *)a->q, (const bf16 *)a->k, (const bf16 *)a->v, (const bf16 *)a->dout,
        a->lse, a->drow, (bf16 *)a->dq, a->docs, (int)a->n_docs, (int)a->T, (int)a->H, sl2,
        scale);
    MLA_LAUNCHED("mla dq_kernel");
    return K3RT_OK;
}

template <int DQK, int DV, int NW, int BM, bool DOCS>
int one_pass(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    using KV = BwdKV<DQK, DV, NW, BM, true, DOCS>;
    const float sl2 = (float)(a->scale * kLog2e), scale = (float)a->scale;
    const unsigned bh = (unsigned)(a->B * a->H);
    const int64_t n = a->B * a->T * a->H * DQK;  // a multiple of 4: DQK is
    K3RT_TRY(allow_smem(kv_kernel<DQK, DV, NW, BM, true, DOCS>, KV::SMEM, err));
    MLA_CU_TRY(cudaMemsetAsync(a->dq_acc, 0, (size_t)n * sizeof(float), st),
               "cudaMemsetAsync (the dQ accumulator)");
    kv_kernel<DQK, DV, NW, BM, true, DOCS>
        <<<dim3(bh, (unsigned)((a->T + KV::BN - 1) / KV::BN)), KV::THREADS, KV::SMEM, st>>>(
            (const bf16 *)a->q, (const bf16 *)a->k, (const bf16 *)a->v, (const bf16 *)a->dout,
            a->lse, a->drow, (bf16 *)a->dk, (bf16 *)a->dv_out, a->dq_acc, a->docs,
            (int)a->n_docs, (int)a->T, (int)a->H, sl2, scale);
    MLA_LAUNCHED("mla kv_kernel (dK, dV, atomic dQ)");
    const int64_t n4 = n / 4, blocks = (n4 + 255) / 256;
    dq_out_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(
        (const float4 *)a->dq_acc, (uint2 *)a->dq, n4, scale);
    MLA_LAUNCHED("mla dq_out_kernel");
    return K3RT_OK;
}

// Warps per block, measured on the H200 (B=8, T=4096, H=8, 192/128): the two-pass backward is
// 5-7% faster with 8 than with 4 (one block per multiprocessor; the shared tiles are read from
// L2 half as often, and the dK/dV pass no longer spills).
constexpr int kBwdWarps = 8;
// Query rows per tile of the one-pass backward, measured on the H200 (fwd+bwd, B=8, T=4096):
// at 128/128 (H=16) 64 rows took 8.47 ms against 9.54 with 32 (dQ stage not yet deferred; each
// K and V fragment feeds twice the products, half the barriers per row); at 192/128 (H=8) 64
// rows spill (88 bytes even with P kept as bf16 and dQ in column slices): 5.97 ms against 5.67.
constexpr int kRows192 = 32, kRows128 = 64;

// One schedule at DQK, with or without documents (DOCS false has none of their loads and
// compares).
template <int DQK, int ROWS>
int bwd_t(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    if (a->deterministic)
        return a->docs ? two_pass<DQK, 128, kBwdWarps, true>(st, a, err)
                       : two_pass<DQK, 128, kBwdWarps, false>(st, a, err);
    return a->docs ? one_pass<DQK, 128, kBwdWarps, ROWS, true>(st, a, err)
                   : one_pass<DQK, 128, kBwdWarps, ROWS, false>(st, a, err);
}

}  // namespace

int mla_tc_bwd(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    return a->dqk == 192 ? bwd_t<192, kRows192>(st, a, err) : bwd_t<128, kRows128>(st, a, err);
}
