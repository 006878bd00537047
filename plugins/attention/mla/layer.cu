// The per-token loops of the MLA layer around the attention core (mla_cuda.h): assembling the
// per-head queries and keys from their nope and shared parts, splitting their gradients back
// (the shared key's summed over heads in order), and the sigmoid output gate. Grid-stride
// loops over elements, fp32 arithmetic.
#include "cuda_common.cuh"

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

template <typename E>
__global__ void assemble_kernel(E *dst, const E *a, int64_t wa, const E *b, int64_t wb,
                                int shared, int64_t N, int64_t H)
{
    const int64_t w = wa + wb, n_all = N * H * w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i % w, nh = i / w;
        dst[i] = c < wa ? a[nh * wa + c] : shared ? b[(nh / H) * wb + c - wa] : b[nh * wb + c - wa];
    }
}

template <typename E>
__global__ void split_kernel(const E *src, E *a, int64_t wa, E *b, int64_t wb, int b_here,
                             int64_t N, int64_t H)
{
    const int64_t w = wa + wb, n_all = N * H * w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i % w, nh = i / w;
        if (c < wa) {
            if (a)
                a[nh * wa + c] = src[i];
        } else if (b_here) {
            b[nh * wb + c - wa] = src[i];
        }
    }
}

// b[n, j] = sum over h in order of src[n, h, wa + j].
template <typename E>
__global__ void head_sum_kernel(const E *src, int64_t wa, E *b, int64_t wb, int64_t N, int64_t H)
{
    const int64_t w = wa + wb;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * wb;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / wb, j = i % wb;
        float s = 0.0f;
        for (int64_t h = 0; h < H; h++)
            s += to_f(src[(n * H + h) * w + wa + j]);
        b[i] = from_f<E>(s);
    }
}

// sigmoid with the CPU path's clamp: z is held >= -80 so exp(-z) stays finite.
__device__ __forceinline__ float sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-fmaxf(z, -80.0f)));
}

template <typename E>
__global__ void gate_fwd_kernel(const E *o, const E *z, E *g, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        g[i] = from_f<E>(to_f(o[i]) * sigmoid(to_f(z[i])));
}

template <typename E>
__global__ void gate_bwd_kernel(const E *o, const E *z, E *dg, E *dz, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float sg = sigmoid(to_f(z[i])), d = to_f(dg[i]);
        dz[i] = from_f<E>(d * to_f(o[i]) * sg * (1.0f - sg));
        dg[i] = from_f<E>(d * sg);
    }
}

int check_dtype(int dtype, const char *what, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla %s: dtype %s is not supported on CUDA (f32 "
                         "or bf16)", what, k3rt_dtype_name(dtype));
    return K3RT_OK;
}

}  // namespace

extern "C" int mla_assemble_cuda(void *stream, int dtype, void *dst, const void *a, int64_t wa,
                                 const void *b, int64_t wb, int b_shared, int64_t N, int64_t H,
                                 k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, "assemble", err));
    cudaStream_t st = (cudaStream_t)stream;
    int64_t n = N * H * (wa + wb);
    if (n == 0)
        return K3RT_OK;
    if (dtype == K3RT_BF16)
        assemble_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
            (bf16 *)dst, (const bf16 *)a, wa, (const bf16 *)b, wb, b_shared, N, H);
    else
        assemble_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
            (float *)dst, (const float *)a, wa, (const float *)b, wb, b_shared, N, H);
    MLA_LAUNCHED("mla assemble_kernel");
    return K3RT_OK;
}

extern "C" int mla_split_cuda(void *stream, int dtype, const void *src, void *a, int64_t wa,
                              void *b, int64_t wb, int b_shared, int64_t N, int64_t H,
                              k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, "split", err));
    cudaStream_t st = (cudaStream_t)stream;
    int64_t n = N * H * (wa + wb);
    int b_here = b && wb > 0 && !b_shared;
    if (n > 0 && (a || b_here)) {
        if (dtype == K3RT_BF16)
            split_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
                (const bf16 *)src, (bf16 *)a, wa, (bf16 *)b, wb, b_here, N, H);
        else
            split_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
                (const float *)src, (float *)a, wa, (float *)b, wb, b_here, N, H);
        MLA_LAUNCHED("mla split_kernel");
    }
    if (b && wb > 0 && b_shared && N > 0) {
        if (dtype == K3RT_BF16)
            head_sum_kernel<bf16><<<blocks_for(N * wb), kThreads, 0, st>>>(
                (const bf16 *)src, wa, (bf16 *)b, wb, N, H);
        else
            head_sum_kernel<float><<<blocks_for(N * wb), kThreads, 0, st>>>(
                (const float *)src, wa, (float *)b, wb, N, H);
        MLA_LAUNCHED("mla head_sum_kernel");
    }
    return K3RT_OK;
}

extern "C" int mla_gate_fwd_cuda(void *stream, int dtype, const void *o, const void *z, void *g,
                                 int64_t n, k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, "gate", err));
    if (n <= 0)
        return K3RT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        gate_fwd_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
            (const bf16 *)o, (const bf16 *)z, (bf16 *)g, n);
    else
        gate_fwd_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
            (const float *)o, (const float *)z, (float *)g, n);
    MLA_LAUNCHED("mla gate_fwd_kernel");
    return K3RT_OK;
}

extern "C" int mla_gate_bwd_cuda(void *stream, int dtype, const void *o, const void *z, void *dg,
                                 void *dz, int64_t n, k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, "gate", err));
    if (n <= 0)
        return K3RT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        gate_bwd_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
            (const bf16 *)o, (const bf16 *)z, (bf16 *)dg, (bf16 *)dz, n);
    else
        gate_bwd_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
            (const float *)o, (const float *)z, (float *)dg, (float *)dz, n);
    MLA_LAUNCHED("mla gate_bwd_kernel");
    return K3RT_OK;
}
