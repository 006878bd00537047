// KDA on CUDA: the entry points of kda_cuda.h. Argument checks, the workspace layout, the chunk
// map of packed sequences, the order of the kernels (chunk.cu, state.cu) and the GVA sum of the
// q/k gradients over the value heads of each qk head.
#include <math.h>

#include "common.cuh"

namespace kdacu {

int cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "kda cuda: %s failed: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

namespace {

constexpr size_t ALIGN = 256;

size_t up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

// Byte offsets into the workspace and the saved buffer.
struct Layout {
    size_t map, cidx, Ut, fwd;                                      // forward workspace
    size_t dSt, dDt, dAs, dLk, part, dGl, dd, dqv, dkv, bwd;        // backward workspace
    size_t St, Dt, Qg, Kb, W, A, Tm, Lk, gam, saved;                // saved
};

int64_t n_chunks(const kda_cuda_args *a)
{
    int64_t N = a->B * a->T;
    return a->cu_seqlens || a->n_docs > 0 ? N / C + a->n_docs : a->B * ((a->T + C - 1) / C);
}

// The forward keeps everything the chunk kernels of the backward read (the prep's outputs
// too: recomputing them cost the backward 1.53 ms at B8 T4096 H16 D128 on the H200, keeping
// them costs the forward 0.1 ms of stores and 72 KB per chunk and head of memory).
Layout layout(const kda_cuda_args *a)
{
    Layout L;
    const size_t es = a->dtype == K3RT_BF16 ? 2 : 4, NC = (size_t)n_chunks(a),
                 HV = (size_t)a->HV, D = (size_t)a->D, N = (size_t)(a->B * a->T), ch = NC * HV;
    size_t off = 0;
    auto take = [&](size_t bytes) {
        size_t o = off;
        off += up(bytes);
        return o;
    };
    const bool packed = a->cu_seqlens || a->n_docs > 0;
    L.map = packed ? take(NC * sizeof(int4)) : 0;
    L.cidx = packed ? take(((size_t)a->n_docs + 1) * 4) : 0;
    const size_t head = off;
    L.Ut = take(ch * D * C * es);
    L.fwd = off;
    off = head;
    L.dSt = take(ch * D * D * es);
    L.dDt = take(ch * D * C * es);
    L.dAs = take(ch * C * C * es);
    L.dLk = take(ch * C * C * es);
    L.part = take(ch * 3 * C * D * 4);
    L.dGl = take(ch * D * 4);
    L.dd = take(ch * C * 4);
    const bool gva = a->HV != a->H;
    L.dqv = gva ? take(N * HV * D * 4) : 0;
    L.dkv = gva ? take(N * HV * D * 4) : 0;
    L.bwd = off > L.fwd ? off : L.fwd;
    off = 0;
    L.St = take(ch * D * D * es);
    L.Dt = take(ch * D * C * es);
    L.Qg = take(ch * C * D * es);
    L.Kb = take(ch * C * D * es);
    L.W = take(ch * C * D * es);
    L.A = take(ch * C * C * es);
    L.Tm = take(ch * C * C * es);
    L.Lk = take(ch * C * C * es);
    L.gam = take(ch * D * 4);
    L.saved = off;
    return L;
}

bool misaligned(const void *p) { return ((uintptr_t)p & 15) != 0; }

int check_sizes(const kda_cuda_args *a, k3rt_error *err)
{
    if (a->dtype != K3RT_F32 && a->dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: dtype %s is not supported (f32 or "
                         "bf16)", k3rt_dtype_name(a->dtype));
    if (a->D != 32 && a->D != 64 && a->D != 128)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "kda cuda: head width %lld is not supported "
                         "(dk = dv = 32, 64 or 128)", (long long)a->D);
    if (a->B < 1 || a->T < 1 || a->H < 1 || a->HV < a->H || a->HV % a->H)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: bad shape B=%lld T=%lld H=%lld HV=%lld "
                         "(all >= 1, HV a multiple of H)", (long long)a->B, (long long)a->T,
                         (long long)a->H, (long long)a->HV);
    if (a->B * a->T >= ((int64_t)1 << 31) || a->HV > 65535)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: B*T = %lld tokens or HV = %lld is past "
                         "the kernels' limits (< 2^31, <= 65535)", (long long)(a->B * a->T),
                         (long long)a->HV);
    if (a->cu_seqlens && (a->B != 1 || a->n_docs < 1))
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: with cu_seqlens B must be 1 (is %lld) "
                         "and n_docs >= 1 (is %lld)", (long long)a->B, (long long)a->n_docs);
    if (a->row_len < 0 || (a->row_len > 0 && (a->B * a->T) % a->row_len))
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: row_len %lld must be 0 or divide the "
                         "%lld tokens", (long long)a->row_len, (long long)(a->B * a->T));
    return K3RT_OK;
}

