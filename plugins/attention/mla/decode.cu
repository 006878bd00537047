// One query per (sequence, head) against MLA's latent cache (mla_cuda.h, mla_decode_attend_cuda):
// the decode-absorbed attention of mla.h's mla_cache.
//
// Tiling. A block of kThreads threads per (b, h). Pass 1: warp w takes positions w, w + 8, ...;
// its lanes stride over the dc + dr channels of the cached row (coalesced reads) against the
// query held in shared memory, and one warp reduction gives the position's score, kept in fp32
// scratch. Pass 2: the block's max and sum of exp over the scores (two block reductions).
// Pass 3: threads stride over the dc channels of ĉ and sum p_τ ĉ_τ over the positions. A step
// reads the cache (L (dc + dr) values) twice per head, so it is bound by memory traffic (the
// cache of one sequence stays in L2 across the heads of a step at these sizes); fp32 throughout,
// as the forward's softmax.
#include <float.h>

#include "cuda_common.cuh"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The block's sum (is_max 0) or max (1) of v, in every thread.
__device__ float block_reduce(float v, int is_max, float *red)
{
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // red may still be read from the previous reduction
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < kWarps; i++)
        r = is_max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

template <typename E>
__global__ void __launch_bounds__(kThreads)
attend_kernel(int64_t H, int64_t dc, int64_t dr, int64_t L, int64_t cap, float scale,
              const E *q_abs, const E *q_r, const E *kv, float *scores, E *ctx)
{
    extern __shared__ float sq[];  // [dc + dr]: the query
    __shared__ float red[kWarps];
    const int64_t item = blockIdx.x, b = item / H, w = dc + dr;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t i = threadIdx.x; i < w; i += kThreads)
        sq[i] = i < dc ? to_f(q_abs[item * dc + i]) : to_f(q_r[item * dr + i - dc]);
    __syncthreads();
    const E *rows = kv + b * cap * w;
    float *sc = scores + item * cap;
    for (int64_t t = warp; t < L; t += kWarps) {
        const E *row = rows + t * w;
        float acc = 0.0f;
        for (int64_t i = lane; i < w; i += 32)
            acc += sq[i] * to_f(row[i]);
        acc = warp_sum(acc);
        if (lane == 0)
            sc[t] = scale * acc;
    }
    __syncthreads();
    float mx = -FLT_MAX;
    for (int64_t t = threadIdx.x; t < L; t += kThreads)
        mx = fmaxf(mx, sc[t]);
    mx = block_reduce(mx, 1, red);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < L; t += kThreads) {
        float p = expf(sc[t] - mx);
        sc[t] = p;
        sum += p;
    }
    const float inv = 1.0f / block_reduce(sum, 0, red);  // its barriers order the p writes too
    for (int64_t c = threadIdx.x; c < dc; c += kThreads) {
        float acc = 0.0f;
        for (int64_t t = 0; t < L; t++)
            acc += sc[t] * to_f(rows[t * w + c]);
        ctx[item * dc + c] = from_f<E>(acc * inv);
    }
}

template <typename E>
int launch(cudaStream_t st, int64_t B, int64_t H, int64_t dc, int64_t dr, int64_t L,
           int64_t cap, float scale, const void *q_abs, const void *q_r, const void *kv,
           float *scores, void *ctx, size_t smem, k3rt_error *err)
{
    if (smem > 48 * 1024)
        MLA_CU_TRY(cudaFuncSetAttribute(attend_kernel<E>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                   "cudaFuncSetAttribute");
    attend_kernel<E><<<(unsigned)(B * H), kThreads, smem, st>>>(
        H, dc, dr, L, cap, scale, (const E *)q_abs, (const E *)q_r, (const E *)kv, scores,
        (E *)ctx);
    MLA_LAUNCHED("mla attend_kernel");
    return K3RT_OK;
}

}  // namespace

extern "C" int mla_decode_attend_cuda(void *stream, int dtype, int64_t B, int64_t H, int64_t dc,
                                      int64_t dr, int64_t L, int64_t cap, double scale,
                                      const void *q_abs, const void *q_r, const void *kv,
                                      float *scores, void *ctx, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla decode: dtype %s is not supported on CUDA "
                         "(f32 or bf16)", k3rt_dtype_name(dtype));
    if (B < 1 || H < 1 || dc < 1 || dr < 0 || L < 1 || L > cap || (dr && !q_r))
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla decode: B = %lld, H = %lld, dc = %lld, dr "
                         "= %lld, %lld positions of %lld", (long long)B, (long long)H,
                         (long long)dc, (long long)dr, (long long)L, (long long)cap);
    int limit;
    K3RT_TRY(mla_smem_limit(&limit, err));
    size_t smem = (size_t)(dc + dr) * sizeof(float);
    if (smem > (size_t)limit)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "mla decode: a query of %lld values does not "
                         "fit shared memory (%d bytes)", (long long)(dc + dr), limit);
    cudaStream_t st = (cudaStream_t)stream;
    return dtype == K3RT_BF16
               ? launch<bf16>(st, B, H, dc, dr, L, cap, (float)scale, q_abs, q_r, kv, scores, ctx,
                              smem, err)
               : launch<float>(st, B, H, dc, dr, L, cap, (float)scale, q_abs, q_r, kv, scores,
                               ctx, smem, err);
}
