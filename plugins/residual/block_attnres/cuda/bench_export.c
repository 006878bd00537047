/* The C API of attnres_cuda.h for the benchmark's Python side (scripts/bench/attnres_gpu.py),
 * which loads this shared object with ctypes and calls it on PyTorch's tensors and stream: one
 * op over n sources, the backward writing the source gradients (as fla's fused_attnres does).
 * The library's own symbols are hidden; these wrappers are the exports. */
#include <stdio.h>
#include <string.h>

#include "attnres_cuda.h"

#define ARB_API __attribute__((visibility("default")))

static int finish(int rc, const k3rt_error *err, char *msg, size_t cap)
{
    if (msg && cap)
        snprintf(msg, cap, "%s", rc ? err->msg : "");
    return rc;
}

static int make_op(int dtype, int64_t N, int64_t d, int n, const void *const *v, const void *w,
                   const void *gamma, float eps, float *alpha, ar_cuda_op *op, k3rt_error *err)
{
    memset(op, 0, sizeof *op);
    K3RT_TRY(ar_cuda_supported(dtype, d, n, err));
    op->dtype = dtype, op->n = n, op->N = N, op->d = d;
    for (int i = 0; i < n; i++)
        op->v[i] = v[i];
    op->w = w, op->gamma = gamma, op->eps = eps, op->alpha = alpha;
    return K3RT_OK;
}

ARB_API int64_t arb_scratch_bytes(int64_t N, int64_t d) { return ar_cuda_bwd_scratch_bytes(N, d); }

/* h = the op; alpha [N, n] f32 is kept for the backward. */
ARB_API int arb_fwd(void *stream, int dtype, int64_t N, int64_t d, int n, const void *const *v,
                    const void *w, const void *gamma, float eps, float *alpha, void *h,
                    char *msg, size_t cap)
{
    k3rt_error err;
    memset(&err, 0, sizeof err);
    ar_cuda_op op;
    int rc = make_op(dtype, N, d, n, v, w, gamma, eps, alpha, &op, &err);
    if (!rc)
        rc = ar_cuda_fwd(stream, &op, h, NULL, &err);
    return finish(rc, &err, msg, cap);
}

/* dv[i] (dtype) written; dw, dgamma (f32) accumulate; h is the forward's output. */
ARB_API int arb_bwd(void *stream, int dtype, int64_t N, int64_t d, int n, const void *const *v,
                    const void *w, const void *gamma, float eps, float *alpha, const void *h,
                    const void *dh, void *const *dv, float *dw, float *dgamma, void *scratch,
                    char *msg, size_t cap)
{
    k3rt_error err;
    memset(&err, 0, sizeof err);
    ar_cuda_op op;
    ar_cuda_bwd b;
    memset(&b, 0, sizeof b);
    int rc = make_op(dtype, N, d, n, v, w, gamma, eps, alpha, &op, &err);
    b.h = h, b.dh = dh, b.overwrite = 1, b.dw = dw, b.dgamma = dgamma, b.scratch = scratch;
    for (int i = 0; !rc && i < n; i++)
        b.dv[i] = dv[i];
    if (!rc)
        rc = ar_cuda_bwd_run(stream, &op, &b, &err);
    return finish(rc, &err, msg, cap);
}
