/* Scalar and buffer conversions between float formats (k3rt/tensor.h). */
#include <k3rt/host.h>
#include <k3rt/tensor.h>

#include <math.h>
#include <string.h>

uint16_t k3rt_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)   /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);       /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float k3rt_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e4m3 (OCP FN variant): 1 sign, 4 exponent (bias 7), 3 mantissa; no infinities, max 448,
 * 0x7f/0xff is NaN. */
float k3rt_fp8e4m3_to_f32(uint8_t x)
{
    int sign = x >> 7, exp = (x >> 3) & 0xf, man = x & 7;
    float v;
    if (exp == 0xf && man == 7)
        return NAN;
    if (exp == 0)
        v = ldexpf((float)man / 8.0f, -6);
    else
        v = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -v : v;
}

uint8_t k3rt_f32_to_fp8e4m3(float x)
{
    if (isnan(x))
        return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f)
        return sign | 0x7e;  /* saturate to +-448 */
    if (a < 0.015625f)  /* below 2^-6: subnormal steps of 2^-9 (8 steps: the least normal) */
        return sign | (uint8_t)nearbyintf(a * 512.0f);
    /* Round the 23 mantissa bits to 3, to nearest even; a carry moves into the exponent. */
    uint32_t u;
    memcpy(&u, &a, 4);
    u = (u + 0x7ffff + ((u >> 20) & 1)) >> 20;  /* 8 exponent bits and 3 mantissa bits */
    int exp = (int)(u >> 3) - 127 + 7;
    return sign | (uint8_t)((exp << 3) | (u & 7));
}

static double load_float(const void *p, int dtype, int64_t i)
{
    switch (dtype) {
    case K3RT_F32: return ((const float *)p)[i];
    case K3RT_F64: return ((const double *)p)[i];
    case K3RT_BF16: return k3rt_bf16_to_f32(((const uint16_t *)p)[i]);
    case K3RT_FP8_E4M3: return k3rt_fp8e4m3_to_f32(((const uint8_t *)p)[i]);
    default: return 0.0;
    }
}

static void store_float(void *p, int dtype, int64_t i, double v)
{
    switch (dtype) {
    case K3RT_F32: ((float *)p)[i] = (float)v; break;
    case K3RT_F64: ((double *)p)[i] = v; break;
    case K3RT_BF16: ((uint16_t *)p)[i] = k3rt_f32_to_bf16((float)v); break;
    case K3RT_FP8_E4M3: ((uint8_t *)p)[i] = k3rt_f32_to_fp8e4m3((float)v); break;
    default: break;
    }
}

int k3rt_convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n,
                 k3rt_error *err)
{
    if (!k3rt_dtype_is_float(dst_dtype) || !k3rt_dtype_is_float(src_dtype))
        return k3rt_fail(err, K3RT_ERR_INVALID, "convert: %s -> %s is not a float conversion",
                         k3rt_dtype_name(src_dtype), k3rt_dtype_name(dst_dtype));
    if (dst_dtype == src_dtype) {
        memmove(dst, src, (size_t)n * k3rt_dtype_size(dst_dtype));
        return K3RT_OK;
    }
    for (int64_t i = 0; i < n; i++)
        store_float(dst, dst_dtype, i, load_float(src, src_dtype, i));
    return K3RT_OK;
}
