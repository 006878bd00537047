// The chunk-parallel kernels of KDA (kda_cuda.h): prep (forward and backward), bwd_a and bwd_b.
// One block of 256 threads (8 warps) per (chunk, value head; bwd_b: per half of its channels at
// D >= 64); E is the compute type: bf16 runs
// the products on the tensor cores from shared memory, float by scalar FMAs (the f32 path),
// same code (common.cuh's engines).
//
// Gates, per chunk and key channel j, in log2 units (x = g log2 e), referenced at the midpoint
// m_I = 16 I + 8 of each sub-chunk I:
//   Hr[r]  = G_r - G_{m(r)}        summed outward from m(r): |Hr| <= 8 steps of decay
//   Sb[I]  = G_{m_I} - G_{m_I-1}   (I >= 1), Gm[I] = G_{m_I} (G_{-1} = 0)
// Every exponent the kernels take is a sum of same-signed partial sums of g, so its rounding
// is relative to itself (not to the chunk's cumulative decay): e^{G_a - G_b} for a >= b is
// 2^(Md(I(a), I(b)) + Hr[a] - Hr[b]) with Md(I, J) = sum_{J < x <= I} Sb[x] <= 0.
// Intra-chunk products (spec §4.2, midpoint variant): for block row I and any column i <= end
// of block I,  e^{G_r - G_i} = 2^Hr[r] * 2^(Md(I, I(i)) - Hr[i])  with both factors below
// 2^58 when g >= -5, so Qt = q 2^Hr, Kt = k 2^Hr (rows) and KC_I = k 2^(Md - Hr) (columns)
// are bf16 operands of one product per block.
#include "common.cuh"

