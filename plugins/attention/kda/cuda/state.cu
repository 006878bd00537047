// The sequential state passes of KDA (kda_cuda.h): forward (Δ, O, chunk-start states, final
// state) and the backward's reverse pass (dΔ, the gradient at each chunk's end, dS0), on the
// tensor cores for bf16 (one warp per 16 value columns, the state in registers) and in fp32 FMA
// for float; and the affine summary of a span (§6.1) in fp32 FMA for either.
//
// Tensor-core forward, per chunk and warp (S^T: 16 value rows v x D key columns j, fp32 C
// fragments; SA its bf16 A fragments):
//   Δ^T = U^T - SA W^T                    N = 64 tokens, K = D
//   O   = Qg S + Aqk Δ                    M = 64 tokens, N = 16 v; S and Δ enter as B fragments
//                                         taken from the A fragments of S^T and Δ^T
//   S^T = S^T Diag(γ) + Δ^T Kb            N = D, K = 64
// Reverse, with dS^T the gradient of the state at the chunk's end:
//   dΔ^T = dO^T Aqk + dS^T Kb^T           (Aqk lower triangular: blocks above skipped)
//   dS^T = dS^T Diag(γ) + dO^T Qg - dΔ^T W
// Shared memory: two stages of (W, Qg, Kb [64][D], Aqk [64][64], U^T or dO tile, γ); the next
// chunk's stage loads with cp.async while the current one is computed.
#include "common.cuh"

