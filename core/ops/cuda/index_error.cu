// The out-of-range index record: embedding and cross-entropy kernels read tokens and targets
// on the device, so a bad one is recorded there (first offender wins) and reported later by
// cuda_ops_take_index_error, where the trainer synchronises anyway.
#include <mutex>

#include "ops/cuda/internal.cuh"

namespace {
constexpr int kMaxDevices = 64;
std::mutex g_rec_mu;
cu_index_record *g_rec[kMaxDevices];
}  // namespace

int cu_index_record_get(int device, cu_index_record **rec, k3rt_error *err)
{
    if (device < 0 || device >= kMaxDevices)
        return k3rt_fail(err, K3RT_ERR_INVALID, "CUDA device %d is outside [0, %d)", device,
                         kMaxDevices);
    std::lock_guard<std::mutex> lock(g_rec_mu);
    if (!g_rec[device]) {
        void *p = cuda_alloc(device, sizeof(cu_index_record), err);
        if (!p)
            return k3rt_error_prefix(err, "index error record: ");
        // Synchronous on purpose: the record must be clear before any kernel can see it.
        cudaError_t e = cudaMemset(p, 0, sizeof(cu_index_record));
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            cuda_free(device, p);
            return cu_fail(err, e, "cudaMemset (index error record)");
        }
        g_rec[device] = (cu_index_record *)p;
    }
    *rec = g_rec[device];
    return K3RT_OK;
}

int cu_enter_indexed(k3rt_stream *s, cuda_stream_ctx **c, cu_index_record **rec,
                     k3rt_error *err)
{
    K3RT_TRY(cu_enter(s, c, err));
    return cu_index_record_get((*c)->device, rec, err);
}

static const char *index_op_name(int op)
{
    switch (op) {
    case CU_IDX_EMBEDDING_FWD: return "embedding_fwd: token";
    case CU_IDX_EMBEDDING_BWD: return "embedding_bwd: token";
    case CU_IDX_XENT_FWD: return "xent_fwd: target";
    case CU_IDX_XENT_BWD: return "xent_bwd: target";
    default: return "index";
    }
}

static const char *index_op_effect(int op)
{
    return op == CU_IDX_EMBEDDING_BWD ? "its gradient row was dropped"
                                      : "its output row was set to NaN";
}

extern "C" int cuda_ops_take_index_error(int device, k3rt_error *err)
{
    {
        std::lock_guard<std::mutex> lock(g_rec_mu);
        if (device < 0 || device >= kMaxDevices || !g_rec[device])
            return K3RT_OK;  // no kernel that checks indices has run there
    }
    cu_index_record *rec = nullptr;
    K3RT_TRY(cu_index_record_get(device, &rec, err));
    CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    CU_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize (reading the index error record)");
    cu_index_record h;
    CU_TRY(cudaMemcpy(&h, rec, sizeof h, cudaMemcpyDeviceToHost),
           "cudaMemcpy (reading the index error record)");
    if (!h.flag)
        return K3RT_OK;
    CU_TRY(cudaMemset(rec, 0, sizeof h), "cudaMemset (clearing the index error record)");
    CU_TRY(cudaDeviceSynchronize(), "cudaDeviceSynchronize (clearing the index error record)");
    return k3rt_fail(err, K3RT_ERR_INVALID,
                     "%s %lld at position %lld is outside the vocabulary [0, %lld) (found on "
                     "CUDA device %d; %s)",
                     index_op_name(h.op), h.value, h.position, h.limit, device,
                     index_op_effect(h.op));
}
