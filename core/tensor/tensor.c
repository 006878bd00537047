/* Tensor views and dtype metadata (k3rt/tensor.h). */
#include <k3rt/tensor.h>

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
    int is_float;
} g_dtypes[K3RT_DTYPE_COUNT_] = {
    [K3RT_DTYPE_INVALID] = {"invalid", 0, 0}, [K3RT_F32] = {"f32", 4, 1},
    [K3RT_F64] = {"f64", 8, 1},               [K3RT_BF16] = {"bf16", 2, 1},
    [K3RT_FP8_E4M3] = {"fp8e4m3", 1, 1},      [K3RT_I32] = {"i32", 4, 0},
    [K3RT_I64] = {"i64", 8, 0},               [K3RT_U8] = {"u8", 1, 0},
    [K3RT_U16] = {"u16", 2, 0},
};

static int valid_dtype(int dtype) { return dtype > 0 && dtype < K3RT_DTYPE_COUNT_; }

size_t k3rt_dtype_size(int dtype) { return valid_dtype(dtype) ? g_dtypes[dtype].size : 0; }

const char *k3rt_dtype_name(int dtype)
{
    return valid_dtype(dtype) ? g_dtypes[dtype].name : "invalid";
}

const char *k3rt_device_str(int device, char *buf, size_t len)
{
    if (device == K3RT_DEVICE_CPU)
        snprintf(buf, len, "the CPU");
    else
        snprintf(buf, len, "cuda:%d", device);
    return buf;
}

int k3rt_dtype_from_name(const char *name)
{
    for (int i = 1; i < K3RT_DTYPE_COUNT_; i++)
        if (!strcmp(name, g_dtypes[i].name))
            return i;
    return K3RT_DTYPE_INVALID;
}

int k3rt_dtype_is_float(int dtype) { return valid_dtype(dtype) && g_dtypes[dtype].is_float; }

int64_t k3rt_tensor_numel(const k3rt_tensor *t)
{
    if (t->ndim <= 0)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim && i < K3RT_MAX_DIMS; i++)
        n *= t->shape[i];
    return n;
}

size_t k3rt_tensor_bytes(const k3rt_tensor *t)
{
    return (size_t)k3rt_tensor_numel(t) * k3rt_dtype_size(t->dtype);
}

int k3rt_tensor_present(const k3rt_tensor *t) { return t && t->ndim > 0 && t->data != NULL; }

k3rt_tensor k3rt_tensor_view(void *data, int dtype, int device, int ndim, int64_t d0,
                             int64_t d1, int64_t d2, int64_t d3)
{
    k3rt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.ndim = ndim < 0 ? 0 : (ndim > K3RT_MAX_DIMS ? K3RT_MAX_DIMS : ndim);
    int64_t dims[K3RT_MAX_DIMS] = {d0, d1, d2, d3};
    for (int i = 0; i < t.ndim; i++)
        t.shape[i] = dims[i];
    return t;
}

const char *k3rt_tensor_shape_str(const k3rt_tensor *t, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, len - at, "[");
    for (int i = 0; i < t->ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, i ? ", %lld" : "%lld",
                               (long long)t->shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
    return buf;
}