namespace kdacu {
namespace {

template <int D, int NW> struct StL {
    static constexpr int LD = D + 8, LDA = C + 8, LDO = 16 * NW + 8;
    static constexpr int TILE = C * LD;  // elements
    static constexpr size_t FWD_STAGE = (size_t)(3 * TILE + C * LDA + 16 * NW * LDA) * 2 + D * 4;
    static constexpr size_t BWD_STAGE = (size_t)(3 * TILE + C * LDA + C * LDO) * 2 + D * 4;
};

struct StateArgs {
    Seqs seqs;
    int HV;
    const void *Qg, *Kb, *W, *A, *Ut;
    const float *gam;
    const float *s0;
    void *o;
    float *s_final;
    void *St, *Dt;
    // reverse
    const void *d_o;
    const float *d_s_final;
    float *d_s0;
    void *dSt, *dDt;
};

template <int D, int NW>
__global__ void __launch_bounds__(NW * 32) state_fwd_tc(StateArgs sa)
{
    using L = StL<D, NW>;
    constexpr int LD = L::LD, LDA = L::LDA, NTH = NW * 32, KS = D / 16, NTD = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int doc = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x, warp = tid >> 5,
              lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int HV = sa.HV, vt0 = blockIdx.z * 16 * NW, v0 = vt0 + 16 * warp;
    int64_t t0, len, c0, nch;
    seq_info(sa.seqs, doc, t0, len, c0, nch);

    auto stage = [&](int s) { return smem + (size_t)s * L::FWD_STAGE; };
    auto load = [&](int s, int64_t c) {
        bf16 *W = reinterpret_cast<bf16 *>(stage(s)), *Q = W + L::TILE, *K = Q + L::TILE,
             *A = K + L::TILE, *U = A + C * LDA;
        float *gm = reinterpret_cast<float *>(U + 16 * NW * LDA);
        const int64_t ch = c * HV + hv;
        tile_in<bf16>(W, LD, (const bf16 *)sa.W + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(Q, LD, (const bf16 *)sa.Qg + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(K, LD, (const bf16 *)sa.Kb + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(A, LDA, (const bf16 *)sa.A + ch * C * C, C, C, C, C, tid, NTH);
        tile_in<bf16>(U, LDA, (const bf16 *)sa.Ut + (ch * D + vt0) * C, C, 16 * NW, C, 16 * NW,
                      tid, NTH);
        for (int i = tid; i < D / 4; i += NTH)
            cp_async16(gm + 4 * i, sa.gam + ch * D + 4 * i, true);
        cp_async_commit();
    };

    float S[NTD][4];
    const int64_t si = slot_in(sa.seqs, doc), so = slot_out(sa.seqs, doc);
    const float *s0 = sa.s0 && si >= 0 ? sa.s0 + (si * HV + hv) * D * D : nullptr;
#pragma unroll
    for (int nt = 0; nt < NTD; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            S[nt][e] = s0 ? s0[fcol(lane, nt, e) * D + v0 + frow(lane, e)] : 0.0f;

    if (nch > 0)
        load(0, c0);
    for (int64_t i = 0; i < nch; i++) {
        const int64_t c = c0 + i, ch = c * HV + hv, tc0 = t0 + i * C;
        const int nval = (int)min((int64_t)C, len - i * C);
        if (i + 1 < nch) {
            load((int)((i + 1) & 1), c + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *W = reinterpret_cast<const bf16 *>(stage((int)(i & 1))), *Q = W + L::TILE,
                   *K = Q + L::TILE, *A = K + L::TILE, *U = A + C * LDA;
        const float *gm = reinterpret_cast<const float *>(U + 16 * NW * LDA);

        uint32_t SA[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            c_to_a(SA[kk], S[2 * kk], S[2 * kk + 1]);
        {  // the chunk-start state, as the products use it
            uint32_t *st = reinterpret_cast<uint32_t *>((bf16 *)sa.St + (ch * D + v0) * D);
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                st[(g4 * D + kk * 16 + 2 * t4) / 2] = SA[kk][0];
                st[((g4 + 8) * D + kk * 16 + 2 * t4) / 2] = SA[kk][1];
                st[(g4 * D + kk * 16 + 8 + 2 * t4) / 2] = SA[kk][2];
                st[((g4 + 8) * D + kk * 16 + 8 + 2 * t4) / 2] = SA[kk][3];
            }
        }
        // Δ^T = U^T - S^T W^T
        float P[8][4];
        zero(P);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int p = 0; p < 4; p++) {
                uint32_t b[4];
                ldsm(b, W + (p * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                            ((lane >> 3) & 1) * 8);
                mma(P[2 * p], SA[kk], b[0], b[1]);
                mma(P[2 * p + 1], SA[kk], b[2], b[3]);
            }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                P[nt][e] = __bfloat162float(U[(16 * warp + frow(lane, e)) * LDA + fcol(lane, nt, e)]) -
                           P[nt][e];
        uint32_t DA[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            c_to_a(DA[kk], P[2 * kk], P[2 * kk + 1]);
        {
            uint32_t *dt = reinterpret_cast<uint32_t *>((bf16 *)sa.Dt + (ch * D + v0) * C);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                dt[(g4 * C + kk * 16 + 2 * t4) / 2] = DA[kk][0];
                dt[((g4 + 8) * C + kk * 16 + 2 * t4) / 2] = DA[kk][1];
                dt[(g4 * C + kk * 16 + 8 + 2 * t4) / 2] = DA[kk][2];
                dt[((g4 + 8) * C + kk * 16 + 8 + 2 * t4) / 2] = DA[kk][3];
            }
        }
        // O = Qg S + Aqk Δ, 16 token rows at a time
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            float o2[2][4];
            zero(o2);
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t a[4];
                ldsm(a, Q + (mt * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
                mma(o2[0], a, SA[kk][0], SA[kk][2]);
                mma(o2[1], a, SA[kk][1], SA[kk][3]);
            }
#pragma unroll
            for (int kk = 0; kk <= mt; kk++) {
                uint32_t a[4];
                ldsm(a, A + (mt * 16 + (lane & 15)) * LDA + kk * 16 + (lane >> 4) * 8);
                mma(o2[0], a, DA[kk][0], DA[kk][2]);
                mma(o2[1], a, DA[kk][1], DA[kk][3]);
            }
#pragma unroll
            for (int nn = 0; nn < 2; nn++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    int r = mt * 16 + frow(lane, e);
                    if (r < nval)
                        *reinterpret_cast<uint32_t *>((bf16 *)sa.o + ((tc0 + r) * HV + hv) * D +
                                                      v0 + nn * 8 + 2 * t4) =
                            pack(o2[nn][e], o2[nn][e + 1]);
                }
        }
        // S^T <- S^T Diag(γ) + Δ^T Kb
#pragma unroll
        for (int nt = 0; nt < NTD; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[nt][e] *= gm[fcol(lane, nt, e)];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int p = 0; p < D / 16; p++) {
                uint32_t b[4];
                ldsm_t(b, K + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + p * 16 +
                              (lane >> 4) * 8);
                mma(S[2 * p], DA[kk], b[0], b[1]);
                mma(S[2 * p + 1], DA[kk], b[2], b[3]);
            }
        __syncthreads();  // the stage is reloaded two chunks on
    }
    if (sa.s_final && so >= 0) {
        float *sf = sa.s_final + (so * HV + hv) * D * D;
#pragma unroll
        for (int nt = 0; nt < NTD; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sf[fcol(lane, nt, e) * D + v0 + frow(lane, e)] = S[nt][e];
    }
}

template <int D, int NW>
__global__ void __launch_bounds__(NW * 32) state_bwd_tc(StateArgs sa)
{
    using L = StL<D, NW>;
    constexpr int LD = L::LD, LDA = L::LDA, LDO = L::LDO, NTH = NW * 32, KS = D / 16, NTD = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int doc = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x, warp = tid >> 5,
              lane = tid & 31, g4 = lane >> 2, t4 = lane & 3;
    const int HV = sa.HV, vt0 = blockIdx.z * 16 * NW, v0 = vt0 + 16 * warp;
    int64_t t0, len, c0, nch;
    seq_info(sa.seqs, doc, t0, len, c0, nch);

    auto stage = [&](int s) { return smem + (size_t)s * L::BWD_STAGE; };
    auto load = [&](int s, int64_t i) {
        const int64_t c = c0 + i, ch = c * HV + hv, tc0 = t0 + i * C;
        const int nval = (int)min((int64_t)C, len - i * C);
        bf16 *W = reinterpret_cast<bf16 *>(stage(s)), *Q = W + L::TILE, *K = Q + L::TILE,
             *A = K + L::TILE, *O = A + C * LDA;
        float *gm = reinterpret_cast<float *>(O + C * LDO);
        tile_in<bf16>(W, LD, (const bf16 *)sa.W + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(Q, LD, (const bf16 *)sa.Qg + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(K, LD, (const bf16 *)sa.Kb + ch * C * D, D, C, D, C, tid, NTH);
        tile_in<bf16>(A, LDA, (const bf16 *)sa.A + ch * C * C, C, C, C, C, tid, NTH);
        tile_in<bf16>(O, LDO, (const bf16 *)sa.d_o + (tc0 * HV + hv) * D + vt0, (int64_t)HV * D, C,
                      16 * NW, nval, tid, NTH);
        for (int x = tid; x < D / 4; x += NTH)
            cp_async16(gm + 4 * x, sa.gam + ch * D + 4 * x, true);
        cp_async_commit();
    };

    float dS[NTD][4];
    const int64_t si = slot_in(sa.seqs, doc), so = slot_out(sa.seqs, doc);
    const float *dsf = sa.d_s_final && so >= 0 ? sa.d_s_final + (so * HV + hv) * D * D : nullptr;
#pragma unroll
    for (int nt = 0; nt < NTD; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dS[nt][e] = dsf ? dsf[fcol(lane, nt, e) * D + v0 + frow(lane, e)] : 0.0f;

    if (nch > 0)
        load((int)((nch - 1) & 1), nch - 1);
    for (int64_t i = nch - 1; i >= 0; i--) {
        const int64_t ch = (c0 + i) * HV + hv;
        if (i > 0) {
            load((int)((i - 1) & 1), i - 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *W = reinterpret_cast<const bf16 *>(stage((int)(i & 1))), *Q = W + L::TILE,
                   *K = Q + L::TILE, *A = K + L::TILE, *O = A + C * LDA;
        const float *gm = reinterpret_cast<const float *>(O + C * LDO);

        uint32_t SA[KS][4];
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            c_to_a(SA[kk], dS[2 * kk], dS[2 * kk + 1]);
        {  // the gradient at the chunk's end
            uint32_t *st = reinterpret_cast<uint32_t *>((bf16 *)sa.dSt + (ch * D + v0) * D);
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                st[(g4 * D + kk * 16 + 2 * t4) / 2] = SA[kk][0];
                st[((g4 + 8) * D + kk * 16 + 2 * t4) / 2] = SA[kk][1];
                st[(g4 * D + kk * 16 + 8 + 2 * t4) / 2] = SA[kk][2];
                st[((g4 + 8) * D + kk * 16 + 8 + 2 * t4) / 2] = SA[kk][3];
            }
        }
        uint32_t OA[4][4];  // dO^T as A fragments: rows v, columns tokens
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            ldsm_t(OA[kk], O + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDO + 16 * warp +
                               ((lane >> 3) & 1) * 8);
        // dΔ^T = dO^T Aqk + dS^T Kb^T
        float P[8][4];
        zero(P);
#pragma unroll
        for (int p = 0; p < 4; p++)
#pragma unroll
            for (int kk = p; kk < 4; kk++) {
                uint32_t b[4];
                ldsm_t(b, A + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDA + p * 16 +
                              (lane >> 4) * 8);
                mma(P[2 * p], OA[kk], b[0], b[1]);
                mma(P[2 * p + 1], OA[kk], b[2], b[3]);
            }
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int p = 0; p < 4; p++) {
                uint32_t b[4];
                ldsm(b, K + (p * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk * 16 +
                            ((lane >> 3) & 1) * 8);
                mma(P[2 * p], SA[kk], b[0], b[1]);
                mma(P[2 * p + 1], SA[kk], b[2], b[3]);
            }
        uint32_t DN[4][4];  // -dΔ^T as A fragments
        {
            uint32_t *dt = reinterpret_cast<uint32_t *>((bf16 *)sa.dDt + (ch * D + v0) * C);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t a[4];
                c_to_a(a, P[2 * kk], P[2 * kk + 1]);
                dt[(g4 * C + kk * 16 + 2 * t4) / 2] = a[0];
                dt[((g4 + 8) * C + kk * 16 + 2 * t4) / 2] = a[1];
                dt[(g4 * C + kk * 16 + 8 + 2 * t4) / 2] = a[2];
                dt[((g4 + 8) * C + kk * 16 + 8 + 2 * t4) / 2] = a[3];
                DN[kk][0] = pack(-P[2 * kk][0], -P[2 * kk][1]);
                DN[kk][1] = pack(-P[2 * kk][2], -P[2 * kk][3]);
                DN[kk][2] = pack(-P[2 * kk + 1][0], -P[2 * kk + 1][1]);
                DN[kk][3] = pack(-P[2 * kk + 1][2], -P[2 * kk + 1][3]);
            }
        }
        // dS^T <- dS^T Diag(γ) + dO^T Qg - dΔ^T W
#pragma unroll
        for (int nt = 0; nt < NTD; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dS[nt][e] *= gm[fcol(lane, nt, e)];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int p = 0; p < D / 16; p++) {
                uint32_t b[4];
                ldsm_t(b, Q + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + p * 16 +
                              (lane >> 4) * 8);
                mma(dS[2 * p], OA[kk], b[0], b[1]);
                mma(dS[2 * p + 1], OA[kk], b[2], b[3]);
                ldsm_t(b, W + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + p * 16 +
                              (lane >> 4) * 8);
                mma(dS[2 * p], DN[kk], b[0], b[1]);
                mma(dS[2 * p + 1], DN[kk], b[2], b[3]);
            }
        __syncthreads();
    }
    if (sa.d_s0 && si >= 0) {
        float *o = sa.d_s0 + (si * HV + hv) * D * D;
#pragma unroll
        for (int nt = 0; nt < NTD; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[fcol(lane, nt, e) * D + v0 + frow(lane, e)] = dS[nt][e];
    }
}

// ---- fp32 FMA versions: 256 threads per (sequence, head, 32 value columns) -------------------
constexpr int ST = 256, SV = 32;

template <int D> struct SimtL {
    static constexpr size_t bytes = ((size_t)D * (SV + 1) + C * (SV + 1)) * 4;
};

// Forward; with SUMMARY the 2D columns are [M | B]: M's from the identity with no values, B's
// from zero with the values; no outputs, no saved tensors.
template <typename E, int D, bool SUMMARY>
__global__ void __launch_bounds__(ST) state_fwd_simt(StateArgs sa, float *m_out, float *b_out)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *S = reinterpret_cast<float *>(smem), *Dl = S + D * (SV + 1);
    const int doc = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x, v = tid & 31, rg = tid >> 5;
    const int HV = sa.HV, col = blockIdx.z * SV + v;  // state column (of 2D with SUMMARY)
    int64_t t0, len, c0, nch;
    seq_info(sa.seqs, doc, t0, len, c0, nch);
    const int64_t si = slot_in(sa.seqs, doc), so = slot_out(sa.seqs, doc);
    const int64_t hi = si * HV + hv, ho = so * HV + hv;
    for (int j = rg; j < D; j += 8)  // a summary's M half starts from I unless the rows reset it
        S[j * (SV + 1) + v] = SUMMARY ? (col == j && si >= 0 ? 1.0f : 0.0f)
                                      : (sa.s0 && si >= 0 ? sa.s0[(hi * D + j) * D + col] : 0.0f);
    const E *Wg = (const E *)sa.W, *Qg = (const E *)sa.Qg, *Kg = (const E *)sa.Kb,
            *Ag = (const E *)sa.A, *Ug = (const E *)sa.Ut;
    for (int64_t i = 0; i < nch; i++) {
        const int64_t ch = (c0 + i) * HV + hv, tc0 = t0 + i * C;
        const int nval = (int)min((int64_t)C, len - i * C);
        const E *W = Wg + ch * C * D, *Q = Qg + ch * C * D, *K = Kg + ch * C * D, *A = Ag + ch * C * C;
        __syncthreads();
        if (!SUMMARY)
            for (int j = rg; j < D; j += 8)
                ((E *)sa.St)[(ch * D + col) * D + j] = from_f<E>(S[j * (SV + 1) + v]);
        for (int r = rg; r < C; r += 8) {
            float acc = 0.0f;
            if (!SUMMARY || col >= D)
                acc = to_f(Ug[(ch * D + (SUMMARY ? col - D : col)) * C + r]);
            for (int j = 0; j < D; j++)
                acc -= to_f(W[r * D + j]) * S[j * (SV + 1) + v];
            Dl[r * (SV + 1) + v] = acc;
            if (!SUMMARY)
                ((E *)sa.Dt)[(ch * D + col) * C + r] = from_f<E>(acc);
        }
        __syncthreads();
        if (!SUMMARY)
            for (int r = rg; r < nval; r += 8) {
                float acc = 0.0f;
                for (int j = 0; j < D; j++)
                    acc += to_f(Q[r * D + j]) * S[j * (SV + 1) + v];
                for (int x = 0; x <= r; x++)
                    acc += to_f(A[r * C + x]) * Dl[x * (SV + 1) + v];
                ((E *)sa.o)[((tc0 + r) * HV + hv) * D + col] = from_f<E>(acc);
            }
        __syncthreads();
        for (int j = rg; j < D; j += 8) {
            float acc = sa.gam[ch * D + j] * S[j * (SV + 1) + v];
            for (int r = 0; r < C; r++)
                acc += to_f(K[r * D + j]) * Dl[r * (SV + 1) + v];
            S[j * (SV + 1) + v] = acc;
        }
    }
    __syncthreads();
    for (int j = rg; j < D && so >= 0; j += 8) {
        float x = S[j * (SV + 1) + v];
        if (SUMMARY) {
            if (col < D)
                m_out[(ho * D + j) * D + col] = x;
            else
                b_out[(ho * D + j) * D + col - D] = x;
        } else if (sa.s_final) {
            sa.s_final[(ho * D + j) * D + col] = x;
        }
    }
}

template <int D>
__global__ void __launch_bounds__(ST) state_bwd_simt(StateArgs sa)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *dS = reinterpret_cast<float *>(smem), *dDl = dS + D * (SV + 1);
    const int doc = blockIdx.x, hv = blockIdx.y, tid = threadIdx.x, v = tid & 31, rg = tid >> 5;
    const int HV = sa.HV, col = blockIdx.z * SV + v;
    int64_t t0, len, c0, nch;
    seq_info(sa.seqs, doc, t0, len, c0, nch);
    const int64_t si = slot_in(sa.seqs, doc), so = slot_out(sa.seqs, doc);
    const int64_t hi = si * HV + hv, ho = so * HV + hv;
    for (int j = rg; j < D; j += 8)
        dS[j * (SV + 1) + v] =
            sa.d_s_final && so >= 0 ? sa.d_s_final[(ho * D + j) * D + col] : 0.0f;
    const float *Wg = (const float *)sa.W, *Qg = (const float *)sa.Qg, *Kg = (const float *)sa.Kb,
                *Ag = (const float *)sa.A, *dO = (const float *)sa.d_o;
    for (int64_t i = nch - 1; i >= 0; i--) {
        const int64_t ch = (c0 + i) * HV + hv, tc0 = t0 + i * C;
        const int nval = (int)min((int64_t)C, len - i * C);
        const float *W = Wg + ch * C * D, *Q = Qg + ch * C * D, *K = Kg + ch * C * D,
                    *A = Ag + ch * C * C;
        __syncthreads();
        for (int j = rg; j < D; j += 8)
            ((float *)sa.dSt)[(ch * D + col) * D + j] = dS[j * (SV + 1) + v];
        for (int x = rg; x < C; x += 8) {
            float acc = 0.0f;
            for (int r = x; r < nval; r++)
                acc += A[r * C + x] * dO[((tc0 + r) * HV + hv) * D + col];
            for (int j = 0; j < D; j++)
                acc += K[x * D + j] * dS[j * (SV + 1) + v];
            dDl[x * (SV + 1) + v] = acc;
            ((float *)sa.dDt)[(ch * D + col) * C + x] = acc;
        }
        __syncthreads();
        for (int j = rg; j < D; j += 8) {
            float acc = sa.gam[ch * D + j] * dS[j * (SV + 1) + v];
            for (int r = 0; r < nval; r++)
                acc += Q[r * D + j] * dO[((tc0 + r) * HV + hv) * D + col];
            for (int x = 0; x < C; x++)
                acc -= W[x * D + j] * dDl[x * (SV + 1) + v];
            dS[j * (SV + 1) + v] = acc;
        }
    }
    __syncthreads();
    if (sa.d_s0 && si >= 0)
        for (int j = rg; j < D; j += 8)
            sa.d_s0[(hi * D + j) * D + col] = dS[j * (SV + 1) + v];
}

StateArgs state_args(const Dims &d, const kda_cuda_args *a, const Bufs &b)
{
    StateArgs s;
    s.seqs = d.seqs, s.HV = (int)d.HV;
    s.Qg = b.Qg, s.Kb = b.Kb, s.W = b.W, s.A = b.A, s.Ut = b.Ut, s.gam = b.gam;
    s.s0 = a ? a->s0 : nullptr, s.o = a ? a->o : nullptr, s.s_final = a ? a->s_final : nullptr;
    s.St = b.St, s.Dt = b.Dt;
    s.d_o = a ? a->d_o : nullptr, s.d_s_final = a ? a->d_s_final : nullptr;
    s.d_s0 = a ? a->d_s0 : nullptr, s.dSt = b.dSt, s.dDt = b.dDt;
    return s;
}

// Warps per block of the tensor-core passes: the most (fewest blocks) that still gives about
// one block per SM; a warp is the smallest unit (16 value columns).
int pick_nw(const Dims &d)
{
    int64_t heads = d.n_seq * d.HV, units = d.D / 16;
    int nw = (int)units < 8 ? (int)units : 8;
    while (nw > 1 && heads * (units / nw) < 128)
        nw >>= 1;
    return nw;
}

template <int D, int NW>
int tc_fwd(cudaStream_t st, const Dims &d, const StateArgs &s, bool bwd, k3rt_error *err)
{
    using L = StL<D, NW>;
    static_assert(2 * L::FWD_STAGE <= 227 * 1024 && 2 * L::BWD_STAGE <= 227 * 1024,
                  "state: shared memory");
    dim3 grid((unsigned)d.n_seq, (unsigned)d.HV, (unsigned)(D / (16 * NW)));
    if (!bwd) {
        if (allow_smem(state_fwd_tc<D, NW>, 2 * L::FWD_STAGE,
                       "cudaFuncSetAttribute (kda state_fwd_tc)", err))
            return K3RT_ERR_DEVICE;
        state_fwd_tc<D, NW><<<grid, NW * 32, 2 * L::FWD_STAGE, st>>>(s);
        KDA_LAUNCHED("kda state_fwd_tc");
    } else {
        if (allow_smem(state_bwd_tc<D, NW>, 2 * L::BWD_STAGE,
                       "cudaFuncSetAttribute (kda state_bwd_tc)", err))
            return K3RT_ERR_DEVICE;
        state_bwd_tc<D, NW><<<grid, NW * 32, 2 * L::BWD_STAGE, st>>>(s);
        KDA_LAUNCHED("kda state_bwd_tc");
    }
    return K3RT_OK;
}

template <int D>
int tc_pick(cudaStream_t st, const Dims &d, const StateArgs &s, bool bwd, k3rt_error *err)
{
    const int nw = pick_nw(d);  // <= D / 16
    if constexpr (D >= 128)
        if (nw == 8)
            return tc_fwd<D, 8>(st, d, s, bwd, err);
    if constexpr (D >= 64)
        if (nw == 4)
            return tc_fwd<D, 4>(st, d, s, bwd, err);
    if (nw == 2)
        return tc_fwd<D, 2>(st, d, s, bwd, err);
    return tc_fwd<D, 1>(st, d, s, bwd, err);
}

template <int D>
int simt_run(cudaStream_t st, const Dims &d, const StateArgs &s, bool bwd, k3rt_error *err)
{
    size_t sm = SimtL<D>::bytes;
    dim3 grid((unsigned)d.n_seq, (unsigned)d.HV, (unsigned)(D / SV));
    if (!bwd) {
        if (allow_smem(state_fwd_simt<float, D, false>, sm,
                       "cudaFuncSetAttribute (kda state_fwd_simt)", err))
            return K3RT_ERR_DEVICE;
        state_fwd_simt<float, D, false><<<grid, ST, sm, st>>>(s, nullptr, nullptr);
        KDA_LAUNCHED("kda state_fwd_simt");
    } else {
        if (allow_smem(state_bwd_simt<D>, sm, "cudaFuncSetAttribute (kda state_bwd_simt)", err))
            return K3RT_ERR_DEVICE;
        state_bwd_simt<D><<<grid, ST, sm, st>>>(s);
        KDA_LAUNCHED("kda state_bwd_simt");
    }
    return K3RT_OK;
}

int state_run(cudaStream_t st, int dtype, const Dims &d, const StateArgs &s, bool bwd,
              k3rt_error *err)
{
    if (dtype == K3RT_BF16)
        switch (d.D) {
        case 32: return tc_pick<32>(st, d, s, bwd, err);
        case 64: return tc_pick<64>(st, d, s, bwd, err);
        default: return tc_pick<128>(st, d, s, bwd, err);
        }
    switch (d.D) {
    case 32: return simt_run<32>(st, d, s, bwd, err);
    case 64: return simt_run<64>(st, d, s, bwd, err);
    default: return simt_run<128>(st, d, s, bwd, err);
    }
}

template <typename E, int D>
int summary_t(cudaStream_t st, const Dims &d, const StateArgs &s, float *m, float *bm,
              k3rt_error *err)
{
    size_t sm = SimtL<D>::bytes;
    dim3 grid((unsigned)d.n_seq, (unsigned)d.HV, (unsigned)(2 * D / SV));
    if (allow_smem(state_fwd_simt<E, D, true>, sm, "cudaFuncSetAttribute (kda summary)", err))
        return K3RT_ERR_DEVICE;
    state_fwd_simt<E, D, true><<<grid, ST, sm, st>>>(s, m, bm);
    KDA_LAUNCHED("kda state_fwd_simt (summary)");
    return K3RT_OK;
}

}  // namespace

int launch_state_fwd(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                     const Bufs &b, k3rt_error *err)
{
    return state_run(st, dtype, d, state_args(d, a, b), false, err);
}

int launch_state_bwd(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                     const Bufs &b, k3rt_error *err)
{
    return state_run(st, dtype, d, state_args(d, a, b), true, err);
}

int launch_summary(cudaStream_t st, int dtype, const Dims &d, const Bufs &b, float *m, float *bm,
                   k3rt_error *err)
{
    StateArgs s = state_args(d, nullptr, b);
    if (dtype == K3RT_BF16)
        switch (d.D) {
        case 32: return summary_t<bf16, 32>(st, d, s, m, bm, err);
        case 64: return summary_t<bf16, 64>(st, d, s, m, bm, err);
        default: return summary_t<bf16, 128>(st, d, s, m, bm, err);
        }
    switch (d.D) {
    case 32: return summary_t<float, 32>(st, d, s, m, bm, err);
    case 64: return summary_t<float, 64>(st, d, s, m, bm, err);
    default: return summary_t<float, 128>(st, d, s, m, bm, err);
    }
}

}  // namespace kdacu
