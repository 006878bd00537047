/* The C API of kda_cuda.h for the benchmark's Python side (scripts/bench/kda_gpu.py), which
 * loads this shared object with ctypes and calls it on PyTorch's tensors and stream. The
 * library's own symbols are hidden; these wrappers are the exports. */
#include <stdio.h>
#include <string.h>

#include "kda_cuda.h"

#define KDAB_API __attribute__((visibility("default")))

/* sizeof(kda_cuda_args), so the caller can check its mirror of the struct. */
KDAB_API size_t kdab_args_size(void) { return sizeof(kda_cuda_args); }

static int finish(int rc, const k3rt_error *err, char *msg, size_t cap)
{
    if (msg && cap)
        snprintf(msg, cap, "%s", rc ? err->msg : "");
    return rc;
}

KDAB_API int kdab_sizes(const kda_cuda_args *a, size_t *saved, size_t *ws_fwd, size_t *ws_bwd,
                        char *msg, size_t cap)
{
    k3rt_error err;
    memset(&err, 0, sizeof err);
    int rc = kda_cuda_saved_bytes(a, saved, &err);
    if (!rc)
        rc = kda_cuda_workspace_bytes(a, 0, ws_fwd, &err);
    if (!rc)
        rc = kda_cuda_workspace_bytes(a, 1, ws_bwd, &err);
    return finish(rc, &err, msg, cap);
}

KDAB_API int kdab_fwd(void *stream, const kda_cuda_args *a, char *msg, size_t cap)
{
    k3rt_error err;
    memset(&err, 0, sizeof err);
    return finish(kda_cuda_fwd(stream, a, &err), &err, msg, cap);
}

KDAB_API int kdab_bwd(void *stream, const kda_cuda_args *a, char *msg, size_t cap)
{
    k3rt_error err;
    memset(&err, 0, sizeof err);
    return finish(kda_cuda_bwd(stream, a, &err), &err, msg, cap);
}
