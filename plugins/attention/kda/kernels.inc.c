/* The CPU kernels of one dtype, in dependency order; the including file defines REAL, SUF,
 * KDA_DTYPE, EXP, SQRT and LOG1P, which are undefined at the end so a translation
 * unit may include both instantiations (the tests and the benchmark do). */
#include "common.inc.c"
#include "recurrent.inc.c"
#include "chunked.inc.c"
#include "summary.inc.c"
#include "core.inc.c"
#include "parts.inc.c"
#include "layer.inc.c"

#undef REAL
#undef SUF
#undef KDA_DTYPE
#undef EXP
#undef SQRT
#undef LOG1P
