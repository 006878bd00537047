/* float instantiation of the attention core (the training path). */
#include <math.h>

#define REAL float
#define EXP expf
#define SUF(name) name##_f32
#include "core.inc.c"