namespace kdacu {
namespace {

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;

__host__ __device__ constexpr int kc_off(int I) { return SUB * I * (I + 1) / 2; }
constexpr int KC_ROWS = kc_off(NB);  // 160
__host__ __device__ constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }
__host__ __device__ constexpr size_t al16(size_t a) { return (a + 15) / 16 * 16; }

template <typename E> __device__ __forceinline__ void store2(E *p, float a, float b);
template <> __device__ __forceinline__ void store2<float>(float *p, float a, float b)
{
    *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}
template <> __device__ __forceinline__ void store2<bf16>(bf16 *p, float a, float b)
{
    *reinterpret_cast<uint32_t *>(p) = pack(a, b);
}

// ---- gates ---------------------------------------------------------------------------------
template <int D> struct GateLd { static constexpr int LDH = D + 1; };  // odd: fragment-pattern reads spread over the banks

// 16 bytes of a row: V = 16 / sizeof(E) values as floats; zeros when !ok (p is then not read).
template <typename E> struct Vec { static constexpr int V = 16 / (int)sizeof(E); };
template <typename E>
__device__ __forceinline__ void load_vec(float (&x)[Vec<E>::V], const E *p, bool ok)
{
    constexpr int V = Vec<E>::V;
    uint4 u = make_uint4(0u, 0u, 0u, 0u);  // a predicated load, not a branch per call site
    if (ok)
        u = *reinterpret_cast<const uint4 *>(p);
    if constexpr (sizeof(E) == 2) {
        const bf16 *h = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
        for (int c = 0; c < V; c++)
            x[c] = __bfloat162float(h[c]);
    } else {
        const float *f = reinterpret_cast<const float *>(&u);
#pragma unroll
        for (int c = 0; c < V; c++)
            x[c] = f[c];
    }
}
template <typename E>
__device__ __forceinline__ void store_vec(E *p, const float (&x)[Vec<E>::V])
{
    constexpr int V = Vec<E>::V;
    uint4 u;
    if constexpr (sizeof(E) == 2) {
        uint32_t *w = reinterpret_cast<uint32_t *>(&u);
#pragma unroll
        for (int c = 0; c < V / 2; c++)
            w[c] = pack(x[2 * c], x[2 * c + 1]);
    } else {
        float *f = reinterpret_cast<float *>(&u);
#pragma unroll
        for (int c = 0; c < V; c++)
            f[c] = x[c];
    }
    *reinterpret_cast<uint4 *>(p) = u;
}

// Hr, Gm, Sb of the chunk whose token 0 is g (row pitch ldg); rows >= n count g = 0. A thread
// per (16-byte group of channels, sub-chunk) loads its 16 rows at once, then scans them outward
// from the midpoint. Ends with a barrier.
template <typename E, int D>
__device__ void gate_phase(const E *g, int64_t ldg, int n, float *Hr, float *Gm, float *Sb,
                           int tid)
{
    constexpr int LDH = GateLd<D>::LDH, V = Vec<E>::V, NG = D / V;
    for (int it = tid; it < NB * NG; it += THREADS) {
        const int j0 = (it % NG) * V, I = it / NG, r0 = I * SUB, m = r0 + SUB / 2;
        float x[SUB][V];
#pragma unroll
        for (int rr = 0; rr < SUB; rr++)
            load_vec<E>(x[rr], g + (int64_t)(r0 + rr) * ldg + j0, r0 + rr < n);
#pragma unroll
        for (int c = 0; c < V; c++) {
            float h = 0.0f;
            Hr[m * LDH + j0 + c] = 0.0f;
#pragma unroll
            for (int t = m + 1; t < r0 + SUB; t++) {
                h += x[t - r0][c] * LOG2E;
                Hr[t * LDH + j0 + c] = h;
            }
            h = 0.0f;
#pragma unroll
            for (int t = m - 1; t >= r0; t--) {  // G_t - G_m = (G_{t+1} - G_m) - g_{t+1}
                h -= x[t + 1 - r0][c] * LOG2E;
                Hr[t * LDH + j0 + c] = h;
            }
            Sb[I * D + j0 + c] = x[0][c] * LOG2E;  // g of the sub-chunk's first row, for now
        }
    }
    __syncthreads();
    for (int j = tid; j < D; j += THREADS) {
        float gm = Sb[j] - Hr[j];  // G_8 = g_0 - (G_0 - G_8)
        Gm[j] = gm;
        Sb[j] = 0.0f;
        for (int I = 1; I < NB; I++) {
            int r = I * SUB;  // G_{m_I} - G_{m_I-1} = Hr[r-1] - Hr[r] + g_r, all terms <= 0
            float sI = Hr[(r - 1) * LDH + j] - Hr[r * LDH + j] + Sb[I * D + j];
            Sb[I * D + j] = sI;
            gm += sI;
            Gm[I * D + j] = gm;
        }
    }
    __syncthreads();
}

template <int D> struct Gate {
    const float *Hr, *Gm, *Sb;
    int last, Il;  // last valid row, its sub-chunk
    __device__ float hr(int r, int j) const { return Hr[r * GateLd<D>::LDH + j]; }
    __device__ float md(int I, int J, int j) const  // G_{m_I} - G_{m_J}, I >= J
    {
        float s = 0.0f;  // at most NB - 1 terms: a fixed, predicated loop (a bounded one unrolls 8x)
#pragma unroll
        for (int x = 1; x < NB; x++)
            if (x > J && x <= I)
                s += Sb[x * D + j];
        return s;
    }
    __device__ float gam(int r, int j) const { return ex2(Gm[(r / SUB) * D + j] + hr(r, j)); }
    // e^{G_last - G_r} = 2^(gbar_base(I(r), j) - Hr[r]), r <= last. Callers whose rows share a
    // sub-chunk take the base once per column: the inner sum is a loop, and a loop in every
    // unrolled element made these kernels' code overflow the instruction cache.
    __device__ float gbar_base(int I, int j) const { return md(Il, I, j) + hr(last, j); }
    __device__ float gam_last(int j) const { return ex2(Gm[Il * D + j] + hr(last, j)); }
};

// Qt = q 2^Hr, Kt = k 2^Hr and the column sides KC_I (rows kc_off(I) + i, i <= end of I), all
// 64 rows (zeros past n). q, k at token 0 of the chunk, row pitch ldq. With Qg, Kb (prep) also
// s q Γ and k Γ̄ into those [64][D] tiles. Each thread loads all its 16-byte groups first.
template <typename E, int D, int LD>
__device__ void build_sides(const Gate<D> &G, const E *q, const E *k, int64_t ldq, int n,
                            E *Qt, E *Kt, E *KC, E *Qg, E *Kb, float s, int tid)
{
    constexpr int V = Vec<E>::V, NG = D / V, ITEMS = C * NG / THREADS;
    static_assert(C * NG % THREADS == 0, "items per thread");
    float qv[ITEMS][V], kv[ITEMS][V];
#pragma unroll
    for (int u = 0; u < ITEMS; u++) {
        int it = tid + u * THREADS, r = it / NG, j0 = (it % NG) * V;
        load_vec<E>(qv[u], q + (int64_t)r * ldq + j0, r < n);
        load_vec<E>(kv[u], k + (int64_t)r * ldq + j0, r < n);
    }
#pragma unroll
    for (int u = 0; u < ITEMS; u++) {
        const int it = tid + u * THREADS, r = it / NG, j0 = (it % NG) * V, I = r / SUB;
        const bool ok = r < n;
        float a[V], b[V], h[V];
#pragma unroll
        for (int c = 0; c < V; c++) {
            h[c] = G.hr(r, j0 + c);
            float f = ex2(h[c]);
            a[c] = qv[u][c] * f;
            b[c] = kv[u][c] * f;
        }
        store_vec<E>(Qt + r * LD + j0, a);
        store_vec<E>(Kt + r * LD + j0, b);
        float md[V];
#pragma unroll
        for (int c = 0; c < V; c++)
            md[c] = 0.0f;
        float mdl[V] = {};  // Md(last's sub-chunk, I), met on the way (rows past n leave it unused)
        for (int I2 = I; I2 < NB; I2++) {
#pragma unroll
            for (int c = 0; c < V; c++) {
                if (I2 > I)
                    md[c] += G.Sb[I2 * D + j0 + c];
                if (I2 == G.Il)
                    mdl[c] = md[c];
                a[c] = ok ? kv[u][c] * ex2(md[c] - h[c]) : 0.0f;
            }
            store_vec<E>(KC + (kc_off(I2) + r) * LD + j0, a);
        }
        if (Qg) {
#pragma unroll
            for (int c = 0; c < V; c++) {
                a[c] = ok ? s * qv[u][c] * G.gam(r, j0 + c) : 0.0f;
                b[c] = ok ? kv[u][c] * ex2(mdl[c] + G.hr(G.last, j0 + c) - h[c]) : 0.0f;
            }
            store_vec<E>(Qg + r * D + j0, a);
            store_vec<E>(Kb + r * D + j0, b);
        }
    }
}

// Rows of Γ k (or beta Γ k with scale_beta) and v (or beta v) into two [64][D] shared tiles.
template <typename E, int D, int LD>
__device__ void build_kv(const Gate<D> &G, const E *k, int64_t ldq, const E *v, int64_t ldv,
                         int n, const float *bt, bool scale_beta, E *Kg, E *Vs, int tid)
{
    constexpr int V = Vec<E>::V, NG = D / V, ITEMS = C * NG / THREADS;
    float kv[ITEMS][V], vv[ITEMS][V];
#pragma unroll
    for (int u = 0; u < ITEMS; u++) {
        int it = tid + u * THREADS, r = it / NG, j0 = (it % NG) * V;
        load_vec<E>(kv[u], k + (int64_t)r * ldq + j0, r < n);
        load_vec<E>(vv[u], v + (int64_t)r * ldv + j0, r < n);
    }
#pragma unroll
    for (int u = 0; u < ITEMS; u++) {
        const int it = tid + u * THREADS, r = it / NG, j0 = (it % NG) * V;
        const float b = scale_beta ? bt[r] : 1.0f;
        float a[V];
#pragma unroll
        for (int c = 0; c < V; c++) {
            a[c] = r < n ? b * kv[u][c] * G.gam(r, j0 + c) : 0.0f;
            vv[u][c] *= b;
        }
        store_vec<E>(Kg + r * LD + j0, a);
        store_vec<E>(Vs + r * LD + j0, vv[u]);
    }
}

// 16x16 tile b (of 16) of a 64x64 matrix: block row, block column.
__device__ __forceinline__ void tile_rc(int b, int &I, int &J) { I = b >> 2, J = b & 3; }

// ---- prep ----------------------------------------------------------------------------------
template <typename E, int D> struct PrepL {
    static constexpr int P = Pad<E>::v, LD = D + P, LDT = C + P, LDH = GateLd<D>::LDH,
                         LDF = C + 4;
    static constexpr size_t HR = al16((size_t)C * LDH * 4), GM = NB * D * 4, SB = NB * D * 4,
                            BETA = C * 4;
    static constexpr size_t RA = al16(cmax((size_t)C * LD * sizeof(E), (size_t)C * LDF * 4));
    static constexpr size_t RB = RA;
    static constexpr size_t RC =
        al16(cmax(cmax((size_t)KC_ROWS * LD * sizeof(E), 2 * (size_t)C * LD * sizeof(E)),
                  3 * 256 * 4));
    static constexpr size_t o_gm = HR, o_sb = o_gm + GM, o_beta = o_sb + SB, o_a = o_beta + BETA,
                            o_b = o_a + RA, o_c = o_b + RB, bytes = o_c + RC;
};

struct PrepArgs {
    Seqs seqs;
    int H, HV;
    float scale;
    const void *q, *k, *v, *g, *beta;
    void *Qg, *Kb, *W, *A, *Ut, *Tm, *Lk;
    float *gam;
};

// Per chunk: Qg, Kb, γ, Aqk, (I + L)^-1 via forward substitution and block merges in fp32,
// W = T (beta Γ k), U^T = (beta v)^T T^T; with BWD also T and Lk (unscaled L).
// Two blocks an SM on bf16 (shared memory allows it at D = 128: 2 x 113 KB): <= 128 registers.
template <typename E> struct PrepOcc { static constexpr int v = sizeof(E) == 2 ? 2 : 1; };

template <typename E, int D, bool BWD>
__global__ void __launch_bounds__(THREADS, PrepOcc<E>::v) prep_kernel(PrepArgs pa)
{
    using L = PrepL<E, D>;
    constexpr int LD = L::LD, LDT = L::LDT, LDF = L::LDF;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Hr = reinterpret_cast<float *>(smem + 0), *Gm = reinterpret_cast<float *>(smem + L::o_gm),
          *Sb = reinterpret_cast<float *>(smem + L::o_sb),
          *bt = reinterpret_cast<float *>(smem + L::o_beta);
    E *Qt = reinterpret_cast<E *>(smem + L::o_a), *Kt = reinterpret_cast<E *>(smem + L::o_b),
      *KC = reinterpret_cast<E *>(smem + L::o_c);
    float *Lf = reinterpret_cast<float *>(smem + L::o_a);  // beta Lk, after Aqk
    float *Tf = reinterpret_cast<float *>(smem + L::o_b);  // T, after Lk
    float *Xs = reinterpret_cast<float *>(smem + L::o_c);  // merge scratch, after Lk
    E *TE = reinterpret_cast<E *>(smem + L::o_a);          // T as an operand, after the merges
    E *KgB = reinterpret_cast<E *>(smem + L::o_c), *bV = KgB + C * LD;  // after the merges

    const int64_t c = blockIdx.x;
    const int hv = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    ChunkInfo ci;
    if (!chunk_info(pa.seqs, c, ci))
        return;
    const int n = ci.n, HV = pa.HV, hq = hv / (HV / pa.H);
    const int64_t ldq = (int64_t)pa.H * D, ldv = (int64_t)HV * D;
    const E *q = (const E *)pa.q + (ci.t0 * pa.H + hq) * D, *k = (const E *)pa.k + (ci.t0 * pa.H + hq) * D;
    const E *v = (const E *)pa.v + (ci.t0 * HV + hv) * D, *g = (const E *)pa.g + (ci.t0 * HV + hv) * D;
    const int64_t ch = c * HV + hv;
    E *Qg = (E *)pa.Qg + ch * C * D, *Kb = (E *)pa.Kb + ch * C * D, *W = (E *)pa.W + ch * C * D;
    E *A = (E *)pa.A + ch * C * C, *Ut = (E *)pa.Ut + ch * D * C;
    float *gam = pa.gam + ch * D;
    const float s = pa.scale;

    if (tid < C)
        bt[tid] = tid < n ? to_f(((const E *)pa.beta)[(ci.t0 + tid) * HV + hv]) : 0.0f;
    gate_phase<E, D>(g, ldv, n, Hr, Gm, Sb, tid);
    Gate<D> G{Hr, Gm, Sb, n - 1, (n - 1) / SUB};

    // Qg, Kb, γ to the workspace; the two sides of the pairwise products to shared memory.
    build_sides<E, D, LD>(G, q, k, ldq, n, Qt, Kt, KC, Qg, Kb, s, tid);
    if (tid < D)
        gam[tid] = G.gam_last(tid);
    __syncthreads();

    // Aqk = s Qt KC^T (lower blocks), zeros above the diagonal.
    for (int b = warp; b < NB * NB; b += WARPS) {
        int I, J;
        tile_rc(b, I, J);
        float acc[2][4];
        zero(acc);
        if (J <= I)
            mm<2, false, false>(acc, Qt + I * SUB * LD, LD, KC + (kc_off(I) + J * SUB) * LD, LD, D,
                                lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                int r = I * SUB + frow(lane, e), col = J * SUB + fcol(lane, nt, e);
                store2<E>(A + r * C + col, col <= r ? s * acc[nt][e] : 0.0f,
                          col + 1 <= r ? s * acc[nt][e + 1] : 0.0f);
            }
    }
    __syncthreads();
    // Lk = Kt KC^T (strictly lower); Lf = beta Lk (fp32, over Qt)
    for (int b = warp; b < NB * NB; b += WARPS) {
        int I, J;
        tile_rc(b, I, J);
        float acc[2][4];
        zero(acc);
        if (J <= I)
            mm<2, false, false>(acc, Kt + I * SUB * LD, LD, KC + (kc_off(I) + J * SUB) * LD, LD, D,
                                lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                int r = I * SUB + frow(lane, e), col = J * SUB + fcol(lane, nt, e);
                float l0 = col < r ? acc[nt][e] : 0.0f, l1 = col + 1 < r ? acc[nt][e + 1] : 0.0f;
                Lf[r * LDF + col] = bt[r] * l0;
                Lf[r * LDF + col + 1] = bt[r] * l1;
                if (BWD)
                    store2<E>((E *)pa.Lk + ch * C * C + r * C + col, l0, l1);
            }
    }
    __syncthreads();

    // T = (I + L)^-1: forward substitution on the diagonal blocks (a lane per column) ...
    if (warp < NB && lane < SUB) {
        const int b0 = warp * SUB;
        float x[SUB];
#pragma unroll
        for (int r = 0; r < SUB; r++) {
            float a = r == lane ? 1.0f : 0.0f;
#pragma unroll
            for (int i = 0; i < r; i++)
                a -= Lf[(b0 + r) * LDF + b0 + i] * x[i];
            x[r] = a;
        }
#pragma unroll
        for (int r = 0; r < SUB; r++)
            Tf[(b0 + r) * LDF + b0 + lane] = x[r];
    }
    for (int it = tid; it < C * C; it += THREADS) {
        int r = it / C, col = it % C;
        if (r / SUB != col / SUB)
            Tf[r * LDF + col] = 0.0f;
    }
    __syncthreads();
    // ... then the blocks below: T_IJ = -T_II sum_{J <= K < I} L_IK T_KJ, by distance I - J.
    for (int dd = 1; dd < NB; dd++) {
        const int nb = NB - dd;
        for (int it = tid; it < nb * 256; it += THREADS) {
            int bi = it >> 8, rr = (it >> 4) & 15, cc = it & 15, I = dd + bi, J = I - dd;
            float acc = 0.0f;
            for (int kk = J * SUB; kk < I * SUB; kk++)
                acc += Lf[(I * SUB + rr) * LDF + kk] * Tf[kk * LDF + J * SUB + cc];
            Xs[it] = acc;
        }
        __syncthreads();
        for (int it = tid; it < nb * 256; it += THREADS) {
            int bi = it >> 8, rr = (it >> 4) & 15, cc = it & 15, I = dd + bi, J = I - dd;
            float acc = 0.0f;
#pragma unroll
            for (int kk = 0; kk < SUB; kk++)
                acc += Tf[(I * SUB + rr) * LDF + I * SUB + kk] * Xs[(bi << 8) + kk * 16 + cc];
            Tf[(I * SUB + rr) * LDF + J * SUB + cc] = -acc;
        }
        __syncthreads();
    }
    // T as an operand (over Lf); beta Γ k and beta v (over KC).
    for (int it = tid; it < C * C; it += THREADS) {
        int r = it / C, col = it % C;
        float t = Tf[r * LDF + col];
        TE[r * LDT + col] = from_f<E>(t);
        if (BWD)
            ((E *)pa.Tm)[ch * C * C + it] = from_f<E>(t);
    }
    build_kv<E, D, LD>(G, k, ldq, v, ldv, n, bt, true, KgB, bV, tid);
    __syncthreads();

    // W = T KgB [64 x D] and U^T = bV^T T^T [D x 64], 16x16 tiles; T is lower triangular.
    constexpr int CT = D / SUB;  // column tiles of W
    for (int b = warp; b < 2 * NB * CT; b += WARPS) {
        float acc[2][4];
        zero(acc);
        if (b < NB * CT) {
            int I = b / CT, Jc = b % CT;
            mm<2, false, true>(acc, TE + I * SUB * LDT, LDT, KgB + Jc * SUB, LD, (I + 1) * SUB,
                               lane);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    int r = I * SUB + frow(lane, e), col = Jc * SUB + fcol(lane, nt, e);
                    store2<E>(W + r * D + col, acc[nt][e], acc[nt][e + 1]);
                }
        } else {
            int bb = b - NB * CT, Vr = bb / NB, R = bb % NB;
            mm<2, true, false>(acc, bV + Vr * SUB, LD, TE + R * SUB * LDT, LDT, (R + 1) * SUB,
                               lane);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    int vr = Vr * SUB + frow(lane, e), col = R * SUB + fcol(lane, nt, e);
                    store2<E>(Ut + vr * C + col, acc[nt][e], acc[nt][e + 1]);
                }
        }
    }
}