int check_ptrs(const kda_cuda_args *a, int backward, k3rt_error *err)
{
    if (!a->q || !a->k || !a->v || !a->g || !a->beta || !a->saved || !a->workspace)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: q, k, v, g, beta, saved and workspace "
                         "are needed");
    if (!backward && !a->o)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda forward: o is needed");
    if (backward && (!a->d_o || !a->d_q || !a->d_k || !a->d_v || !a->d_g || !a->d_beta))
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda backward: d_o, d_q, d_k, d_v, d_g and "
                         "d_beta are needed");
    const void *p[] = {a->q, a->k, a->v, a->g, a->o, a->saved, a->workspace, a->d_o, a->d_q,
                       a->d_k, a->d_v, a->d_g};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i] && misaligned(p[i]))
            return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda: q, k, v, g, o, d_o, the "
                             "gradients, saved and workspace must be 16-byte aligned");
    return K3RT_OK;
}

// First chunk of each document (one thread: documents are few).
__global__ void cidx_kernel(const int32_t *cu, int64_t n_docs, int32_t *cidx)
{
    if (threadIdx.x != 0 || blockIdx.x != 0)
        return;
    int32_t acc = 0;
    for (int64_t d = 0; d < n_docs; d++) {
        cidx[d] = acc;
        acc += (cu[d + 1] - cu[d] + C - 1) / C;
    }
    cidx[n_docs] = acc;
}

// (doc, first token, rows) of chunk c; doc -1 past the last chunk.
__global__ void map_kernel(const int32_t *cu, const int32_t *cidx, int64_t n_docs, int64_t NC,
                           int4 *map)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= NC)
        return;
    if (c >= cidx[n_docs]) {
        map[c] = make_int4(-1, 0, 0, 0);
        return;
    }
    int64_t lo = 0, hi = n_docs - 1;  // the last d with cidx[d] <= c
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (cidx[mid] <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    int32_t t0 = cu[lo] + (int32_t)(c - cidx[lo]) * C;
    map[c] = make_int4((int)lo, t0, min(C, cu[lo + 1] - t0), 0);
}

template <typename E>
__global__ void gva_sum_kernel(const float *src, E *dst, int64_t rows, int64_t rep, int64_t D)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // (t*H + h)*D + j
    if (i >= rows * D)
        return;
    int64_t row = i / D, j = i % D;
    float s = 0.0f;
    for (int64_t r = 0; r < rep; r++)
        s += src[(row * rep + r) * D + j];
    dst[i] = from_f<E>(s);
}

struct Call {
    Dims d;
    Bufs b;
    Layout L;
};

int setup(cudaStream_t st, const kda_cuda_args *a, Call &c, bool bwd, k3rt_error *err)
{
    c.L = layout(a);
    Dims &d = c.d;
    d.B = a->B, d.T = a->T, d.H = a->H, d.HV = a->HV, d.D = a->D, d.N = a->B * a->T;
    d.NC = n_chunks(a);
    d.n_seq = a->cu_seqlens ? a->n_docs : a->B;
    d.scale = (float)(a->scale != 0 ? a->scale : 1.0 / sqrt((double)a->D));
    unsigned char *ws = (unsigned char *)a->workspace, *sv = (unsigned char *)a->saved;
    d.seqs.cu = a->cu_seqlens;
    d.seqs.cidx = a->cu_seqlens ? (const int32_t *)(ws + c.L.cidx) : nullptr;
    d.seqs.map = a->cu_seqlens ? (const int4 *)(ws + c.L.map) : nullptr;
    d.seqs.T = a->T, d.seqs.NT = (a->T + C - 1) / C;
    d.seqs.row_len = a->cu_seqlens ? a->row_len : 0;
    Bufs &b = c.b;
    b.Ut = ws + c.L.Ut;
    b.St = sv + c.L.St, b.Dt = sv + c.L.Dt;
    b.Qg = sv + c.L.Qg, b.Kb = sv + c.L.Kb, b.W = sv + c.L.W, b.A = sv + c.L.A;
    b.Tm = sv + c.L.Tm, b.Lk = sv + c.L.Lk, b.gam = (float *)(sv + c.L.gam);
    b.dSt = b.dDt = b.dAs = b.dLk = nullptr;
    b.part = b.dGl = b.dd = b.dqv = b.dkv = nullptr;
    if (bwd) {
        b.dSt = ws + c.L.dSt, b.dDt = ws + c.L.dDt;
        b.dAs = ws + c.L.dAs, b.dLk = ws + c.L.dLk;
        b.part = (float *)(ws + c.L.part), b.dGl = (float *)(ws + c.L.dGl);
        b.dd = (float *)(ws + c.L.dd);
        if (a->HV != a->H)
            b.dqv = (float *)(ws + c.L.dqv), b.dkv = (float *)(ws + c.L.dkv);
    }
    if (a->cu_seqlens) {
        cidx_kernel<<<1, 32, 0, st>>>(a->cu_seqlens, a->n_docs, (int32_t *)d.seqs.cidx);
        KDA_LAUNCHED("kda cidx_kernel");
        map_kernel<<<(unsigned)((d.NC + 255) / 256), 256, 0, st>>>(
            a->cu_seqlens, d.seqs.cidx, a->n_docs, d.NC, (int4 *)d.seqs.map);
        KDA_LAUNCHED("kda map_kernel");
    }
    return K3RT_OK;
}

}  // namespace
}  // namespace kdacu

