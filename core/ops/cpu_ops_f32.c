/* float instantiation of the CPU reference kernels. */
#include "ops/cpu_ops.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define REAL float
#define SUF(name) name##_f32
#include "ops/cpu_ops.inc.c"