// ---- backward, part a ----------------------------------------------------------------------
// Shared memory: Hr and the gate constants; dO [64][D] (then Γ k); dW, V [64][D]; dT, X [64][64];
// parts; with bf16 also the staged S^T / dS'^T [D][D], Δ^T, dΔ^T [D][64], T [64][64] and Qg, Kb
// [64][D] (float reads those from the workspace). The owners' elementwise work reads shared
// memory only: every global read is one coalesced tile load at the start.
template <typename E, int D> struct BwdAL {
    static constexpr bool TC = sizeof(E) == 2;
    static constexpr int P = Pad<E>::v, LD = D + P, LDT = C + P, LDH = GateLd<D>::LDH;
    static constexpr size_t HR = al16((size_t)C * LDH * 4), CONST = 2 * NB * D * 4 + C * 4,
                            PARTS = (NB * D + C * NB + 4 * C + THREADS) * 4;
    static constexpr size_t TD = (size_t)C * LD * sizeof(E), TT = (size_t)C * LDT * sizeof(E);
    static constexpr size_t STATE = TC ? (size_t)D * LD * sizeof(E) : 0,
                            DT = TC ? (size_t)D * LDT * sizeof(E) : 0, TM = TC ? TT : 0,
                            QK = TC ? TD : 0;
    static constexpr size_t o_const = HR, o_parts = o_const + al16(CONST),
                            o_do = o_parts + al16(PARTS), o_dw = o_do + TD, o_bv = o_dw + TD,
                            o_dt = o_bv + TD, o_x = o_dt + TT, o_st = o_x + TT,
                            o_delt = o_st + STATE, o_ddelt = o_delt + DT, o_tm = o_ddelt + DT,
                            o_qg = o_tm + TM, o_kb = o_qg + QK, bytes = o_kb + QK;
};

