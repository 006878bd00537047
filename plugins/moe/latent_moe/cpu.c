/* The LatentMoE token loops of the CPU reference (cpu_tokens.inc.c: routing, gather, combine and
 * their backwards), written once over a real type REAL and built here twice: float for runs,
 * double for the tests' finite differences. The matrix products and norms are core ops that
 * dispatch on the dtype (moe.c, written once). */

/* ---- float ----------------------------------------------------------------------------------- */
#define REAL float
#define SUF(name) name##_f32
#include "cpu_tokens.inc.c"
#undef REAL
#undef SUF

/* ---- double ---------------------------------------------------------------------------------- */
#define REAL double
#define SUF(name) name##_f64
#include "cpu_tokens.inc.c"
