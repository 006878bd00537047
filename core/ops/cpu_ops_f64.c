/* double instantiation of the CPU reference kernels (tests). */
#include "ops/cpu_ops.h"
#include "ops/cpu_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#define REAL double
#define R_EXP exp
#define R_TANH tanh
#define R_TANH_DIV cpu_tanh_div_f64
#define R_SIGMOID_N sigmoid_n_f64
#define R_LOG1P log1p
#define R_SQRT sqrt
#define SUF(name) name##_f64
#include "ops/cpu_ops.inc.c"
