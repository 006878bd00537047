/* double instantiation of the AttnRes mixing op (tests and finite-difference checks). */
#include <float.h>
#include <math.h>
#define REAL double
#define DTYPE K3RT_F64
#define EXP exp
#define SQRT sqrt
#define EPSILON DBL_EPSILON
#define SUF(name) name##_f64
#include "cpu.inc.c"
