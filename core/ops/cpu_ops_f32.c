/* float instantiation of the CPU reference kernels. */
#include "ops/cpu_ops.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define REAL float
#define R_EXP expf
#define R_TANH tanhf
#define R_LOG1P log1pf
#define R_SQRT sqrtf
#define SUF(name) name##_f32
#include "ops/cpu_ops.inc.c"
