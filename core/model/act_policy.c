/* The class-name glob and fp8 tile storage (act_policy.h). */
#include "model/act_policy.h"

#include <math.h>
#include <string.h>

#include <k3rt/k3rt.h>

int act_glob(const char *p, const char *s)
{
    /* Iterative wildcard match with one backtrack point: linear in practice, never recursive
     * (a recipe's pattern cannot blow the stack). */
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*p == '*') {
            star = p++;
            resume = s;
        } else if (*p == '?' || *p == *s) {
            p++;
            s++;
        } else if (star) {
            p = star + 1;
            s = ++resume;
        } else {
            return 0;
        }
    }
    while (*p == '*')
        p++;
    return *p == 0;
}

int64_t act_fp8_bytes(int64_t numel)
{
    int64_t tiles = (numel + ACT_FP8_TILE - 1) / ACT_FP8_TILE;
    return (numel + 3) / 4 * 4 + tiles * (int64_t)sizeof(float);
}

static double value_at(const void *src, int dtype, int64_t i)
{
    return dtype == K3RT_F64 ? ((const double *)src)[i] : ((const float *)src)[i];
}

void act_fp8_store(const void *src, int dtype, int64_t numel, void *dst)
{
    uint8_t *codes = dst;
    float *scales = (float *)(codes + (numel + 3) / 4 * 4);
    for (int64_t t0 = 0, tile = 0; t0 < numel; t0 += ACT_FP8_TILE, tile++) {
        int64_t n = numel - t0 < ACT_FP8_TILE ? numel - t0 : ACT_FP8_TILE;
        double amax = 0;
        for (int64_t i = 0; i < n; i++) {
            double a = fabs(value_at(src, dtype, t0 + i));
            amax = a > amax ? a : amax;
        }
        /* 448 is e4m3's largest finite value: the tile's largest element lands on it. */
        float scale = (float)(amax / 448.0);
        scales[tile] = scale;
        for (int64_t i = 0; i < n; i++)
            codes[t0 + i] = scale > 0 ? k3rt_f32_to_fp8e4m3(
                                            (float)(value_at(src, dtype, t0 + i) / scale))
                                      : 0;
    }
}

void act_fp8_load(const void *src, int64_t numel, void *dst, int dtype)
{
    const uint8_t *codes = src;
    const float *scales = (const float *)(codes + (numel + 3) / 4 * 4);
    for (int64_t i = 0; i < numel; i++) {
        double v = (double)k3rt_fp8e4m3_to_f32(codes[i]) * scales[i / ACT_FP8_TILE];
        if (dtype == K3RT_F64)
            ((double *)dst)[i] = v;
        else
            ((float *)dst)[i] = (float)v;
    }
}
