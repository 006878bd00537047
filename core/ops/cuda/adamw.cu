// AdamW on f32 master parameters, gradients and moments (k3rt_adamw_step's formula): the bias
// corrections and the step size are folded on the host in double, the element update runs in
// fp32, as the CPU reference and torch's AdamW do.
//   single tensor: the elementwise kernel (16-byte accesses when aligned)
//   many tensors:  one launch; block b updates chunk b of a host-built table of
//                  (tensor, first element) chunks of kChunk elements.
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

struct chunk {
    int64_t tensor, first;
};

__global__ void __launch_bounds__(kThreads)
adamw_multi_kernel(const cuda_adamw_tensor *tensors, const chunk *chunks, adamw_consts k)
{
    chunk c = chunks[blockIdx.x];
    cuda_adamw_tensor t = tensors[c.tensor];
    int64_t end = c.first + kChunk < t.n ? c.first + kChunk : t.n;
    for (int64_t i = c.first + threadIdx.x; i < end; i += kThreads) {
        float p = t.param[i], m = t.m[i], v = t.v[i];
        adamw_elem(k, p, t.grad[i], m, v);
        t.param[i] = p;
        t.m[i] = m;
        t.v[i] = v;
    }
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

extern "C" int cuda_adamw_step_multi(k3rt_stream *s, const cuda_adamw_tensor *tensors,
                                     int64_t count, double lr, double beta1, double beta2,
                                     double eps, double weight_decay, int64_t step,
                                     k3rt_error *err)
{
    K3RT_TRY(check_hyper(step, err));
    if (count <= 0)
        return K3RT_OK;
    std::vector<chunk> chunks;
    try {
        for (int64_t t = 0; t < count; t++) {
            if (tensors[t].n < 0)
                return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: tensor %lld has "
                                 "negative length %lld", (long long)t, (long long)tensors[t].n);
            for (int64_t f = 0; f < tensors[t].n; f += kChunk)
                chunks.push_back({t, f});
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
    size_t tb = ((size_t)count * sizeof(cuda_adamw_tensor) + 255) & ~(size_t)255;
    size_t cb = chunks.size() * sizeof(chunk);
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, tb + cb, &scratch, err));
    cudaStream_t st = (cudaStream_t)ctx->stream;
    // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so the host
    // tables may go out of scope right after.
    CU_TRY(cudaMemcpyAsync(scratch, tensors, (size_t)count * sizeof(cuda_adamw_tensor),
                           cudaMemcpyHostToDevice, st),
           "cudaMemcpyAsync (AdamW tensor table)");
    CU_TRY(cudaMemcpyAsync((char *)scratch + tb, chunks.data(), cb, cudaMemcpyHostToDevice, st),
           "cudaMemcpyAsync (AdamW chunk table)");
    adamw_multi_kernel<<<(unsigned)chunks.size(), kThreads, 0, st>>>(
        (const cuda_adamw_tensor *)scratch, (const chunk *)((char *)scratch + tb),
        fold(lr, beta1, beta2, eps, weight_decay, step));
    CU_LAUNCHED("adamw_multi_kernel");
    return K3RT_OK;
}
