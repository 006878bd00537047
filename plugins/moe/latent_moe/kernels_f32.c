/* float instantiation of the LatentMoE token loops (the training path). */
#define REAL float
#define SUF(name) name##_f32
#include "kernels.inc.c"
