/* double instantiation of the LatentMoE token loops (tests and finite-difference checks). */
#define REAL double
#define SUF(name) name##_f64
#include "kernels.inc.c"