struct BwdArgs {
    Seqs seqs;
    int H, HV;
    float scale;
    const void *q, *k, *v, *g, *beta, *d_o;
    const void *Qg, *Kb, *Tm, *Lk, *St, *Dt, *dSt, *dDt;
    void *dAs, *dLk;
    float *part, *dGl, *dd;
    void *d_v, *d_beta;
    // part b
    void *d_q, *d_k, *d_g;
    float *dqv, *dkv;
};

// Owner of (r, j): warp (R, h) holds rows 16 R + frow, columns h D/2 + fcol (NT = D/16 tiles).
template <typename E, int D>
__global__ void __launch_bounds__(THREADS) bwd_a_kernel(BwdArgs ba)
{
    using L = BwdAL<E, D>;
    constexpr int LD = L::LD, LDT = L::LDT, NT = D / 16, HALF = D / 2;
    constexpr bool TC = L::TC;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Hr = reinterpret_cast<float *>(smem), *Gm = reinterpret_cast<float *>(smem + L::o_const),
          *Sb = Gm + NB * D, *bt = Sb + NB * D;
    float *part3 = reinterpret_cast<float *>(smem + L::o_parts), *part9 = part3 + NB * D,
          *part11 = part9 + C * NB, *part12 = part11 + 2 * C, *pgam = part12 + 2 * C;
    E *dO = reinterpret_cast<E *>(smem + L::o_do), *dW = reinterpret_cast<E *>(smem + L::o_dw),
      *Vs = reinterpret_cast<E *>(smem + L::o_bv), *dT = reinterpret_cast<E *>(smem + L::o_dt),
      *X = reinterpret_cast<E *>(smem + L::o_x);
    E *Kg = dO;  // Γ k, after dO's last use

    const int64_t c = blockIdx.x;
    const int hv = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    ChunkInfo ci;
    if (!chunk_info(ba.seqs, c, ci))
        return;
    const int n = ci.n, HV = ba.HV, hq = hv / (HV / ba.H);
    const int64_t ldq = (int64_t)ba.H * D, ldv = (int64_t)HV * D, ch = c * HV + hv;
    const E *k = (const E *)ba.k + (ci.t0 * ba.H + hq) * D;
    const E *v = (const E *)ba.v + (ci.t0 * HV + hv) * D, *g = (const E *)ba.g + (ci.t0 * HV + hv) * D;
    const E *dOg = (const E *)ba.d_o + (ci.t0 * HV + hv) * D;
    const E *Stg = (const E *)ba.St + ch * D * D, *dStg = (const E *)ba.dSt + ch * D * D;
    const E *Dtg = (const E *)ba.Dt + ch * D * C, *dDtg = (const E *)ba.dDt + ch * D * C;
    const E *Tmg = (const E *)ba.Tm + ch * C * C, *Lkg = (const E *)ba.Lk + ch * C * C;
    const E *Qgg = (const E *)ba.Qg + ch * C * D, *Kbg = (const E *)ba.Kb + ch * C * D;
    const float s = ba.scale;

    // operands: staged (bf16) or in place (float)
    const E *St = Stg, *Dt = Dtg, *dDt = dDtg, *Tm = Tmg, *Qg = Qgg, *Kb = Kbg;
    int lds = D, ldd = C, ldtm = C, ldqk = D;
    if (TC) {
        E *sSt = reinterpret_cast<E *>(smem + L::o_st), *sDt = reinterpret_cast<E *>(smem + L::o_delt),
          *sdDt = reinterpret_cast<E *>(smem + L::o_ddelt), *sTm = reinterpret_cast<E *>(smem + L::o_tm),
          *sQg = reinterpret_cast<E *>(smem + L::o_qg), *sKb = reinterpret_cast<E *>(smem + L::o_kb);
        tile_in<E>(sSt, LD, Stg, D, D, D, D, tid, THREADS);
        tile_in<E>(sDt, LDT, Dtg, C, D, C, D, tid, THREADS);
        tile_in<E>(sdDt, LDT, dDtg, C, D, C, D, tid, THREADS);
        tile_in<E>(sTm, LDT, Tmg, C, C, C, C, tid, THREADS);
        tile_in<E>(sQg, LD, Qgg, D, C, D, C, tid, THREADS);
        tile_in<E>(sKb, LD, Kbg, D, C, D, C, tid, THREADS);
        St = sSt, Dt = sDt, dDt = sdDt, Tm = sTm, Qg = sQg, Kb = sKb;
        lds = LD, ldd = LDT, ldtm = LDT, ldqk = LD;
    }
    tile_in<E>(dO, LD, dOg, ldv, C, D, n, tid, THREADS);
    cp_async_commit();
    if (tid < C)
        bt[tid] = tid < n ? to_f(((const E *)ba.beta)[(ci.t0 + tid) * HV + hv]) : 0.0f;
    {  // dγ_j = sum_v S[j][v] dS'[j][v], two halves of v per channel, loads unrolled
        const int j = tid % D, p = tid / D;
        constexpr int PARTS_V = THREADS / D;  // 2, 4 or 8
        float x = 0.0f;
#pragma unroll 16
        for (int vv = p; vv < D; vv += PARTS_V)
            x += to_f(Stg[vv * D + j]) * to_f(dStg[vv * D + j]);
        pgam[p * D + j] = x;
    }
    gate_phase<E, D>(g, ldv, n, Hr, Gm, Sb, tid);  // ends with a barrier
    Gate<D> G{Hr, Gm, Sb, n - 1, (n - 1) / SUB};
    cp_async_wait<0>();
    __syncthreads();

    const int R = warp >> 1, h = warp & 1, g4 = lane >> 2, t4 = lane & 3;
    float dq[NT][4], dk[NT][4], dG[NT][4], acc[NT][4];
    auto own_r = [&](int e) { return R * SUB + frow(lane, e); };
    auto own_j = [&](int nt, int e) { return h * HALF + fcol(lane, nt, e); };

    // dQg = dO S^T: dq = s Γ dQg, dG = Qg dQg
    zero(acc);
    mm<NT, false, true>(acc, dO + R * SUB * LD, LD, St + h * HALF, lds, D, lane);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = own_r(e), j = own_j(nt, e);
            dq[nt][e] = s * G.gam(r, j) * acc[nt][e];
            dG[nt][e] = to_f(Qg[r * ldqk + j]) * acc[nt][e];
            dk[nt][e] = 0.0f;
        }
    // dW = -dΔ S^T (shared)
    zero(acc);
    mm<NT, true, true>(acc, dDt + R * SUB, ldd, St + h * HALF, lds, D, lane);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e += 2)
            store2<E>(dW + own_r(e) * LD + own_j(nt, e), -acc[nt][e], -acc[nt][e + 1]);
    // dAs = s tril_strict(dO Δ^T), dd = its diagonal
    {
        E *dAs = (E *)ba.dAs + ch * C * C;
        for (int b = warp; b < NB * NB; b += WARPS) {
            int I, J;
            tile_rc(b, I, J);
            float a2[2][4];
            zero(a2);
            if (J <= I)
                mm<2, false, true>(a2, dO + I * SUB * LD, LD, Dt + J * SUB, ldd, D, lane);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = I * SUB + frow(lane, e), col = J * SUB + fcol(lane, nt, e);
                    float x = s * a2[nt][e];
                    dAs[r * C + col] = from_f<E>(col < r ? x : 0.0f);
                    if (col == r)
                        ba.dd[ch * C + r] = x;
                }
        }
    }
    __syncthreads();

    // dS' replaces S; Γ k (over dO) and v.
    if (TC) {
        tile_in<E>(const_cast<E *>(St), LD, dStg, D, D, D, D, tid, THREADS);
        cp_async_commit();
    } else {
        St = dStg;
    }
    build_kv<E, D, LD>(G, k, ldq, v, ldv, n, bt, false, Kg, Vs, tid);
    cp_async_wait<0>();
    __syncthreads();

    // dKb = Δ dS'^T: dk += Γ̄ dKb, dG_r -= Kb dKb and dG_last += the same (r < last)
    zero(acc);
    mm<NT, true, true>(acc, Dt + R * SUB, ldd, St + h * HALF, lds, D, lane);
    {
        float gb[NT][2];  // e^{G_last - G_r} = 2^(gb - Hr[r]): the owner's rows are in block R
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                gb[nt][e] = G.gbar_base(R, own_j(nt, e));
        float cs[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            cs[nt][0] = cs[nt][1] = 0.0f;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = own_r(e), j = own_j(nt, e);
                if (r < n) {
                    dk[nt][e] += ex2(gb[nt][e & 1] - G.hr(r, j)) * acc[nt][e];
                    if (r < n - 1) {
                        float x = to_f(Kb[r * ldqk + j]) * acc[nt][e];
                        dG[nt][e] -= x;
                        cs[nt][e & 1] += x;
                    }
                }
            }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                cs[nt][0] += __shfl_xor_sync(0xffffffffu, cs[nt][0], o);
                cs[nt][1] += __shfl_xor_sync(0xffffffffu, cs[nt][1], o);
            }
            if (g4 == 0) {
                part3[R * D + h * HALF + nt * 8 + 2 * t4] = cs[nt][0];
                part3[R * D + h * HALF + nt * 8 + 2 * t4 + 1] = cs[nt][1];
            }
        }
    }
    // dKgB = T^T dW (KgB = beta Γ k): dk += beta Γ dKgB, dG += beta Γk dKgB, dbeta += Γk dKgB
    zero(acc);
    mm<NT, true, true>(acc, Tm + R * SUB * ldtm + R * SUB, ldtm, dW + R * SUB * LD + h * HALF, LD,
                       C - R * SUB, lane);
    {
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = own_r(e), j = own_j(nt, e);
                float kg = to_f(Kg[r * LD + j]);
                dk[nt][e] += bt[r] * G.gam(r, j) * acc[nt][e];
                dG[nt][e] += bt[r] * kg * acc[nt][e];
                rs[e >> 1] += kg * acc[nt][e];
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            rs[0] += __shfl_xor_sync(0xffffffffu, rs[0], o);
            rs[1] += __shfl_xor_sync(0xffffffffu, rs[1], o);
        }
        if (t4 == 0) {
            part11[(R * SUB + g4) * 2 + h] = rs[0];
            part11[(R * SUB + g4 + 8) * 2 + h] = rs[1];
        }
    }
    // d(beta v) = T^T dΔ: dv = beta d(beta v), dbeta += v d(beta v)
    zero(acc);
    mm<NT, true, false>(acc, Tm + R * SUB * ldtm + R * SUB, ldtm, dDt + h * HALF * ldd + R * SUB,
                        ldd, C - R * SUB, lane);
    {
        E *dv = (E *)ba.d_v + (ci.t0 * HV + hv) * D;
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                int r = own_r(e), j = own_j(nt, e);
                if (r < n)
                    store2<E>(dv + (int64_t)r * ldv + j, bt[r] * acc[nt][e], bt[r] * acc[nt][e + 1]);
                rs[e >> 1] += to_f(Vs[r * LD + j]) * acc[nt][e] +
                              to_f(Vs[r * LD + j + 1]) * acc[nt][e + 1];
            }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            rs[0] += __shfl_xor_sync(0xffffffffu, rs[0], o);
            rs[1] += __shfl_xor_sync(0xffffffffu, rs[1], o);
        }
        if (t4 == 0) {
            part12[(R * SUB + g4) * 2 + h] = rs[0];
            part12[(R * SUB + g4 + 8) * 2 + h] = rs[1];
        }
    }
    // dT = (dW (Γk)^T + dΔ v^T) Diag(beta), strictly lower (T's diagonal is fixed at 1)
    for (int b = warp; b < NB * NB; b += WARPS) {
        int I, J;
        tile_rc(b, I, J);
        float a2[2][4];
        zero(a2);
        if (J <= I) {
            mm<2, false, false>(a2, dW + I * SUB * LD, LD, Kg + J * SUB * LD, LD, D, lane);
            mm<2, true, false>(a2, dDt + I * SUB, ldd, Vs + J * SUB * LD, LD, D, lane);
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                int r = I * SUB + frow(lane, e), col = J * SUB + fcol(lane, nt, e);
                store2<E>(dT + r * LDT + col, col < r ? bt[col] * a2[nt][e] : 0.0f,
                          col + 1 < r ? bt[col + 1] * a2[nt][e + 1] : 0.0f);
            }
    }
    __syncthreads();

    // dG of the last row from Kb and γ; X = T^T dT (blocks on and below the diagonal)
    if (tid < D) {
        float x = 0.0f;
        for (int p = 0; p < THREADS / D; p++)
            x += pgam[p * D + tid];
        x *= G.gam_last(tid);
        for (int RR = 0; RR < NB; RR++)
            x += part3[RR * D + tid];
        ba.dGl[ch * D + tid] = x;
    }
    for (int b = warp; b < NB * NB; b += WARPS) {
        int I, J;
        tile_rc(b, I, J);
        if (J > I)
            continue;
        float a2[2][4];
        zero(a2);
        mm<2, true, true>(a2, Tm + I * SUB * ldtm + I * SUB, ldtm, dT + I * SUB * LDT + J * SUB, LDT,
                          C - I * SUB, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e += 2)
                store2<E>(X + (I * SUB + frow(lane, e)) * LDT + J * SUB + fcol(lane, nt, e),
                          a2[nt][e], a2[nt][e + 1]);
    }
    __syncthreads();

    // dL = -X T^T (strictly lower): dLk = beta dL, dbeta += dL Lk
    {
        E *dLk = (E *)ba.dLk + ch * C * C;
        for (int b = warp; b < NB * NB; b += WARPS) {
            int I, J;
            tile_rc(b, I, J);
            float a2[2][4];
            zero(a2);
            if (J <= I)
                mm<2, false, false>(a2, X + I * SUB * LDT, LDT, Tm + J * SUB * ldtm, ldtm,
                                    (J + 1) * SUB, lane);
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = I * SUB + frow(lane, e), col = J * SUB + fcol(lane, nt, e);
                    float dl = col < r ? -a2[nt][e] : 0.0f;
                    dLk[r * C + col] = from_f<E>(bt[r] * dl);
                    rs[e >> 1] += dl * to_f(Lkg[r * C + col]);
                }
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                rs[0] += __shfl_xor_sync(0xffffffffu, rs[0], o);
                rs[1] += __shfl_xor_sync(0xffffffffu, rs[1], o);
            }
            if (t4 == 0) {
                part9[(I * SUB + g4) * NB + J] = rs[0];
                part9[(I * SUB + g4 + 8) * NB + J] = rs[1];
            }
        }
    }
    // the accumulators for part b, thread-major
    {
        float *pp = ba.part + ch * 3 * C * D;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                pp[((0 * NT + nt) * 4 + e) * THREADS + tid] = dq[nt][e];
                pp[((1 * NT + nt) * 4 + e) * THREADS + tid] = dk[nt][e];
                pp[((2 * NT + nt) * 4 + e) * THREADS + tid] = dG[nt][e];
            }
    }
    __syncthreads();
    if (tid < n) {
        float x = 0.0f;
        for (int J = 0; J < NB; J++)
            x += part9[tid * NB + J];
        x += part11[tid * 2] + part11[tid * 2 + 1] + part12[tid * 2] + part12[tid * 2 + 1];
        ((E *)ba.d_beta)[(ci.t0 + tid) * HV + hv] = from_f<E>(x);
    }
}

