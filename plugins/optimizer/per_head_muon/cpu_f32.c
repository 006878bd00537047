/* float instantiation of the Muon kernels (the training path). */
#define REAL float
#define DTYPE K3RT_F32
#define SUF(name) name##_f32
#include "ns.inc.c"
#include "block.inc.c"
