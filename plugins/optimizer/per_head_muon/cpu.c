/* The Muon kernels of the CPU reference (ns.inc.c: Newton-Schulz on one block; block.inc.c: a
 * parameter's blocks), written once over a real type REAL and built here twice: float for runs,
 * double for the tests. Every name they define carries SUF(). */

/* ---- float ----------------------------------------------------------------------------------- */
#define REAL float
#define DTYPE K3RT_F32
#define SUF(name) name##_f32
#include "ns.inc.c"
#include "block.inc.c"
#undef REAL
#undef DTYPE
#undef SUF

/* ---- double ---------------------------------------------------------------------------------- */
#define REAL double
#define DTYPE K3RT_F64
#define SUF(name) name##_f64
#include "ns.inc.c"
#include "block.inc.c"