// ---- backward, part b ----------------------------------------------------------------------
// Every product here contracts over tokens, never over key channels, so a chunk's columns split
// into SPLIT independent blocks of CW = D / SPLIT channels (grid z). At D = 128 two 64-column
// blocks hold half the accumulators and shared memory of one (77 KB, <= 128 registers): two
// blocks and 16 warps per SM instead of one block and 8, which this latency-bound kernel needs.
template <int D> struct BwdBSplit { static constexpr int v = D >= 64 ? 2 : 1; };
// Blocks an SM to fit registers for: two on bf16 (the point of the split); the f32 test path
// keeps all the registers it wants.
template <typename E, int D> struct BwdBOcc {
    static constexpr int v = sizeof(E) == 2 ? BwdBSplit<D>::v : 1;
};

template <typename E, int D> struct BwdBL {
    static constexpr int CW = D / BwdBSplit<D>::v;
    static constexpr bool TC = sizeof(E) == 2;
    static constexpr int P = Pad<E>::v, LD = CW + P, LDT = C + P, LDH = GateLd<CW>::LDH;
    static constexpr size_t HR = al16((size_t)C * LDH * 4), CONST = 2 * NB * CW * 4;
    static constexpr size_t TD = (size_t)C * LD * sizeof(E);
    static constexpr size_t QK = al16(cmax(2 * TD, (size_t)C * LDH * 4));  // Qt, Kt | dG
    static constexpr size_t KC = (size_t)KC_ROWS * LD * sizeof(E);
    static constexpr size_t DA = TC ? (size_t)C * LDT * sizeof(E) : 0;
    static constexpr size_t o_const = HR, o_qk = o_const + al16(CONST), o_kc = o_qk + QK,
                            o_da = o_kc + al16(KC), o_dl = o_da + DA, bytes = o_dl + DA;
};

