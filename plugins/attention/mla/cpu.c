/* The MLA CPU reference (cpu.inc.c, and the decode step's pieces in cpu_decode.inc.c), written
 * once over a real type REAL and built here twice:
 * float for runs (with a vectorisable exp), double for the tests' finite differences. Every
 * name it defines carries SUF(). */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* e^x for the softmax rows (x <= 0) and the gate (x <= 80): x = n ln2 + r with |r| <= ln2/2,
 * a degree-6 Taylor polynomial for e^r and 2^n built in the exponent bits; relative error
 * <= 2.5e-7 (about 2 ulp). Branch-free, so the loops vectorise, where glibc's expf is a call per
 * element. Below -87 it returns 0 (never a denormal: they cost a microcode assist each); a NaN
 * stays NaN; x > 88 is out of its domain. */
static inline float mla_expf(float x)
{
    float xc = x < -87.0f ? -87.0f : x;
    float t = xc * 1.44269504f + 12582912.0f; /* 1.5 * 2^23: n lands in the low mantissa bits */
    float n = t - 12582912.0f;
    float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f; /* ln2 split in two (Cody-Waite) */
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f +
                                                 r * (0.00833333333f + r * 0.00138888889f)))));
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    sb = (tb - 0x4B400000u + 127u) << 23;
    float s;
    memcpy(&s, &sb, sizeof s);
    return x < -87.0f ? 0.0f : p * s;
}

/* ---- float ----------------------------------------------------------------------------------- */
#define REAL float
#define DTYPE K3RT_F32
#define EXP mla_expf
#define SUF(name) name##_f32
#include "cpu.inc.c"
#include "cpu_decode.inc.c"
#undef REAL
#undef DTYPE
#undef EXP
#undef SUF

/* ---- double ---------------------------------------------------------------------------------- */
#define REAL double
#define DTYPE K3RT_F64
#define EXP exp
#define SUF(name) name##_f64
#include "cpu.inc.c"
#include "cpu_decode.inc.c"
