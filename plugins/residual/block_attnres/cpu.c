/* The AttnRes CPU reference (cpu.inc.c, the mixing op over a sublayer's sources, forward and
 * backward), written once over a real type REAL and built here twice: float for runs, double for
 * the tests' finite differences. Every name it defines carries SUF(). */
#include <float.h>
#include <math.h>

/* ---- float ----------------------------------------------------------------------------------- */
#define REAL float
#define DTYPE K3RT_F32
#define EXP expf
#define SQRT sqrtf
#define EPSILON FLT_EPSILON
#define SUF(name) name##_f32
#include "cpu.inc.c"
#undef REAL
#undef DTYPE
#undef EXP
#undef SQRT
#undef EPSILON
#undef SUF

/* ---- double ---------------------------------------------------------------------------------- */
#define REAL double
#define DTYPE K3RT_F64
#define EXP exp
#define SQRT sqrt
#define EPSILON DBL_EPSILON
#define SUF(name) name##_f64
#include "cpu.inc.c"