// Block z owns key channels [z CW, z CW + CW); warp (R, h) of it rows 16 R + frow and columns
// h CW/2 + fcol, which bwd_a's thread-major partials hold at its warp (R, z) and tile
// nt + h CW/16 (bwd_a's warp h owns D/2 = CW columns when SPLIT is 2).
template <typename E, int D>
__global__ void __launch_bounds__(THREADS, BwdBOcc<E, D>::v) bwd_b_kernel(BwdArgs ba)
{
    using L = BwdBL<E, D>;
    constexpr int CW = L::CW, LD = L::LD, LDT = L::LDT, LDH = L::LDH, NT = CW / 16,
                  HALF = CW / 2, NTA = D / 16;
    constexpr bool TC = L::TC;
    extern __shared__ __align__(16) unsigned char smem[];
    float *Hr = reinterpret_cast<float *>(smem), *Gm = reinterpret_cast<float *>(smem + L::o_const),
          *Sb = Gm + NB * CW;
    E *Qt = reinterpret_cast<E *>(smem + L::o_qk), *Kt = Qt + C * LD,
      *KC = reinterpret_cast<E *>(smem + L::o_kc);
    float *dGs = reinterpret_cast<float *>(smem + L::o_qk);  // after the products

    const int64_t c = blockIdx.x;
    const int hv = blockIdx.y, z = blockIdx.z, col0 = z * CW, tid = threadIdx.x, warp = tid >> 5,
              lane = tid & 31;
    ChunkInfo ci;
    if (!chunk_info(ba.seqs, c, ci))
        return;
    const int n = ci.n, HV = ba.HV, H = ba.H, hq = hv / (HV / H);
    const int64_t ldq = (int64_t)H * D, ldv = (int64_t)HV * D, ch = c * HV + hv;
    const E *q = (const E *)ba.q + (ci.t0 * H + hq) * D + col0,
            *k = (const E *)ba.k + (ci.t0 * H + hq) * D + col0;
    const E *g = (const E *)ba.g + (ci.t0 * HV + hv) * D + col0;
    const E *dAsg = (const E *)ba.dAs + ch * C * C, *dLkg = (const E *)ba.dLk + ch * C * C;
    const E *dAs = dAsg, *dLk = dLkg;
    if (TC) {
        E *a = reinterpret_cast<E *>(smem + L::o_da), *b = reinterpret_cast<E *>(smem + L::o_dl);
        tile_in<E>(a, LDT, dAsg, C, C, C, C, tid, THREADS);
        tile_in<E>(b, LDT, dLkg, C, C, C, C, tid, THREADS);
        cp_async_commit();
        dAs = a, dLk = b;
    }
    const int ldA = TC ? LDT : C;
    gate_phase<E, CW>(g, ldv, n, Hr, Gm, Sb, tid);
    Gate<CW> G{Hr, Gm, Sb, n - 1, (n - 1) / SUB};
    build_sides<E, CW, LD>(G, q, k, ldq, n, Qt, Kt, KC, (E *)nullptr, (E *)nullptr, 0.0f, tid);
    cp_async_wait<0>();
    __syncthreads();

    const int R = warp >> 1, h = warp & 1;
    float dq[NT][4], dk[NT][4], dG[NT][4], acc[NT][4];
    // bwd_a's owner of these columns: warp (R, col0 + h HALF) / (D / 2), from tile nta0
    const int ja = col0 + h * HALF, tida = (R * 2 + ja / (D / 2)) * 32 + lane,
              nta0 = (ja % (D / 2)) / 8;
    const float *pp = ba.part + ch * 3 * C * D;
    const float *dd = ba.dd + ch * C;
    const E *KCR = KC + kc_off(R) * LD;  // KC_R: k 2^-Hr on the rows of block R
    // the owners read q, k back from the sides: q = Qt 2^-Hr, k = KC_R 2^Hr
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = R * SUB + frow(lane, e), j = h * HALF + fcol(lane, nt, e);
            float hr = G.hr(r, j);
            float qv = to_f(Qt[r * LD + j]) * ex2(-hr), kv = to_f(KCR[r * LD + j]) * ex2(hr);
            float x = dd[r];  // Aqk's diagonal, s q_r . k_r, carries no decay
            const int ta = nta0 + nt;
            dq[nt][e] = pp[((0 * NTA + ta) * 4 + e) * THREADS + tida] + x * kv;
            dk[nt][e] = pp[((1 * NTA + ta) * 4 + e) * THREADS + tida] + x * qv;
            dG[nt][e] = pp[((2 * NTA + ta) * 4 + e) * THREADS + tida];
        }
    // row sides: dQt = dAs KC_R, dKt = dLk KC_R (K = columns up to block R);
    // dq += 2^Hr dQt, dG += Qt dQt, and the same for k
    zero(acc);
    mm<NT, false, true>(acc, dAs + R * SUB * ldA, ldA, KCR + h * HALF, LD, (R + 1) * SUB, lane);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = R * SUB + frow(lane, e), j = h * HALF + fcol(lane, nt, e);
            dq[nt][e] += ex2(G.hr(r, j)) * acc[nt][e];
            dG[nt][e] += to_f(Qt[r * LD + j]) * acc[nt][e];
        }
    zero(acc);
    mm<NT, false, true>(acc, dLk + R * SUB * ldA, ldA, KCR + h * HALF, LD, (R + 1) * SUB, lane);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = R * SUB + frow(lane, e), j = h * HALF + fcol(lane, nt, e);
            dk[nt][e] += ex2(G.hr(r, j)) * acc[nt][e];
            dG[nt][e] += to_f(Kt[r * LD + j]) * acc[nt][e];
        }
    // column sides: rows of block R in KC_I for every I >= R; dk += 2^(Md - Hr) dKC, dG -= KC dKC
    float md[NT][2];  // Md(I, R) of the owner's columns, summed as I grows
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        md[nt][0] = md[nt][1] = 0.0f;
    for (int I = R; I < NB; I++) {
        if (I > R)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    md[nt][e] += Sb[I * CW + h * HALF + fcol(lane, nt, e)];
        zero(acc);
        mm<NT, true, true>(acc, dAs + I * SUB * ldA + R * SUB, ldA, Qt + I * SUB * LD + h * HALF, LD,
                           SUB, lane);
        mm<NT, true, true>(acc, dLk + I * SUB * ldA + R * SUB, ldA, Kt + I * SUB * LD + h * HALF, LD,
                           SUB, lane);
        const E *KCI = KC + kc_off(I) * LD;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = R * SUB + frow(lane, e), j = h * HALF + fcol(lane, nt, e);
                dk[nt][e] += ex2(md[nt][e & 1] - G.hr(r, j)) * acc[nt][e];
                dG[nt][e] -= to_f(KCI[r * LD + j]) * acc[nt][e];
            }
    }
    __syncthreads();

    // dq, dk out; dG to shared memory for the reverse cumulative sum
    const bool gva = HV != H;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            int r = R * SUB + frow(lane, e), j = h * HALF + fcol(lane, nt, e);
            dGs[r * LDH + j] = dG[nt][e];
            dGs[r * LDH + j + 1] = dG[nt][e + 1];
            if (r < n) {
                if (gva) {
                    int64_t o = ((ci.t0 + r) * HV + hv) * D + col0 + j;
                    *reinterpret_cast<float2 *>(ba.dqv + o) = make_float2(dq[nt][e], dq[nt][e + 1]);
                    *reinterpret_cast<float2 *>(ba.dkv + o) = make_float2(dk[nt][e], dk[nt][e + 1]);
                } else {
                    int64_t o = ((ci.t0 + r) * H + hq) * D + col0 + j;
                    store2<E>((E *)ba.d_q + o, dq[nt][e], dq[nt][e + 1]);
                    store2<E>((E *)ba.d_k + o, dk[nt][e], dk[nt][e + 1]);
                }
            }
        }
    __syncthreads();
    // dg_t = sum_{r >= t} dG_r (G_r = sum_{t <= r} g_t), the last row's Kb and γ terms added
    if (tid < CW) {
        E *dg = (E *)ba.d_g + (ci.t0 * HV + hv) * D + col0 + tid;
        float run = ba.dGl[ch * D + col0 + tid];
        for (int r = n - 1; r >= 0; r--) {
            run += dGs[r * LDH + tid];
            dg[(int64_t)r * ldv] = from_f<E>(run);
        }
    }
}

