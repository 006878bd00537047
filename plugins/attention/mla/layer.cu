// The per-token loops of the MLA layer around the attention core (mla_cuda.h): assembling the
// per-head queries and keys from their nope and shared parts, splitting their gradients back
// (the shared key's summed over heads in order). Grid-stride loops, 16-byte accesses where the
// widths allow. (The sigmoid output gate is the core's k3rt_glu_* with K3RT_GLU_SIGMOID.)
#include "cuda_common.cuh"

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

// One thread per V elements of dst (or src): V = 16 bytes of elements when both widths and
// every pointer allow it, else 1; I is 32-bit when the count fits (the division by the row
// width is most of a scalar copy's cost; elements and the grid stride added to an index both
// stay below 2^31 then). Both widths are multiples of V, so no access
// straddles the nope | shared boundary.
template <typename E, int V> struct alignas(V * sizeof(E)) vec_t {
    E e[V];
};

template <typename E, int V, typename I>
__global__ void assemble_kernel(E *dst, const E *a, I wa, const E *b, I wb, int shared, I H,
                                I n_vec)
{
    typedef vec_t<E, V> vec;
    const I w = (wa + wb) / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec;
         i += (I)gridDim.x * blockDim.x) {
        const I c = (i % w) * V, nh = i / w;
        const E *from = c < wa ? a + nh * wa + c : b + (shared ? nh / H : nh) * wb + (c - wa);
        reinterpret_cast<vec *>(dst)[i] = *reinterpret_cast<const vec *>(from);
    }
}

template <typename E, int V, typename I>
__global__ void split_kernel(const E *src, E *a, I wa, E *b, I wb, int b_here, I n_vec)
{
    typedef vec_t<E, V> vec;
    const I w = (wa + wb) / V;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec;
         i += (I)gridDim.x * blockDim.x) {
        const I c = (i % w) * V, nh = i / w;
        E *to = c < wa ? (a ? a + nh * wa + c : nullptr) : b_here ? b + nh * wb + (c - wa)
                                                                   : nullptr;
        if (to)
            *reinterpret_cast<vec *>(to) = reinterpret_cast<const vec *>(src)[i];
    }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The vector width for rows of widths wa | wb at these pointers (NULL ones do not count).
template <typename E> int vec_width(int64_t wa, int64_t wb, const void *p, const void *q,
                                    const void *r)
{
    const int V = 16 / sizeof(E);
    const bool ok = wa % V == 0 && wb % V == 0 && (!p || aligned16(p)) && (!q || aligned16(q)) &&
                    (!r || aligned16(r));
    return ok ? V : 1;
}

template <typename E, int V>
void assemble_launch(cudaStream_t st, E *dst, const E *a, int64_t wa, const E *b, int64_t wb,
                     int shared, int64_t N, int64_t H)
{
    const int64_t n_vec = N * H * (wa + wb) / V;
    if (N * H * (wa + wb) < INT32_MAX / 2)
        assemble_kernel<E, V, int32_t><<<blocks_for(n_vec), kThreads, 0, st>>>(
            dst, a, (int32_t)wa, b, (int32_t)wb, shared, (int32_t)H, (int32_t)n_vec);
    else
        assemble_kernel<E, V, int64_t><<<blocks_for(n_vec), kThreads, 0, st>>>(
            dst, a, wa, b, wb, shared, H, n_vec);
}

template <typename E>
void assemble_t(cudaStream_t st, E *dst, const E *a, int64_t wa, const E *b, int64_t wb,
                int shared, int64_t N, int64_t H)
{
    if (vec_width<E>(wa, wb, dst, a, b) > 1)
        assemble_launch<E, 16 / sizeof(E)>(st, dst, a, wa, b, wb, shared, N, H);
    else
        assemble_launch<E, 1>(st, dst, a, wa, b, wb, shared, N, H);
}

template <typename E, int V>
void split_launch(cudaStream_t st, const E *src, E *a, int64_t wa, E *b, int64_t wb, int b_here,
                  int64_t N, int64_t H)
{
    const int64_t n_vec = N * H * (wa + wb) / V;
    if (N * H * (wa + wb) < INT32_MAX / 2)
        split_kernel<E, V, int32_t><<<blocks_for(n_vec), kThreads, 0, st>>>(
            src, a, (int32_t)wa, b, (int32_t)wb, b_here, (int32_t)n_vec);
    else
        split_kernel<E, V, int64_t><<<blocks_for(n_vec), kThreads, 0, st>>>(src, a, wa, b, wb,
                                                                           b_here, n_vec);
}

template <typename E>
void split_t(cudaStream_t st, const E *src, E *a, int64_t wa, E *b, int64_t wb, int b_here,
             int64_t N, int64_t H)
{
    if (vec_width<E>(wa, wb, src, a, b_here ? b : nullptr) > 1)
        split_launch<E, 16 / sizeof(E)>(st, src, a, wa, b, wb, b_here, N, H);
    else
        split_launch<E, 1>(st, src, a, wa, b, wb, b_here, N, H);
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
        assemble_t<bf16>(st, (bf16 *)dst, (const bf16 *)a, wa, (const bf16 *)b, wb, b_shared, N,
                         H);
    else
        assemble_t<float>(st, (float *)dst, (const float *)a, wa, (const float *)b, wb, b_shared,
                          N, H);
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
            split_t<bf16>(st, (const bf16 *)src, (bf16 *)a, wa, (bf16 *)b, wb, b_here, N, H);
        else
            split_t<float>(st, (const float *)src, (float *)a, wa, (float *)b, wb, b_here, N, H);
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
