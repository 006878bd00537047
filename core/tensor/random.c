/* Deterministic random numbers (k3rt/random.h). */
#include <k3rt/random.h>

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void k3rt_rng_seed(k3rt_rng *rng, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t k3rt_rng_u64(k3rt_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double k3rt_rng_uniform(k3rt_rng *rng) { return (double)(k3rt_rng_u64(rng) >> 11) * 0x1.0p-53; }

double k3rt_rng_normal(k3rt_rng *rng)
{
    /* Box-Muller; one draw per call keeps the stream position simple to reason about. */
    double u1 = k3rt_rng_uniform(rng), u2 = k3rt_rng_uniform(rng);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t k3rt_hash_string(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static int fill(k3rt_tensor *t, k3rt_rng *rng, int normal, double a, double b, k3rt_error *err)
{
    if (t->device != K3RT_DEVICE_CPU)
        return k3rt_fail(err, K3RT_ERR_INVALID, "random fill needs a host tensor");
    int64_t n = k3rt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = normal ? a + b * k3rt_rng_normal(rng) : a + (b - a) * k3rt_rng_uniform(rng);
        switch (t->dtype) {
        case K3RT_F32: ((float *)t->data)[i] = (float)v; break;
        case K3RT_F64: ((double *)t->data)[i] = v; break;
        case K3RT_BF16: ((uint16_t *)t->data)[i] = k3rt_f32_to_bf16((float)v); break;
        default:
            return k3rt_fail(err, K3RT_ERR_INVALID, "random fill: unsupported dtype %s",
                             k3rt_dtype_name(t->dtype));
        }
    }
    return K3RT_OK;
}

int k3rt_fill_normal(k3rt_tensor *t, k3rt_rng *rng, double mean, double std, k3rt_error *err)
{
    return fill(t, rng, 1, mean, std, err);
}

int k3rt_fill_uniform(k3rt_tensor *t, k3rt_rng *rng, double lo, double hi, k3rt_error *err)
{
    return fill(t, rng, 0, lo, hi, err);
}