using namespace kdacu;

extern "C" int kda_cuda_saved_bytes(const kda_cuda_args *a, size_t *bytes, k3rt_error *err)
{
    K3RT_TRY(check_sizes(a, err));
    *bytes = layout(a).saved;
    return K3RT_OK;
}

extern "C" int kda_cuda_workspace_bytes(const kda_cuda_args *a, int backward, size_t *bytes,
                                        k3rt_error *err)
{
    K3RT_TRY(check_sizes(a, err));
    Layout L = layout(a);
    *bytes = backward ? L.bwd : L.fwd;
    return K3RT_OK;
}

extern "C" int kda_cuda_fwd(void *stream, const kda_cuda_args *a, k3rt_error *err)
{
    K3RT_TRY(check_sizes(a, err));
    K3RT_TRY(check_ptrs(a, 0, err));
    cudaStream_t st = (cudaStream_t)stream;
    Call c;
    K3RT_TRY(setup(st, a, c, false, err));
    K3RT_TRY(launch_prep(st, a->dtype, c.d, a, c.b, true, err));
    return launch_state_fwd(st, a->dtype, c.d, a, c.b, err);
}

extern "C" int kda_cuda_bwd(void *stream, const kda_cuda_args *a, k3rt_error *err)
{
    K3RT_TRY(check_sizes(a, err));
    K3RT_TRY(check_ptrs(a, 1, err));
    cudaStream_t st = (cudaStream_t)stream;
    Call c;
    K3RT_TRY(setup(st, a, c, true, err));  // the prep's outputs are the forward's, in saved
    K3RT_TRY(launch_state_bwd(st, a->dtype, c.d, a, c.b, err));
    K3RT_TRY(launch_bwd_chunks(st, a->dtype, c.d, a, c.b, err));
    if (a->HV != a->H) {
        int64_t rows = c.d.N * a->H, n = rows * a->D, rep = a->HV / a->H;
        unsigned grid = (unsigned)((n + 255) / 256);
        if (a->dtype == K3RT_BF16) {
            gva_sum_kernel<bf16><<<grid, 256, 0, st>>>(c.b.dqv, (bf16 *)a->d_q, rows, rep, a->D);
            gva_sum_kernel<bf16><<<grid, 256, 0, st>>>(c.b.dkv, (bf16 *)a->d_k, rows, rep, a->D);
        } else {
            gva_sum_kernel<float><<<grid, 256, 0, st>>>(c.b.dqv, (float *)a->d_q, rows, rep, a->D);
            gva_sum_kernel<float><<<grid, 256, 0, st>>>(c.b.dkv, (float *)a->d_k, rows, rep, a->D);
        }
        KDA_LAUNCHED("kda gva_sum_kernel");
    }
    return K3RT_OK;
}

extern "C" int kda_cuda_summary(void *stream, const kda_cuda_args *a, float *m, float *bm,
                                k3rt_error *err)
{
    K3RT_TRY(check_sizes(a, err));
    if (!a->q || !a->k || !a->v || !a->g || !a->beta || !a->saved || !a->workspace || !m || !bm)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda summary: q, k, v, g, beta, saved, "
                         "workspace, m and bm are needed");
    const void *p[] = {a->q, a->k, a->v, a->g, a->saved, a->workspace};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (misaligned(p[i]))
            return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda summary: q, k, v, g, saved and "
                             "workspace must be 16-byte aligned");
    cudaStream_t st = (cudaStream_t)stream;
    Call c;
    K3RT_TRY(setup(st, a, c, false, err));
    K3RT_TRY(launch_prep(st, a->dtype, c.d, a, c.b, false, err));
    return launch_summary(st, a->dtype, c.d, c.b, m, bm, err);
}
