// AdamW on f32 master parameters, gradients and moments (k3rt_adamw_step's formula): the bias
// corrections and the step size are folded on the host in double, the element update runs in
// fp32, as the CPU reference and torch's AdamW do.
//   single tensor: the elementwise kernel (16-byte accesses when aligned)
//   many tensors:  one launch; block b updates chunk b of a host-built table of
//                  (tensor, first element) chunks of kChunk elements, with the tensor's own
//                  decay factor, 16-byte accesses where the tensor's four arrays allow them.
#include <new>
#include <vector>

#include "ops/cuda/elementwise.cuh"

namespace {

struct adamw_consts {
    float decay, step_size, rc2, eps, b1, b2, one_b1, one_b2;
};

adamw_consts fold(double lr, double b1, double b2, double eps, double wd, int64_t step)
{
    double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
    return {(float)(1.0 - lr * wd), (float)(lr / c1), (float)(1.0 / sqrt(c2)), (float)eps,
            (float)b1, (float)b2, (float)(1.0 - b1), (float)(1.0 - b2)};
}

// p, m, v updated from g; returns nothing, writes through the references.
__device__ __forceinline__ void adamw_elem(const adamw_consts &k, float &p, float g, float &m,
                                           float &v)
{
    m = k.b1 * m + k.one_b1 * g;
    v = k.b2 * v + k.one_b2 * g * g;
    p = p * k.decay - k.step_size * m / (sqrtf(v) * k.rc2 + k.eps);
}

// in: p, g, m, v; out: p, m, v
struct adamw_op {
    adamw_consts k;
    __device__ void operator()(const float *in, float *out) const
    {
        float p = in[0], m = in[2], v = in[3];
        adamw_elem(k, p, in[1], m, v);
        out[0] = p;
        out[1] = m;
        out[2] = v;
    }
};

constexpr int64_t kChunk = 65536;
constexpr int kThreads = 256;

// One tensor of a multi-tensor step as the kernel sees it.
struct multi_tensor {
    float *p;
    const float *g;
    float *m, *v;
    int64_t n;
    float decay;  // 1 - lr * weight_decay of this tensor
    int vec;      // all four arrays 16-byte aligned
};

struct chunk {
    int64_t tensor, first;
};

// Elements i .. i+V-1 of tensor t.
template <int V>
__device__ __forceinline__ void update(const multi_tensor &t, const adamw_consts &k, int64_t i)
{
    float p[V], g[V], m[V], v[V];
    load<V>(t.p + i, p);
    load<V>(t.g + i, g);
    load<V>(t.m + i, m);
    load<V>(t.v + i, v);
#pragma unroll
    for (int e = 0; e < V; e++)
        adamw_elem(k, p[e], g[e], m[e], v[e]);
    store<V>(t.p + i, p);
    store<V>(t.m + i, m);
    store<V>(t.v + i, v);
}

__global__ void __launch_bounds__(kThreads)
adamw_multi_kernel(const multi_tensor *tensors, const chunk *chunks, adamw_consts k)
{
    const chunk c = chunks[blockIdx.x];
    const multi_tensor t = tensors[c.tensor];
    k.decay = t.decay;
    const int64_t end = c.first + kChunk < t.n ? c.first + kChunk : t.n;
    int64_t rest = c.first;  // chunks start at multiples of kChunk: aligned as the tensor
    if (t.vec) {
        const int64_t quads = (end - c.first) / 4;
        for (int64_t q = threadIdx.x; q < quads; q += kThreads)
            update<4>(t, k, c.first + 4 * q);
        rest = c.first + 4 * quads;
    }
    for (int64_t i = rest + threadIdx.x; i < end; i += kThreads)
        update<1>(t, k, i);
}

int check_hyper(int64_t step, k3rt_error *err)
{
    if (step < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step: step must be >= 1, got %lld",
                         (long long)step);
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_adamw_step(k3rt_stream *s, int dtype, void *param, const void *grad, void *m,
                               void *v, int64_t n, double lr, double beta1, double beta2,
                               double eps, double weight_decay, int64_t step, k3rt_error *err)
{
    if (dtype != K3RT_F32)
        return cu_bad_dtype(err, "adamw_step", dtype, "f32: AdamW keeps f32 master weights, "
                            "gradients and moments");
    K3RT_TRY(check_hyper(step, err));
    if (n <= 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    adamw_op op = {fold(lr, beta1, beta2, eps, weight_decay, step)};
    ew_args<float, float, 4, 3> a = {{(const float *)param, (const float *)grad, (const float *)m,
                                      (const float *)v},
                                     {(float *)param, (float *)m, (float *)v}};
    return ew_launch(ctx, "adamw_step", op, a, n, err);
}

extern "C" int cuda_adamw_step_multi(k3rt_stream *s, int dtype, int64_t count,
                                     void *const *param, const void *const *grad,
                                     void *const *m, void *const *v, const int64_t *n,
                                     const double *weight_decay, double lr, double beta1,
                                     double beta2, double eps, int64_t step, k3rt_error *err)
{
    if (dtype != K3RT_F32)
        return cu_bad_dtype(err, "adamw_step_multi", dtype, "f32: AdamW keeps f32 master "
                            "weights, gradients and moments");
    K3RT_TRY(check_hyper(step, err));
    std::vector<multi_tensor> tensors;
    std::vector<chunk> chunks;
    try {
        for (int64_t i = 0; i < count; i++) {
            if (n[i] <= 0)
                continue;
            double wd = weight_decay ? weight_decay[i] : 0.0;
            bool vec = aligned_to(param[i], 16) && aligned_to(grad[i], 16) &&
                       aligned_to(m[i], 16) && aligned_to(v[i], 16);
            for (int64_t f = 0; f < n[i]; f += kChunk)
                chunks.push_back({(int64_t)tensors.size(), f});
            tensors.push_back({(float *)param[i], (const float *)grad[i], (float *)m[i],
                               (float *)v[i], n[i], (float)(1.0 - lr * wd), vec ? 1 : 0});
        }
    } catch (const std::bad_alloc &) {
        return k3rt_fail(err, K3RT_ERR_NOMEM, "adamw_step_multi: no memory for the chunk table");
    }
    if (chunks.empty())
        return K3RT_OK;
    if (chunks.size() > (size_t)INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: too many chunks");
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    size_t tb = (tensors.size() * sizeof(multi_tensor) + 255) & ~(size_t)255;
    size_t cb = chunks.size() * sizeof(chunk);
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, tb + cb, &scratch, err));
    cudaStream_t st = (cudaStream_t)ctx->stream;
    // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so the host
    // tables may go out of scope right after.
    CU_TRY(cudaMemcpyAsync(scratch, tensors.data(), tensors.size() * sizeof(multi_tensor),
                           cudaMemcpyHostToDevice, st),
           "cudaMemcpyAsync (AdamW tensor table)");
    CU_TRY(cudaMemcpyAsync((char *)scratch + tb, chunks.data(), cb, cudaMemcpyHostToDevice, st),
           "cudaMemcpyAsync (AdamW chunk table)");
    // The decay of fold() is replaced per tensor in the kernel.
    adamw_multi_kernel<<<(unsigned)chunks.size(), kThreads, 0, st>>>(
        (const multi_tensor *)scratch, (const chunk *)((char *)scratch + tb),
        fold(lr, beta1, beta2, eps, 0.0, step));
    CU_LAUNCHED("adamw_multi_kernel");
    return K3RT_OK;
}
