/* Vectorised tanh and sigmoid for the CPU kernels (cpu_vmath.c): the float ones evaluated in
 * float, within 2.44 / 2.41 ulp; the double tanh is libm's. */
#ifndef K3RT_CPU_VMATH_H
#define K3RT_CPU_VMATH_H

#include <stdint.h>

float cpu_tanhf(float x);
/* y[i] = tanh(x[i] / div), the division in the element type (y may not alias x) */
void cpu_tanh_div_f32(const float *x, float *y, int64_t n, float div);
void cpu_tanh_div_f64(const double *x, double *y, int64_t n, double div);
/* y[i] = 1 / (1 + exp(-x[i])) */
void cpu_sigmoid_f32(const float *x, float *y, int64_t n);

#endif
