/* tanh and sigmoid of floats for the CPU kernels (GLU, activations), without branches so that
 * the loops vectorise (AVX2 where the CPU has it, SSE2 otherwise; both give the same bits: the
 * same IEEE operations, no FMA contraction under -std=c11, and an element's result does not
 * depend on its position). Their exps are evaluated in double.
 *
 * Why: glibc's tanhf goes through expm1f with data-dependent branches on the sign and the
 * range; on the 2-core development machines it cost 14-20 ns an element and, with SiTU-GLU's
 * two tanh per element forward and again backward, was a third of the main job's CPU time.
 * The sigmoid beside it (expf, then a branch on the sign) was another 10% once tanh was
 * fixed. These cost about 2 ns an element with AVX2, bound by the double arithmetic (some 40
 * operations an element, four elements to a register).
 *
 * Accuracy, checked over all 2^32 floats: tanh equals (float)tanh((double)x) except at 40
 * inputs, 1 ulp away there (glibc's tanhf differs from that rounding at 2.8% of the floats).
 * sigmoid keeps the scalar kernels' float formula and vectorises only its exp, rounded once
 * from double: it equals the scalar sigmoid on glibc's expf except at 2e-5 of the floats
 * (where one of the two exps is not correctly rounded). The AVX2 and baseline loops agree on
 * every float. NaN stays NaN; tanh(+-inf) = +-1, sigmoid(-inf) = 0, sigmoid(inf) = 1.
 *
 * Method: e^y = 2^k e^r, k = round(y / ln 2), e^r - 1 by its degree-10 Taylor polynomial on
 * |r| <= ln2 / 2 (relative error < 3e-13), 2^k from the exponent bits. tanh|x| = m / (m + 2),
 * m = e^(2 min(|x|, 9.5)) - 1 (tanh(9.5) rounds to 1.0f); m keeps its relative accuracy near
 * 0, so small |x| need no series of their own. */
#include "ops/cpu_vmath.h"

#include <math.h>
#include <string.h>

/* e^y = s (1 + q) for -110 <= y <= 20: s = 2^k exactly, q = e^r - 1 without the leading 1, so
 * that e^y - 1 = (s - 1) + s q keeps its relative accuracy as y goes to 0 */
static inline double exp_split(double y, double *s)
{
    const double shifter = 0x1.8p52;  /* adding it rounds to an integer kept in the low bits */
    double kd = y * 1.4426950408889634 + shifter;
    uint64_t kb;
    memcpy(&kb, &kd, sizeof kb);
    kd -= shifter;
    /* ln 2 split so that kd * ln2_hi is exact for |k| < 2^20 */
    double r = (y - kd * 0x1.62e42fee00000p-1) - kd * 0x1.a39ef35793c76p-33;
    double r2 = r * r;
    double q = r + r2 * ((1.0 / 2 + r * (1.0 / 6)) +
                         r2 * ((1.0 / 24 + r * (1.0 / 120)) +
                               r2 * ((1.0 / 720 + r * (1.0 / 5040)) +
                                     r2 * ((1.0 / 40320 + r * (1.0 / 362880)) +
                                           r2 * (1.0 / 3628800)))));
    uint64_t sb = (kb + 1023) << 52;  /* 2^k; the shifter's own bits shift out */
    memcpy(s, &sb, sizeof *s);
    return q;
}

static inline float tanh_one(float xf)
{
    double x = xf, ax = fabs(x), s;
    double q = exp_split(2.0 * (ax > 9.5 ? 9.5 : ax), &s);  /* NaN passes the clamp */
    double em1 = (s - 1.0) + s * q;
    return (float)copysign(em1 / (em1 + 2.0), x);
}

/* The scalar kernels' sigmoid, with its exp vectorised: e = e^-|x| rounded to float (below
 * e^-110 it is 0 either way), then 1 / (1 + e) for x >= 0, e / (1 + e) below, in float. */
static inline float sigmoid_one(float x)
{
    double y = -(double)fabsf(x), s;
    y = y < -110.0 ? -110.0 : y;  /* NaN passes */
    double q = exp_split(y, &s);
    float e = (float)(s * (1.0 + q));
    return (x >= 0 ? 1.0f : e) / (1.0f + e);
}

float cpu_tanhf(float x) { return tanh_one(x); }

/* Each kernel twice: an AVX2 clone and a baseline one, chosen at run time. */
#define VMATH_LOOPS(ATTR, SUFFIX)                                                             \
    ATTR static void tanh_div_##SUFFIX(const float *x, float *y, int64_t n, float div)        \
    {                                                                                         \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = tanh_one(x[i] / div);      \
    }                                                                                         \
    ATTR static void sigmoid_##SUFFIX(const float *x, float *y, int64_t n)                    \
    {                                                                                         \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = sigmoid_one(x[i]);         \
    }

VMATH_LOOPS(, plain)
#if defined(__x86_64__) || defined(__i386__)
VMATH_LOOPS(__attribute__((target("avx2"))), avx2)
static int have_avx2(void) { return __builtin_cpu_supports("avx2"); }
#else
#define tanh_div_avx2 tanh_div_plain
#define sigmoid_avx2 sigmoid_plain
static int have_avx2(void) { return 0; }
#endif

void cpu_tanh_div_f32(const float *x, float *y, int64_t n, float div)
{
    if (have_avx2())
        tanh_div_avx2(x, y, n, div);
    else
        tanh_div_plain(x, y, n, div);
}

void cpu_sigmoid_f32(const float *x, float *y, int64_t n)
{
    if (have_avx2())
        sigmoid_avx2(x, y, n);
    else
        sigmoid_plain(x, y, n);
}

void cpu_tanh_div_f64(const double *x, double *y, int64_t n, double div)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = tanh(x[i] / div);
}
