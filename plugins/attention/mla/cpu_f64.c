/* double instantiation of the MLA CPU kernels (tests and finite-difference checks). */
#include <math.h>
#define REAL double
#define DTYPE K3RT_F64
#define EXP exp
#define SUF(name) name##_f64
#include "cpu.inc.c"
