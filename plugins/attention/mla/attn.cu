// The attention core's entry points (mla_cuda.h): argument checks, the choice between cuDNN's
// fused attention (attn_cudnn.c), k3rt's tensor-core kernels (attn_tc.cu) and its fp32 ones
// (attn_simple.cu), the backward's row dots and the per-head reduction of the forward's maxima.
// Each of k3rt's kernels exists for a capability cuDNN's lacks, said in its header: max logits
// and other lengths (attn_tc.cu), a deterministic backward (attn_tc_bwd.cu), f32 and other head
// widths (attn_simple.cu); and all of them mask packed documents (cudnn_wanted says why cuDNN
// does not).
#include "cuda_common.cuh"
#ifdef K3RT_MLA_HAVE_CUDNN
#include "attn_cudnn.h"
#endif

int mla_cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "mla: CUDA %s failed: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

int mla_smem_limit(int *bytes, k3rt_error *err)
{
    int dev;
    MLA_CU_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    MLA_CU_TRY(cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute");
    return K3RT_OK;
}

namespace {

int check(const mla_attn *a, int backward, k3rt_error *err)
{
    if (a->dtype != K3RT_F32 && a->dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention: dtype %s is not supported on "
                         "CUDA (f32 or bf16)", k3rt_dtype_name(a->dtype));
    if (a->B < 1 || a->T < 1 || a->H < 1 || a->dqk < 1 || a->dv < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention: sizes must be >= 1 (B %lld, T "
                         "%lld, H %lld, dqk %lld, dv %lld)", (long long)a->B, (long long)a->T,
                         (long long)a->H, (long long)a->dqk, (long long)a->dv);
    if (a->T > (int64_t)MLA_CUDA_MAX_ROWS * 65535 || a->B * a->H > 0x7fffffff)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention: T = %lld or B*H = %lld is past "
                         "the launch grid's limits (T <= %d, B*H < 2^31)", (long long)a->T,
                         (long long)(a->B * a->H), MLA_CUDA_MAX_ROWS * 65535);
    if (!a->q || !a->k || !a->v || !a->o || !a->lse)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention: q, k, v, o and lse are needed");
    if (backward && (!a->dout || !a->dq || !a->dk || !a->dv_out || !a->drow))
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention backward: dout, dq, dk, dv and "
                         "the drow scratch are needed");
    if (a->docs && (a->n_docs < a->B || a->n_docs > a->B * a->T || a->B * a->T > 0x7fffffff))
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention: packed documents need B <= "
                         "n_docs <= B*T < 2^31 (every row starts one; i32 offsets), got n_docs "
                         "%lld for B %lld, T %lld", (long long)a->n_docs, (long long)a->B,
                         (long long)a->T);
    if (backward && !a->deterministic && mla_tc_supported(a) &&
        (!a->dq_acc || ((uintptr_t)a->dq_acc & 15)))
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention backward: the non-deterministic "
                         "tensor-core backward needs dq_acc, 16-byte aligned f32 scratch of "
                         "B*T*H*dqk = %lld elements (or deterministic = 1)",
                         (long long)(a->B * a->T * a->H * a->dqk));
    return K3RT_OK;
}

// One warp per row: drow = dout . o over dv, in fp32. Rows are tokens x heads as stored.
template <typename T>
__global__ void row_dots_kernel(const T *dout, const T *o, float *drow, int64_t rows, int64_t T_,
                                int64_t H, int64_t dv)
{
    int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= rows)
        return;  // the whole warp leaves together
    const T *x = dout + row * dv, *y = o + row * dv;
    float s = 0.0f;
    for (int64_t c = lane; c < dv; c += 32)
        s += to_f(x[c]) * to_f(y[c]);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, m);
    if (lane == 0) {
        int64_t n = row / H, h = row % H, b = n / T_, t = n % T_;
        drow[(b * H + h) * T_ + t] = s;
    }
}

// One block per head: the max over b and the entries of every (b, h) row of bmax.
__global__ void head_max_kernel(const float *bmax, int64_t B, int64_t H, int64_t blocks,
                                float *head_max, int combine)
{
    __shared__ float part[32];
    int64_t h = blockIdx.x;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < B * blocks; i += blockDim.x)
        m = nan_max(m, bmax[((i / blocks) * H + h) * blocks + i % blocks]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            m = nan_max(m, part[w]);
        head_max[h] = combine ? nan_max(head_max[h], m) : m;
    }
}

}  // namespace

int mla_row_dots(cudaStream_t st, const mla_attn *a, k3rt_error *err)
{
    int64_t rows = a->B * a->T * a->H;
    unsigned grid = (unsigned)((rows + 7) / 8);
    if (a->dtype == K3RT_BF16)
        row_dots_kernel<bf16><<<grid, 256, 0, st>>>((const bf16 *)a->dout, (const bf16 *)a->o,
                                                    a->drow, rows, a->T, a->H, a->dv);
    else
        row_dots_kernel<float><<<grid, 256, 0, st>>>((const float *)a->dout,
                                                     (const float *)a->o, a->drow, rows, a->T,
                                                     a->H, a->dv);
    MLA_LAUNCHED("row_dots_kernel");
    return K3RT_OK;
}

extern "C" int mla_cuda_enter(int device, k3rt_error *err)
{
    MLA_CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    return K3RT_OK;
}

