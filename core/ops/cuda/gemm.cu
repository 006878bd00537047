// Matrix products through cuBLASLt, in k3rt's row-major terms.
//
// A row-major C(m,n) is a column-major C^T(n,m), so C = op(A) op(B) is computed as the
// column-major product C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" our A, with
// the transpose flags unchanged. f32 runs CUBLAS_COMPUTE_32F (true fp32, no TF32); bf16 reads
// bf16, accumulates fp32 and writes bf16 or f32 (parameter gradients). The algorithm for each
// shape is chosen by cuBLASLt's heuristic once and cached, so repeats run the same kernel and
// give the same bits. When cuBLASLt has no algorithm (unusual alignments, or the bias epilogue)
// the classic cuBLAS GEMM, or a separate bias kernel, takes over.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <map>
#include <mutex>
#include <new>

#include "ops/cuda/internal.cuh"

namespace {

int lt_fail(k3rt_error *err, cublasStatus_t s, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "cuBLASLt %s failed: %s (%s)", what,
                     cublasGetStatusName(s), cublasGetStatusString(s));
}

#define LT_TRY(call, what)                           \
    do {                                             \
        cublasStatus_t s_ = (call);                  \
        if (s_ != CUBLAS_STATUS_SUCCESS)             \
            return lt_fail(err, s_, what);           \
    } while (0)

cudaDataType_t cuda_type(int dtype) { return dtype == K3RT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two (<= 256) dividing the address of every batch entry.
uint32_t alignment(const void *p, int64_t stride_elems, size_t es, int64_t batch)
{
    uintptr_t a = (uintptr_t)p | 256;
    if (batch > 1)
        a |= (uintptr_t)(stride_elems * (int64_t)es);
    return (uint32_t)(a & (~a + 1));
}

// ---- descriptors, destroyed on every path ---------------------------------------------------

struct lt_objects {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~lt_objects()
    {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        if (c)
            cublasLtMatrixLayoutDestroy(c);
        if (b)
            cublasLtMatrixLayoutDestroy(b);
        if (a)
            cublasLtMatrixLayoutDestroy(a);
        if (op)
            cublasLtMatmulDescDestroy(op);
    }
};

int make_layout(cublasLtMatrixLayout_t *out, int dtype, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t stride, k3rt_error *err)
{
    LT_TRY(cublasLtMatrixLayoutCreate(out, cuda_type(dtype), (uint64_t)rows, (uint64_t)cols, ld),
           "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof count),
               "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        LT_TRY(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof stride),
               "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
    return K3RT_OK;
}

// ---- algorithm cache --------------------------------------------------------------------------

typedef std::array<int64_t, 20> algo_key;
struct algo_entry {
    bool found;
    cublasLtMatmulAlgo_t algo;
};
std::mutex g_algo_mu;
std::map<algo_key, algo_entry> g_algos;

// ---- small kernels ----------------------------------------------------------------------------

// C = beta C_in over (batch, m, n) at row stride ldc (C_in may be C): the product of an empty
// inner dimension, or the copy of the addend before an in-place product.
template <typename T>
__global__ void scale_rows_kernel(T *c, const T *c_in, int64_t m, int64_t n, int64_t ldc,
                                  int64_t stride, int64_t batch, float beta)
{
    int64_t total = batch * m * n, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        int64_t col = i % n, row = (i / n) % m, b = i / (m * n);
        int64_t at = b * stride + row * ldc + col;
        c[at] = from_f<T>(beta == 0.0f ? 0.0f : beta * to_f(c_in[at]));
    }
}

// C(m,n) += bias(n) broadcast over rows.
template <typename T>
__global__ void add_bias_kernel(T *c, const T *bias, int64_t m, int64_t n, int64_t ldc)
{
    int64_t total = m * n, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        int64_t col = i % n, row = i / n;
        T *p = c + row * ldc + col;
        *p = from_f<T>(to_f(*p) + to_f(bias[col]));
    }
}

