/* The attention core through cuDNN's fused attention (attn_cudnn.c), behind a C interface for
 * attn.cu's dispatch. Built only where cuDNN's headers were found (K3RT_MLA_HAVE_CUDNN); the
 * library itself is loaded at the first call. */
#ifndef K3RT_PLUGIN_MLA_ATTN_CUDNN_H
#define K3RT_PLUGIN_MLA_ATTN_CUDNN_H

#include "mla_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads libcudnn once (dnn_graph.h's cg_load): K3RT_ERR_UNSUPPORTED with the reason when it
 * cannot be used. */
int mla_cudnn_load(k3rt_error *err);

/* Whether cuDNN's fused attention takes a's shape on a device of compute capability cc_major;
 * when not, *why says what it lacks. */
int mla_cudnn_shape_ok(const mla_attn *a, int cc_major, const char **why);

/* Forward: o and lse of a (mla_cuda.h; block_max must be NULL). Backward: dq, dk, dv, using
 * dq_acc and drow as scratch. K3RT_ERR_UNSUPPORTED when the library is missing or has no
 * engine for the shape (the caller may then run k3rt's kernels); any other error is a
 * failure. */
int mla_cudnn_fwd(void *stream, const mla_attn *a, k3rt_error *err);
int mla_cudnn_bwd(void *stream, const mla_attn *a, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
