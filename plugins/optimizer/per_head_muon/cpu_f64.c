/* double instantiation of the Muon kernels (tests). */
#define REAL double
#define DTYPE K3RT_F64
#define SUF(name) name##_f64
#include "ns.inc.c"
#include "block.inc.c"