template <typename T>
int scale_and_bias(cuda_stream_ctx *ctx, const cu_matmul &mm, bool scale, bool bias,
                   float beta, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const int threads = 256;
    if (scale) {
        unsigned g = grid_for(mm.batch * mm.m * mm.n, threads, ctx->sms);
        const T *c_in = (const T *)(mm.c_in ? mm.c_in : mm.c);
        scale_rows_kernel<T><<<g, threads, 0, st>>>((T *)mm.c, c_in, mm.m, mm.n, mm.ldc,
                                                    mm.stride_c, mm.batch, beta);
        CU_LAUNCHED("scale_rows_kernel");
    }
    if (bias) {
        unsigned g = grid_for(mm.m * mm.n, threads, ctx->sms);
        add_bias_kernel<T><<<g, threads, 0, st>>>((T *)mm.c, (const T *)mm.bias, mm.m, mm.n,
                                                  mm.ldc);
        CU_LAUNCHED("add_bias_kernel");
    }
    return K3RT_OK;
}

// scale: C = beta C_in (beta 1 copies the addend); bias: C += bias.
int scale_and_bias_any(cuda_stream_ctx *ctx, const cu_matmul &mm, bool scale, bool bias,
                       float beta, k3rt_error *err)
{
    if (mm.c_type == K3RT_BF16)
        return scale_and_bias<bf16>(ctx, mm, scale, bias, beta, err);
    return scale_and_bias<float>(ctx, mm, scale, bias, beta, err);
}

// ---- the classic cuBLAS path ----------------------------------------------------------------

// The classic GEMM is in place only: an addend elsewhere is copied into C first.
int blas_fallback(cuda_stream_ctx *ctx, const cu_matmul &mm, k3rt_error *err)
{
    if (mm.c_in && mm.c_in != mm.c && mm.beta != 0.0)
        K3RT_TRY(scale_and_bias_any(ctx, mm, true, false, 1.0f, err));
    void *h = nullptr;
    K3RT_TRY(cuda_blas_acquire(ctx->device, &h, err));
    cublasHandle_t blas = (cublasHandle_t)h;
    float alpha = (float)mm.alpha, beta = (float)mm.beta;
    cublasStatus_t s = cublasSetStream(blas, (cudaStream_t)ctx->stream);
    const char *what = "cublasSetStream";
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasSetWorkspace(blas, ctx->blas_ws, ctx->blas_ws_bytes);
        what = "cublasSetWorkspace";
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        s = cublasGemmStridedBatchedEx_64(
            blas, mm.tb ? CUBLAS_OP_T : CUBLAS_OP_N, mm.ta ? CUBLAS_OP_T : CUBLAS_OP_N, mm.n, mm.m,
            mm.k, &alpha, mm.b, cuda_type(mm.ab_type), mm.ldb, mm.stride_b, mm.a,
            cuda_type(mm.ab_type), mm.lda, mm.stride_a, &beta, mm.c, cuda_type(mm.c_type), mm.ldc,
            mm.stride_c, mm.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        what = "cublasGemmStridedBatchedEx";
    }
    cuda_blas_release(ctx->device);
    if (s != CUBLAS_STATUS_SUCCESS)
        return k3rt_fail(err, K3RT_ERR_DEVICE, "cuBLAS %s failed: %s (%s)", what,
                         cublasGetStatusName(s), cublasGetStatusString(s));
    return K3RT_OK;
}