template <typename E, int D>
int prep_t(cudaStream_t st, const Dims &d, const kda_cuda_args *a, const Bufs &b, bool bwd,
           k3rt_error *err)
{
    PrepArgs pa{d.seqs, (int)d.H, (int)d.HV, d.scale, a->q, a->k, a->v, a->g, a->beta,
                b.Qg, b.Kb, b.W, b.A, b.Ut, b.Tm, b.Lk, b.gam};
    constexpr size_t sm = PrepL<E, D>::bytes;
    static_assert(sm <= 227 * 1024, "prep: shared memory");
    dim3 grid((unsigned)d.NC, (unsigned)d.HV);
    if (bwd) {
        if (allow_smem(prep_kernel<E, D, true>, sm, "cudaFuncSetAttribute (kda prep_kernel)", err))
            return K3RT_ERR_DEVICE;
        prep_kernel<E, D, true><<<grid, THREADS, sm, st>>>(pa);
    } else {
        if (allow_smem(prep_kernel<E, D, false>, sm, "cudaFuncSetAttribute (kda prep_kernel)", err))
            return K3RT_ERR_DEVICE;
        prep_kernel<E, D, false><<<grid, THREADS, sm, st>>>(pa);
    }
    KDA_LAUNCHED("kda prep_kernel");
    return K3RT_OK;
}

