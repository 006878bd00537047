/* k3rt/tensor.h — the tensor value type.
 *
 * A tensor is a view: data pointer, dtype, device and a row-major contiguous shape of up to
 * 4 dims. It owns nothing; memory belongs to an arena or allocation of whoever made it (the
 * engine for parameters, gradients and activations; a plugin for its own state). There is no
 * autograd: every module has an explicit forward and backward.
 *
 * k3rt_tensor is a frozen value type for an ABI major version (it never grows).
 */
#ifndef K3RT_TENSOR_H
#define K3RT_TENSOR_H

#include <stdint.h>
#include <stddef.h>
#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k3rt_dtype {
    K3RT_DTYPE_INVALID = 0,
    K3RT_F32 = 1,
    K3RT_F64 = 2,      /* CPU only: tests and finite-difference checks */
    K3RT_BF16 = 3,
    K3RT_FP8_E4M3 = 4,
    K3RT_I32 = 5,
    K3RT_I64 = 6,
    K3RT_U8 = 7,
    K3RT_U16 = 8,
    K3RT_DTYPE_COUNT_ = 9
} k3rt_dtype;

#define K3RT_DEVICE_CPU (-1)   /* device >= 0 is CUDA device n */
#define K3RT_MAX_DIMS 4

typedef struct k3rt_tensor {
    void *data;
    int32_t dtype;   /* k3rt_dtype */
    int32_t device;  /* K3RT_DEVICE_CPU or a CUDA ordinal */
    int32_t ndim;    /* 0 means "no tensor" (an optional argument left out) */
    int32_t reserved_;
    int64_t shape[K3RT_MAX_DIMS];
} k3rt_tensor;

K3RT_API size_t k3rt_dtype_size(int dtype);            /* 0 for an invalid dtype */
K3RT_API const char *k3rt_dtype_name(int dtype);       /* "f32", "bf16", ... */
K3RT_API int k3rt_dtype_from_name(const char *name);   /* K3RT_DTYPE_INVALID if unknown */
K3RT_API int k3rt_dtype_is_float(int dtype);
/* The device in words for messages, written into buf: "the CPU" or "cuda:N". Returns buf. */
K3RT_API const char *k3rt_device_str(int device, char *buf, size_t len);

K3RT_API int64_t k3rt_tensor_numel(const k3rt_tensor *t);
K3RT_API size_t k3rt_tensor_bytes(const k3rt_tensor *t);
K3RT_API int k3rt_tensor_present(const k3rt_tensor *t); /* ndim > 0 && data != NULL */
/* Builds a view; unused trailing dims are ignored. */
K3RT_API k3rt_tensor k3rt_tensor_view(void *data, int dtype, int device, int ndim, int64_t d0,
                                      int64_t d1, int64_t d2, int64_t d3);
/* "[4, 128]" into buf. */
K3RT_API const char *k3rt_tensor_shape_str(const k3rt_tensor *t, char *buf, size_t len);

/* Scalar conversions (round-to-nearest-even; fp8 saturates to +-448). */
K3RT_API uint16_t k3rt_f32_to_bf16(float x);
K3RT_API float k3rt_bf16_to_f32(uint16_t x);
K3RT_API uint8_t k3rt_f32_to_fp8e4m3(float x);
K3RT_API float k3rt_fp8e4m3_to_f32(uint8_t x);

#ifdef __cplusplus
}
#endif
#endif