// The cached algorithm for `key`, or cuBLASLt's first choice for the descriptors in `o`.
int find_algo(cuda_stream_ctx *ctx, lt_objects &o, const algo_key &key, const uint32_t align[4],
              algo_entry *entry, k3rt_error *err)
{
    {
        std::lock_guard<std::mutex> lock(g_algo_mu);
        auto it = g_algos.find(key);
        if (it != g_algos.end()) {
            *entry = it->second;
            return K3RT_OK;
        }
    }
    if (!o.pref) {
        LT_TRY(cublasLtMatmulPreferenceCreate(&o.pref), "cublasLtMatmulPreferenceCreate");
        uint64_t ws = ctx->blas_ws_bytes;
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(
                   o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
               "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
        const cublasLtMatmulPreferenceAttributes_t attr[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            LT_TRY(cublasLtMatmulPreferenceSetAttribute(o.pref, attr[i], &align[i],
                                                        sizeof align[i]),
                   "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)");
    }
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    // Any refusal (NOT_SUPPORTED, or INVALID_VALUE for a layout cuBLASLt does not take) sends
    // the product to classic cuBLAS, which checks its arguments itself.
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)ctx->blaslt, o.op, o.a, o.b,
                                                      o.c, o.c, o.pref, 1, &res, &count);
    entry->found = s == CUBLAS_STATUS_SUCCESS && count > 0 && res.state == CUBLAS_STATUS_SUCCESS &&
                   res.workspaceSize <= ctx->blas_ws_bytes;
    if (entry->found)
        entry->algo = res.algo;
    try {
        std::lock_guard<std::mutex> lock(g_algo_mu);
        g_algos[key] = *entry;
    } catch (const std::bad_alloc &) {
        // not remembered: the heuristic runs again next time
    }
    return K3RT_OK;
}

}  // namespace

int cu_matmul_run(cuda_stream_ctx *ctx, const cu_matmul &mm, k3rt_error *err)
{
    if (mm.m <= 0 || mm.n <= 0 || mm.batch <= 0)
        return K3RT_OK;
    if (mm.batch > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "gemm: batch %lld exceeds 2^31 - 1",
                         (long long)mm.batch);
    if (mm.k <= 0)
        return scale_and_bias_any(ctx, mm, true, mm.bias != nullptr, (float)mm.beta, err);

    size_t es_ab = k3rt_dtype_size(mm.ab_type), es_c = k3rt_dtype_size(mm.c_type);
    uint32_t al_a = alignment(mm.b, mm.stride_b, es_ab, mm.batch);  // cuBLASLt's A is our B
    uint32_t al_b = alignment(mm.a, mm.stride_a, es_ab, mm.batch);
    const void *c_in = mm.c_in ? mm.c_in : mm.c;
    uint32_t al_c = alignment(mm.c, mm.stride_c, es_c, mm.batch);
    uint32_t al_cin = alignment(c_in, mm.stride_c, es_c, mm.batch);
    if (al_cin < al_c)
        al_c = al_cin;
    bool want_bias = mm.bias != nullptr && mm.batch == 1;
    uint32_t al_bias = want_bias ? alignment(mm.bias, 0, es_c, 1) : 256;
    bool epilogue_bias = want_bias && al_bias >= 16;  // else the bias kernel adds it

    lt_objects o;
    LT_TRY(cublasLtMatmulDescCreate(&o.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
    cublasOperation_t opa = mm.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = mm.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
    LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
    // Column-major shapes: A = our B as stored, B = our A as stored, C = C^T (n, m).
    K3RT_TRY(make_layout(&o.a, mm.ab_type, mm.tb ? mm.k : mm.n, mm.tb ? mm.n : mm.k, mm.ldb,
                         mm.batch, mm.stride_b, err));
    K3RT_TRY(make_layout(&o.b, mm.ab_type, mm.ta ? mm.m : mm.k, mm.ta ? mm.k : mm.m, mm.lda,
                         mm.batch, mm.stride_a, err));
    K3RT_TRY(make_layout(&o.c, mm.c_type, mm.n, mm.m, mm.ldc, mm.batch, mm.stride_c, err));

    algo_key key = {mm.ta, mm.tb, mm.m, mm.n, mm.k, mm.ab_type, mm.c_type, mm.lda, mm.ldb,
                    mm.ldc, mm.stride_a, mm.stride_b, mm.stride_c, mm.batch, al_a, al_b, al_c,
                    -1, ctx->device, (int64_t)ctx->blas_ws_bytes};
    const uint32_t align[4] = {al_a, al_b, al_c, al_c};
    algo_entry entry = {false, {}};
    bool use_bias = false;
    if (epilogue_bias) {
        // The bias epilogue saves a pass over C; without an algorithm for it, a kernel adds it.
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = cuda_type(mm.c_type);
        LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof epi),
               "cublasLtMatmulDescSetAttribute(EPILOGUE)");
        LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias,
                                              sizeof mm.bias),
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
        LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt),
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
        algo_key kb = key;
        kb[17] = al_bias;
        K3RT_TRY(find_algo(ctx, o, kb, align, &entry, err));
        use_bias = entry.found;
        if (!use_bias) {
            epi = CUBLASLT_EPILOGUE_DEFAULT;
            LT_TRY(cublasLtMatmulDescSetAttribute(o.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                  sizeof epi),
                   "cublasLtMatmulDescSetAttribute(EPILOGUE)");
        }
    }
    if (!use_bias)
        K3RT_TRY(find_algo(ctx, o, key, align, &entry, err));

    if (!entry.found) {
        K3RT_TRY(blas_fallback(ctx, mm, err));
        return want_bias ? scale_and_bias_any(ctx, mm, false, true, 0.0f, err) : K3RT_OK;
    }
    float alpha = (float)mm.alpha, beta = (float)mm.beta;
    LT_TRY(cublasLtMatmul((cublasLtHandle_t)ctx->blaslt, o.op, &alpha, mm.b, o.a, mm.a, o.b, &beta,
                          c_in, o.c, mm.c, o.c, &entry.algo, ctx->blas_ws, ctx->blas_ws_bytes,
                          (cudaStream_t)ctx->stream),
           "cublasLtMatmul");
    if (want_bias && !use_bias)
        return scale_and_bias_any(ctx, mm, false, true, 0.0f, err);
    return K3RT_OK;
}

