/* float instantiation of the CPU reference kernels. */
#include "ops/cpu_ops.h"
#include "ops/cpu_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define REAL float
#define R_EXP expf
#define R_TANH cpu_tanhf
#define R_TANH_DIV cpu_tanh_div_f32
#define R_SIGMOID_N cpu_sigmoid_f32
#define R_LOG1P log1pf
#define R_SQRT sqrtf
#define SUF(name) name##_f32
#include "ops/cpu_ops.inc.c"
