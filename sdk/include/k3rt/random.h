/* k3rt/random.h — the deterministic random generator used for initialisation and data order.
 *
 * xoshiro256** seeded through splitmix64 from (seed, stream). The same (seed, stream) gives the
 * same sequence on every machine, so parameter init does not depend on rank or load order: the
 * engine seeds each parameter's generator with a hash of the run seed and the parameter name.
 * k3rt_rng is a frozen value type for an ABI major version.
 */
#ifndef K3RT_RANDOM_H
#define K3RT_RANDOM_H

#include <stdint.h>
#include "errors.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3rt_rng {
    uint64_t s[4];
} k3rt_rng;

K3RT_API void k3rt_rng_seed(k3rt_rng *rng, uint64_t seed, uint64_t stream);
K3RT_API uint64_t k3rt_rng_u64(k3rt_rng *rng);
K3RT_API double k3rt_rng_uniform(k3rt_rng *rng);             /* [0, 1) */
K3RT_API double k3rt_rng_normal(k3rt_rng *rng);              /* N(0, 1) */
K3RT_API uint64_t k3rt_hash_string(const char *s);           /* FNV-1a 64 */
/* Fills a host tensor (f32/f64/bf16) with N(mean, std^2) or U[lo, hi). */
K3RT_API int k3rt_fill_normal(k3rt_tensor *t, k3rt_rng *rng, double mean, double std,
                              k3rt_error *err);
K3RT_API int k3rt_fill_uniform(k3rt_tensor *t, k3rt_rng *rng, double lo, double hi,
                               k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