// ---- public entry points ----------------------------------------------------------------------

static int check_ld(const char *op, const char *name, int64_t ld, int64_t row_len,
                    k3rt_error *err)
{
    if (ld < (row_len > 1 ? row_len : 1))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %s = %lld is smaller than the stored row "
                         "length %lld", op, name, (long long)ld, (long long)row_len);
    return K3RT_OK;
}

static int gemm_common(k3rt_stream *s, const char *op, int dtype, int ta, int tb, int64_t m,
                       int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                       int64_t sa, const void *b, int64_t ldb, int64_t sb, double beta,
                       const void *c_in, void *c, int64_t ldc, int64_t sc, int64_t batch,
                       k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: negative size (m %lld, n %lld, k %lld, "
                         "batch %lld)", op, (long long)m, (long long)n, (long long)k,
                         (long long)batch);
    if (m == 0 || n == 0 || batch == 0)
        return K3RT_OK;
    K3RT_TRY(check_ld(op, "lda", lda, ta ? m : k, err));
    K3RT_TRY(check_ld(op, "ldb", ldb, tb ? k : n, err));
    K3RT_TRY(check_ld(op, "ldc", ldc, n, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    cu_matmul mm = {ta, tb, m, n, k, dtype, dtype, a, lda, sa, b, ldb, sb, c, ldc, sc, batch,
                    alpha, beta, nullptr, c_in != c ? c_in : nullptr};
    return cu_matmul_run(ctx, mm, err);
}

extern "C" int cuda_gemm(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m,
                         int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                         const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
                         k3rt_error *err)
{
    return gemm_common(s, "gemm", dtype, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                       beta, c, c, ldc, 0, 1, err);
}

extern "C" int cuda_gemm_strided_batched(k3rt_stream *s, int dtype, int trans_a, int trans_b,
                                         int64_t m, int64_t n, int64_t k, double alpha,
                                         const void *a, int64_t lda, int64_t stride_a,
                                         const void *b, int64_t ldb, int64_t stride_b,
                                         double beta, const void *c, void *d, int64_t ldc,
                                         int64_t stride_c, int64_t batch, k3rt_error *err)
{
    return gemm_common(s, "gemm_strided_batched", dtype, trans_a, trans_b, m, n, k, alpha, a,
                       lda, stride_a, b, ldb, stride_b, beta, c, d, ldc, stride_c, batch, err);
}
