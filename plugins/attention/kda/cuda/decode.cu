// The two kernels of KDA's decode step that the layer's kernels (layer.cu) do not cover
// (kda_layer_cuda.h): appending a token to the short conv's cached inputs, and one token of
// the recurrence on the fp32 state.
//
// Tiling. The recurrence gives a block to a (sequence, value head) and a thread to 32 rows of
// one column c of the state S [dk = D, dv = D], held in registers for the whole step: S is read
// once and written once (the decay, the prediction error e_c = sum_j k_j S_jc, the write and
// the read o_c = sum_j q_j S_jc all run down the thread's rows; the D / 32 row groups of a
// column add their partial e and o in shared memory). 32 rows a thread, not a whole column:
// a column of 128 in registers took 255 registers and spilled (ptxas -v). The step is bound
// by the state's memory traffic, 2 D^2 fp32 per head against 6 D^2 FLOPs; decay, k and q come
// from shared memory. D (32, 64, 128: what the CUDA path takes) is a template parameter.
#include "common.cuh"
#include "kda_layer_cuda.h"

using kdacu::bf16;
using kdacu::from_f;
using kdacu::to_f;

namespace kdadec {
namespace {

// hist [B, W-1, C] (oldest row first) drops its oldest row and appends p [B, C]; a thread owns
// one (b, c), so the shift in place needs no synchronisation.
template <typename E>
__global__ void push_kernel(int64_t B, int64_t W, int64_t C, E *hist, const E *p)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * C)
        return;
    int64_t b = i / C, c = i % C;
    E *h = hist + b * (W - 1) * C + c;
    for (int64_t j = 0; j + 2 < W; j++)
        h[j * C] = h[(j + 1) * C];
    h[(W - 2) * C] = p[i];
}

// One token per (b, value head j = blockIdx.x % HV): S <- Diag(e^g) S; e = v - S^T k;
// S <- S + beta k e^T; o = scale S^T q (spec §3.1). q, k of qk head j / (HV / H). Thread (g, c)
// holds rows 32 g .. 32 g + 31 of column c; the R = D / 32 row groups' partial sums of e and o
// meet in shared memory and are added in group order (the same bits on every run).
template <typename E, int D>
__global__ void __launch_bounds__(D *(D / 32))
    step_kernel(int64_t H, int64_t HV, float scale, float *S, const E *q, const E *k,
                const E *v, const E *g, const E *beta, E *o)
{
    constexpr int R = D / 32;
    __shared__ float sa[D], sk[D], sq[D], part[R][D];
    const int64_t item = blockIdx.x, b = item / HV, hv = item % HV;
    const int64_t qk = b * H + hv / (HV / H);
    const int c = threadIdx.x % D, grp = threadIdx.x / D;
    if (grp == 0) {
        sa[c] = expf(to_f(g[item * D + c]));
        sk[c] = to_f(k[qk * D + c]);
        sq[c] = to_f(q[qk * D + c]);
    }
    __syncthreads();
    float *Sc = S + item * D * D + (int64_t)grp * 32 * D + c;
    const float *ka = sk + grp * 32, *aa = sa + grp * 32, *qa = sq + grp * 32;
    float col[32], e = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        col[i] = Sc[i * D] * aa[i];
        e += ka[i] * col[i];
    }
    part[grp][c] = e;
    __syncthreads();
    e = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++)
        e += part[r][c];
    const float u = to_f(beta[item]) * (to_f(v[item * D + c]) - e);
    __syncthreads();  // every group has read part before it is reused
    float out = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        col[i] += ka[i] * u;
        out += qa[i] * col[i];
        Sc[i * D] = col[i];
    }
    part[grp][c] = out;
    __syncthreads();
    if (grp == 0) {
        out = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++)
            out += part[r][c];
        o[item * D + c] = from_f<E>(scale * out);
    }
}

int check(int dtype, const char *what, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda %s: dtype %s (f32 or bf16)", what,
                         k3rt_dtype_name(dtype));
    return K3RT_OK;
}

template <typename E>
void launch_step(cudaStream_t st, int64_t B, int64_t H, int64_t HV, int64_t D, float *S,
                 const void *q, const void *k, const void *v, const void *g, const void *beta,
                 void *o)
{
    const unsigned grid = (unsigned)(B * HV);
    const float scale = 1.0f / sqrtf((float)D);
    const E *qe = (const E *)q, *ke = (const E *)k, *ve = (const E *)v, *ge = (const E *)g;
    const E *be = (const E *)beta;
    if (D == 32)
        step_kernel<E, 32><<<grid, 32, 0, st>>>(H, HV, scale, S, qe, ke, ve, ge, be, (E *)o);
    else if (D == 64)
        step_kernel<E, 64><<<grid, 128, 0, st>>>(H, HV, scale, S, qe, ke, ve, ge, be, (E *)o);
    else
        step_kernel<E, 128><<<grid, 512, 0, st>>>(H, HV, scale, S, qe, ke, ve, ge, be, (E *)o);
}

}  // namespace
}  // namespace kdadec

using namespace kdadec;

extern "C" int kda_cu_decode_push(void *stream, int dtype, int64_t B, int64_t W, int64_t C,
                                  void *hist, const void *p, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "conv cache", err));
    if (W < 2 || B * C == 0)
        return K3RT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    const unsigned grid = (unsigned)((B * C + 255) / 256);
    if (dtype == K3RT_BF16)
        push_kernel<bf16><<<grid, 256, 0, st>>>(B, W, C, (bf16 *)hist, (const bf16 *)p);
    else
        push_kernel<float><<<grid, 256, 0, st>>>(B, W, C, (float *)hist, (const float *)p);
    KDA_LAUNCHED("kda push_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_decode_step(void *stream, int dtype, int64_t B, int64_t H, int64_t HV,
                                  int64_t D, float *S, const void *q, const void *k,
                                  const void *v, const void *g, const void *beta, void *o,
                                  k3rt_error *err)
{
    K3RT_TRY(check(dtype, "decode step", err));
    if (D != 32 && D != 64 && D != 128)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "kda cuda decode step: head width %lld "
                         "(32, 64 or 128)", (long long)D);
    if (B < 1 || H < 1 || HV % H)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda decode step: B = %lld, H = %lld, "
                         "HV = %lld", (long long)B, (long long)H, (long long)HV);
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        launch_step<bf16>(st, B, H, HV, D, S, q, k, v, g, beta, o);
    else
        launch_step<float>(st, B, H, HV, D, S, q, k, v, g, beta, o);
    KDA_LAUNCHED("kda step_kernel");
    return K3RT_OK;
}
