/* double instantiation of the attention core (finite-difference checks). */
#include <math.h>

#define REAL double
#define EXP exp
#define SUF(name) name##_f64
#include "core.inc.c"
