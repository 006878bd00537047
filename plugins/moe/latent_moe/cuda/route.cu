// Routing and dispatch on the device (lmoe_cuda.h): the biased top-k with the CPU's tie order,
// the gates, and the expert-sorted permutation by a counting sort in three passes over chunks
// of LMOE_CU_SORT_CHUNK pairs (per-chunk histograms, a prefix over chunks per expert, then each
// chunk places its pairs). Integer counts only, so the permutation is the same on every run and
// equals the CPU's stable order.
#include "common.cuh"

namespace lmcu {

constexpr int ROUTE_WARPS = 4;  // tokens per block of the top-k

struct Cand {
    float v;
    int id;  // -1: none yet
};

// b beats a: larger value, equal values by lower expert id (the CPU's insertion order).
__device__ __forceinline__ bool beats(Cand b, Cand a)
{
    return b.id >= 0 && (a.id < 0 || b.v > a.v || (b.v == a.v && b.id < a.id));
}

// One warp per token. Lane L owns experts L, L + 32, ... (at most 32 of them with E <= 1024) and
// marks what was taken in a bit mask; each of the k rounds takes the warp's best remaining.
__global__ void route_kernel(const float *s, const float *bias, int64_t N, int E, int k,
                             int renormalize, float rscale, int32_t *sel, float *p)
{
    __shared__ float sb[LMOE_CU_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        sb[e] = bias ? bias[e] : 0.0f;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (t >= N)
        return;
    const float *st = s + t * E;
    unsigned taken = 0;
    float sum = 0.0f;
    int chosen[LMOE_CU_MAX_TOPK];
    for (int j = 0; j < k; j++) {
        Cand best = {0.0f, -1};
        for (int e = lane, b = 0; e < E; e += 32, b++) {
            Cand c = {st[e] + sb[e], e};
            if (!(taken >> b & 1u) && beats(c, best))
                best = c;
        }
        for (int o = 16; o > 0; o >>= 1) {
            Cand other = {__shfl_xor_sync(0xffffffffu, best.v, o),
                          __shfl_xor_sync(0xffffffffu, best.id, o)};
            if (beats(other, best))
                best = other;
        }
        if (best.id >= 0 && (best.id & 31) == lane)
            taken |= 1u << (best.id >> 5);
        chosen[j] = best.id;
    }
    if (lane != 0)
        return;
    for (int j = 0; j < k; j++) {
        sel[t * k + j] = chosen[j];
        sum += st[chosen[j]];
    }
    float scale = renormalize ? rscale / (sum + 1e-20f) : rscale;
    for (int j = 0; j < k; j++)
        p[t * k + j] = scale * st[chosen[j]];
}

// hist[c][e] = pairs of chunk c routed to e.
__global__ void chunk_hist_kernel(const int32_t *sel, int64_t R, int E, int32_t *hist)
{
    __shared__ int cnt[LMOE_CU_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    int64_t i0 = (int64_t)blockIdx.x * LMOE_CU_SORT_CHUNK, i1 = min(i0 + LMOE_CU_SORT_CHUNK, R);
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
        atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        hist[(int64_t)blockIdx.x * E + e] = cnt[e];
}

// One block, thread e per expert: hist[c][e] becomes the pairs of e in chunks before c, counts
// the totals, offsets their exclusive prefix (serial over E <= 1024: a few microseconds).
__global__ void expert_scan_kernel(int32_t *hist, int64_t chunks, int E, int64_t *counts,
                                   int64_t *offsets)
{
    __shared__ long long tot[LMOE_CU_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        long long run = 0;
        for (int64_t c = 0; c < chunks; c++) {
            int32_t h = hist[c * E + e];
            hist[c * E + e] = (int32_t)run;
            run += h;
        }
        tot[e] = run;
        counts[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        long long at = 0;
        for (int e = 0; e < E; e++) {
            offsets[e] = at;
            at += tot[e];
        }
        offsets[E] = at;
    }
}

// One warp per chunk walks it in order, 32 pairs a step: the lanes routed to the same expert
// find each other (match_any) and take consecutive rows in lane order.
__global__ void place_kernel(const int32_t *sel, int64_t R, int E, const int32_t *hist,
                             const int64_t *offsets, int32_t *pos, int32_t *src)
{
    __shared__ int cur[LMOE_CU_MAX_EXPERTS];
    const int lane = threadIdx.x;
    for (int e = lane; e < E; e += 32)
        cur[e] = (int)offsets[e] + hist[(int64_t)blockIdx.x * E + e];
    __syncwarp();
    int64_t i0 = (int64_t)blockIdx.x * LMOE_CU_SORT_CHUNK, i1 = min(i0 + LMOE_CU_SORT_CHUNK, R);
    for (int64_t base = i0; base < i1; base += 32) {
        int64_t i = base + lane;
        bool live = i < i1;
        unsigned active = __ballot_sync(0xffffffffu, live);
        if (live) {
            int e = sel[i];
            unsigned peers = __match_any_sync(active, e);
            int rank = __popc(peers & ((1u << lane) - 1u));
            int row = cur[e] + rank;
            pos[i] = row;
            src[row] = (int32_t)i;
            __syncwarp(active);
            if (rank == 0)
                cur[e] += __popc(peers);
        }
        __syncwarp();
    }
}

}  // namespace lmcu

using namespace lmcu;

extern "C" int lmoe_cu_enter(int device, k3rt_error *err)
{
    LMOE_CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    return K3RT_OK;
}

extern "C" int lmoe_cu_route(void *stream, const float *s, const float *bias, int64_t N, int64_t E,
                           int64_t k, int renormalize, double rscale, int32_t *sel, float *p,
                           k3rt_error *err)
{
    if (E < 1 || E > LMOE_CU_MAX_EXPERTS || k < 1 || k > LMOE_CU_MAX_TOPK || k > E)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "latent_moe: the CUDA routing takes up to %d "
                         "experts and top-%d (k <= experts), got top-%lld of %lld",
                         LMOE_CU_MAX_EXPERTS, LMOE_CU_MAX_TOPK, (long long)k, (long long)E);
    if (N < 1)
        return K3RT_OK;
    route_kernel<<<blocks((N + ROUTE_WARPS - 1) / ROUTE_WARPS), ROUTE_WARPS * 32, 0,
                   (cudaStream_t)stream>>>(s, bias, N, (int)E, (int)k, renormalize,
                                           (float)rscale, sel, p);
    LMOE_LAUNCHED("route_kernel");
    return K3RT_OK;
}

extern "C" int64_t lmoe_cu_dispatch_scratch(int64_t R, int64_t E)
{
    int64_t chunks = (R + LMOE_CU_SORT_CHUNK - 1) / LMOE_CU_SORT_CHUNK;
    return (chunks > 0 ? chunks : 1) * E * (int64_t)sizeof(int32_t);
}

extern "C" int lmoe_cu_dispatch(void *stream, const int32_t *sel, int64_t R, int64_t E,
                              void *scratch, int64_t *counts, int64_t *offsets, int32_t *pos,
                              int32_t *src, k3rt_error *err)
{
    if (E < 1 || E > LMOE_CU_MAX_EXPERTS || R < 0 || R > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "latent_moe: the CUDA dispatch takes up to "
                         "%d experts and 2^31 - 1 rows, got %lld experts, %lld rows",
                         LMOE_CU_MAX_EXPERTS, (long long)E, (long long)R);
    cudaStream_t st = (cudaStream_t)stream;
    int64_t chunks = (R + LMOE_CU_SORT_CHUNK - 1) / LMOE_CU_SORT_CHUNK;
    int32_t *hist = (int32_t *)scratch;
    if (chunks > 0) {
        chunk_hist_kernel<<<blocks(chunks), 256, 0, st>>>(sel, R, (int)E, hist);
        LMOE_LAUNCHED("chunk_hist_kernel");
    }
    int threads = (int)((E + 31) / 32 * 32);
    expert_scan_kernel<<<1, threads, 0, st>>>(hist, chunks, (int)E, counts, offsets);
    LMOE_LAUNCHED("expert_scan_kernel");
    if (chunks > 0) {
        place_kernel<<<blocks(chunks), 32, 0, st>>>(sel, R, (int)E, hist, offsets, pos, src);
        LMOE_LAUNCHED("place_kernel");
    }
    return K3RT_OK;
}