namespace {

// Packed documents run on k3rt's kernels, which take a query's document start as the lower
// bound of its keys (cuda_common.cuh's doc_span), read from the offsets on the device: whole
// key tiles before it are skipped, so the work follows the documents' own causal triangles,
// and the boundary tile is masked. The cuDNN alternative, each document its own sequence of a
// ragged (THD) batch under a padding mask, would need the number of documents and the longest
// one on the host to build and key its plans: a device-to-host copy of offsets that change
// every batch, and a synchronisation, on every call.

// Whether cuDNN runs a (*use), by a->kernel: k3rt's never, cuDNN's always (an error when it
// cannot), auto when it takes the shape. A deterministic backward never: cuDNN sums dQ with
// atomics. Packed documents never (above).
int cudnn_wanted(const mla_attn *a, int backward, int *use, k3rt_error *err)
{
    *use = 0;
    if (a->kernel == MLA_KERNEL_K3RT)
        return K3RT_OK;
    int forced = a->kernel == MLA_KERNEL_CUDNN;
    if (backward && a->deterministic)
        return K3RT_OK;
#ifdef K3RT_MLA_HAVE_CUDNN
    int dev, major = 0;
    MLA_CU_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    MLA_CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
               "cudaDeviceGetAttribute");
    const char *why = NULL;
    if (a->docs)
        why = "cuDNN's fused attention here has no document mask: packed sequences "
              "(doc_offsets) run k3rt's kernels (the plugin's cuda_kernel \"auto\" or "
              "\"k3rt\")";
    else if (!backward && a->block_max)
        why = "its forward does not report the max logits (block_max; the plugin's "
              "report_max_logit)";
    else if (backward && (!a->dq_acc || ((uintptr_t)a->dq_acc & 15)))
        why = "the backward has no 16-byte aligned dq_acc scratch";
    else if (!mla_cudnn_shape_ok(a, major, &why))
        ;
    k3rt_error load = {0, {0}};
    if (!why && mla_cudnn_load(&load) != K3RT_OK)
        why = load.msg;
    if (why && forced)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "mla attention: kernel \"cudnn\" cannot "
                         "run B %lld, T %lld, H %lld, dqk %lld, dv %lld, %s: %s", (long long)a->B,
                         (long long)a->T, (long long)a->H, (long long)a->dqk,
                         (long long)a->dv, k3rt_dtype_name(a->dtype), why);
    *use = why == NULL;
    return K3RT_OK;
#else
    if (forced)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "mla attention: kernel \"cudnn\" asked "
                         "for, but this build has no cuDNN (its headers were not found when "
                         "the plugin was built)");
    return K3RT_OK;
#endif
}

// Runs cuDNN's direction of a when the choice (cudnn_wanted) falls on it; *ran = 0 when it
// does not, or when auto mode falls back to k3rt's kernels because the library is missing or
// has no engine for the shape.
int cudnn_first(cudaStream_t st, const mla_attn *a, int backward, int *ran, k3rt_error *err)
{
    int use = 0;
    *ran = 0;
    K3RT_TRY(cudnn_wanted(a, backward, &use, err));
    if (!use)
        return K3RT_OK;
#ifdef K3RT_MLA_HAVE_CUDNN
    k3rt_error e = {0, {0}};
    int rc = backward ? mla_cudnn_bwd(st, a, &e) : mla_cudnn_fwd(st, a, &e);
    *ran = rc == K3RT_OK;
    if (rc == K3RT_OK || (rc == K3RT_ERR_UNSUPPORTED && a->kernel == MLA_KERNEL_AUTO))
        return K3RT_OK;
    return k3rt_fail(err, rc, "%s", e.msg);
#else
    (void)st;
    return K3RT_OK;
#endif
}

}  // namespace

extern "C" const char *mla_attn_path(const mla_attn *a, int backward)
{
    int use = 0;
    k3rt_error e;
    if (cudnn_wanted(a, backward, &use, &e) == K3RT_OK && use)
        return "cudnn";
    return mla_tc_supported(a) ? "tensor-core" : "fp32";
}

extern "C" int mla_attn_fwd_cuda(void *stream, const mla_attn *a, k3rt_error *err)
{
    K3RT_TRY(check(a, 0, err));
    cudaStream_t st = (cudaStream_t)stream;
    int ran;
    K3RT_TRY(cudnn_first(st, a, 0, &ran, err));
    if (ran)
        return K3RT_OK;
    return mla_tc_supported(a) ? mla_tc_fwd(st, a, err) : mla_simple_fwd(st, a, err);
}

extern "C" int mla_attn_bwd_cuda(void *stream, const mla_attn *a, k3rt_error *err)
{
    K3RT_TRY(check(a, 1, err));
    cudaStream_t st = (cudaStream_t)stream;
    int ran;
    K3RT_TRY(cudnn_first(st, a, 1, &ran, err));
    if (ran)
        return K3RT_OK;
    K3RT_TRY(mla_row_dots(st, a, err));
    return mla_tc_supported(a) ? mla_tc_bwd(st, a, err) : mla_simple_bwd(st, a, err);
}

extern "C" int mla_head_max_cuda(void *stream, const float *block_max, int64_t B, int64_t H,
                                 int64_t T, float *head_max, int combine, k3rt_error *err)
{
    if (!block_max || !head_max || B < 1 || H < 1 || T < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla head max: bad arguments");
    int64_t blocks = (T + MLA_CUDA_MAX_ROWS - 1) / MLA_CUDA_MAX_ROWS;
    head_max_kernel<<<(unsigned)H, 256, 0, (cudaStream_t)stream>>>(block_max, B, H, blocks,
                                                                   head_max, combine);
    MLA_LAUNCHED("head_max_kernel");
    return K3RT_OK;
}
