/* double instantiation of the KDA CPU kernels (tests, finite differences). */
#define REAL double
#define SUF(name) name##_f64
#define KDA_DTYPE K3RT_F64
#define EXP exp
#define SQRT sqrt
#define LOG1P log1p
#include "kernels.inc.c"
