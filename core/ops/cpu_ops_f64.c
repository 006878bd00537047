/* double instantiation of the CPU reference kernels (tests). */
#include "ops/cpu_ops.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define REAL double
#define R_EXP exp
#define R_TANH tanh
#define R_LOG1P log1p
#define R_SQRT sqrt
#define SUF(name) name##_f64
#include "ops/cpu_ops.inc.c"
