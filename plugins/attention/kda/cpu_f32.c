/* float instantiation of the KDA CPU kernels (the training path). */
#define REAL float
#define SUF(name) name##_f32
#define KDA_DTYPE K3RT_F32
#define EXP expf
#define SQRT sqrtf
#define LOG1P log1pf
#include "kernels.inc.c"
