/* Checked size arithmetic for every size computed from user input (recipe values, file
 * headers): products and sums of non-negative int64 values that either fit or say so.
 *
 * The operations are sticky: each takes a flag, returns 0 and sets the flag on overflow or on
 * a negative operand, and leaves it set, so a whole formula is written plainly and checked
 * once at the end:
 *     int bad = 0;
 *     int64_t bytes = ck_mul(&bad, ck_mul(&bad, B, T), row);
 *     if (bad) return k3rt_fail(err, K3RT_ERR_INVALID, "...: too large ...");
 */
#ifndef K3RT_UTIL_CHECKED_H
#define K3RT_UTIL_CHECKED_H

#include <stdint.h>

static inline int64_t ck_mul(int *bad, int64_t a, int64_t b)
{
    int64_t r;
    if (*bad || a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) {
        *bad = 1;
        return 0;
    }
    return r;
}

static inline int64_t ck_add(int *bad, int64_t a, int64_t b)
{
    int64_t r;
    if (*bad || a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) {
        *bad = 1;
        return 0;
    }
    return r;
}

/* a rounded up to a multiple of `align` (a power of two). */
static inline int64_t ck_align(int *bad, int64_t a, int64_t align)
{
    return ck_add(bad, a, align - 1) & ~(align - 1);
}

#endif
