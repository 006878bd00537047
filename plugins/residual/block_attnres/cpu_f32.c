/* float instantiation of the AttnRes mixing op (the training path). */
#include <float.h>
#include <math.h>
#define REAL float
#define DTYPE K3RT_F32
#define EXP expf
#define SQRT sqrtf
#define EPSILON FLT_EPSILON
#define SUF(name) name##_f32
#include "cpu.inc.c"