template <typename E, int D>
int bwd_t(cudaStream_t st, const Dims &d, const kda_cuda_args *a, const Bufs &b, k3rt_error *err)
{
    BwdArgs ba{d.seqs, (int)d.H, (int)d.HV, d.scale, a->q, a->k, a->v, a->g, a->beta, a->d_o,
               b.Qg, b.Kb, b.Tm, b.Lk, b.St, b.Dt, b.dSt, b.dDt, b.dAs, b.dLk, b.part, b.dGl, b.dd,
               a->d_v, a->d_beta, a->d_q, a->d_k, a->d_g, b.dqv, b.dkv};
    dim3 grid((unsigned)d.NC, (unsigned)d.HV), grid_b(grid.x, grid.y, BwdBSplit<D>::v);
    constexpr size_t sa = BwdAL<E, D>::bytes, sb = BwdBL<E, D>::bytes;
    static_assert(sa <= 227 * 1024 && sb <= 227 * 1024, "bwd: shared memory");
    if (allow_smem(bwd_a_kernel<E, D>, sa, "cudaFuncSetAttribute (kda bwd_a_kernel)", err) ||
        allow_smem(bwd_b_kernel<E, D>, sb, "cudaFuncSetAttribute (kda bwd_b_kernel)", err))
        return K3RT_ERR_DEVICE;
    bwd_a_kernel<E, D><<<grid, THREADS, sa, st>>>(ba);
    KDA_LAUNCHED("kda bwd_a_kernel");
    bwd_b_kernel<E, D><<<grid_b, THREADS, sb, st>>>(ba);
    KDA_LAUNCHED("kda bwd_b_kernel");
    return K3RT_OK;
}

}  // namespace

int launch_prep(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a, const Bufs &b,
                bool bwd, k3rt_error *err)
{
    if (dtype == K3RT_BF16)
        switch (d.D) {
        case 32: return prep_t<bf16, 32>(st, d, a, b, bwd, err);
        case 64: return prep_t<bf16, 64>(st, d, a, b, bwd, err);
        default: return prep_t<bf16, 128>(st, d, a, b, bwd, err);
        }
    switch (d.D) {
    case 32: return prep_t<float, 32>(st, d, a, b, bwd, err);
    case 64: return prep_t<float, 64>(st, d, a, b, bwd, err);
    default: return prep_t<float, 128>(st, d, a, b, bwd, err);
    }
}

int launch_bwd_chunks(cudaStream_t st, int dtype, const Dims &d, const kda_cuda_args *a,
                      const Bufs &b, k3rt_error *err)
{
    if (dtype == K3RT_BF16)
        switch (d.D) {
        case 32: return bwd_t<bf16, 32>(st, d, a, b, err);
        case 64: return bwd_t<bf16, 64>(st, d, a, b, err);
        default: return bwd_t<bf16, 128>(st, d, a, b, err);
        }
    switch (d.D) {
    case 32: return bwd_t<float, 32>(st, d, a, b, err);
    case 64: return bwd_t<float, 64>(st, d, a, b, err);
    default: return bwd_t<float, 128>(st, d, a, b, err);
    }
}

}  // namespace kdacu
