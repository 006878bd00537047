/* The KDA CPU reference (spec kda_mla.md §2-§6, + ERRATA), written once over a real type REAL
 * and built here twice: float for runs, double for the tests' finite differences and tight
 * comparisons. Every name a file defines carries SUF(), so both builds share one translation
 * unit (the tests and the CPU benchmark include this file too).
 *
 * Reading order: each file reads top to bottom and uses only what the files above it define.
 *   cpu_common.inc.c       one (sequence, value head) of the recurrence (kda_head), GEMM from
 *                          inside parallel tasks, row helpers
 *   cpu_recurrent.inc.c    the token-by-token delta rule of one head: the reference form
 *   cpu_chunked.inc.c      the chunkwise-parallel form of one head (spec §4, §5)
 *   cpu_heads.inc.c        one function per head over every head of a call: tasks, scratch,
 *                          shape and workspace checks
 *   cpu_core.inc.c         the recurrence (kda_core_fwd / _bwd) in either form, GVA sums
 *   cpu_layer_parts.inc.c  the pieces around it: short conv, SiLU + L2 norm, forget gate,
 *                          output gate
 *   cpu_layer.inc.c        the layer (kda_layer_fwd / _bwd): projections -> recurrence ->
 *                          norm, gate, output projection, and back
 *   cpu_summary.inc.c      context parallelism: the affine summary of a span (per head, per
 *                          call, per layer) and the composition of two
 *   cpu_decode.inc.c       incremental decoding: one token's pieces (conv over the cached
 *                          inputs, gate, one recurrent step, output gate) for decode.c */

/* ---- float ----------------------------------------------------------------------------------- */
#define REAL float
#define SUF(name) name##_f32
#define KDA_DTYPE K3RT_F32
#define EXP expf
#define SQRT sqrtf
#define LOG1P log1pf
#include "cpu_common.inc.c"
#include "cpu_recurrent.inc.c"
#include "cpu_chunked.inc.c"
#include "cpu_heads.inc.c"
#include "cpu_core.inc.c"
#include "cpu_layer_parts.inc.c"
#include "cpu_layer.inc.c"
#include "cpu_summary.inc.c"
#include "cpu_decode.inc.c"
#undef REAL
#undef SUF
#undef KDA_DTYPE
#undef EXP
#undef SQRT
#undef LOG1P

/* ---- double ---------------------------------------------------------------------------------- */
#define REAL double
#define SUF(name) name##_f64
#define KDA_DTYPE K3RT_F64
#define EXP exp
#define SQRT sqrt
#define LOG1P log1p
#include "cpu_common.inc.c"
#include "cpu_recurrent.inc.c"
#include "cpu_chunked.inc.c"
#include "cpu_heads.inc.c"
#include "cpu_core.inc.c"
#include "cpu_layer_parts.inc.c"
#include "cpu_layer.inc.c"
#include "cpu_summary.inc.c"
#include "cpu_decode.inc.c"
#undef REAL
#undef SUF
#undef KDA_DTYPE
#undef EXP
#undef SQRT
#undef LOG1P
