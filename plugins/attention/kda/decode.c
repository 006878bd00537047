/* KDA's incremental decoding (ABI 2.2 cache_create / decode_step / cache_destroy): one token
 * per sequence through the layer of cpu_layer.inc.c, in the same order, with what the layer
 * needs of the tokens before it kept in a cache: the recurrent state S (dim_k x dim_v per value
 * head, fp32 on CUDA) and the short conv's last W-1 inputs. The cache has a fixed size: a
 * sequence can grow without limit. Projections, the beta sigmoid and the output RMSNorm are
 * the shared ops; conv, gate, recurrence and output gate are kda_dec_kernels (the CPU's from
 * cpu_decode.inc.c in f32 or f64, CUDA's from cuda_decode.c). */
#include <stdlib.h>
#include <string.h>

#include "kda.h"

/* One step's buffers in the cache's workspace, byte offsets (B sequences). */
enum { D_P0, D_P1, D_P2, D_N0, D_N1, D_N2, D_FA, D_Z, D_G, D_BETA, D_O, D_ON, D_GA, D_GATE,
       D_YG, D_SCRATCH, D_N };

static int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }

static int64_t dec_layout(const kda *m, int64_t B, int64_t off[D_N])
{
    int64_t Dk = m->H * m->dim_k, Dv = m->HV * m->dim_v, Dg = m->HV * m->dim_k;
    const int64_t width[D_SCRATCH] = {Dk, Dk, Dv, Dk, Dk, Dv, m->rf, Dg, Dg, m->HV, Dv, Dv,
                                      m->rg, Dv, Dv};
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype), at = 0;
    for (int i = 0; i < D_SCRATCH; i++) {
        off[i] = at;
        at += up64(B * width[i] * es);
    }
    off[D_SCRATCH] = at;
    return at + up64(m->device == K3RT_DEVICE_CPU ? kda_dec_scratch(m, B) : 0);
}

int64_t kda_dec_scratch(const kda *m, int64_t B)
{
    int64_t Dk = m->H * m->dim_k, Dv = m->HV * m->dim_v;
    int64_t conv = B * ((Dk > Dv ? Dk : Dv) + m->H);            /* conv output, L2 rstd */
    int64_t recur = B * m->HV * (m->dim_k + 2 * m->dim_v);      /* decay, e, u per head */
    return (conv > recur ? conv : recur) * (int64_t)k3rt_dtype_size(m->dtype);
}

static const kda_dec_kernels *kernels(const kda *m)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return &kda_dec_cuda;
#endif
    return m->dtype == K3RT_F64 ? &kda_dec_cpu_f64 : &kda_dec_cpu_f32;
}

void kda_cache_destroy(void *self, void *cache)
{
    const kda *m = self;
    kda_cache *c = cache;
    if (!c)
        return;
    k3rt_free(m->device, c->S);
    for (int i = 0; i < 3; i++)
        k3rt_free(m->device, c->hist[i]);
    k3rt_free(m->device, c->ws);
    free(c);
}

/* A zeroed device buffer of `bytes` (at least 1). */
static void *zeroed(const kda *m, k3rt_stream *s, int64_t bytes, k3rt_error *err)
{
    size_t n = bytes > 0 ? (size_t)bytes : 1;
    void *p = k3rt_alloc(m->device, n, err);
    if (p && k3rt_memset(s, p, m->device, 0, n, err)) {
        k3rt_free(m->device, p);
        return NULL;
    }
    return p;
}

int kda_cache_create(void *self, const k3rt_cache_args *a, void **cache, k3rt_error *err)
{
    const kda *m = self;
    int64_t B = a->batch, es = (int64_t)k3rt_dtype_size(m->dtype);
    int64_t se = m->device == K3RT_DEVICE_CPU ? es : 4, off[D_N];
    const int64_t width[3] = {m->H * m->dim_k, m->H * m->dim_k, m->HV * m->dim_v};
    kda_cache *c = calloc(1, sizeof *c);
    if (!c)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "kda: out of memory");
    c->B = B;
    int ok = (c->S = zeroed(m, a->stream, B * m->HV * m->dim_k * m->dim_v * se, err)) != NULL;
    for (int i = 0; ok && i < 3; i++)
        ok = (c->hist[i] = zeroed(m, a->stream, B * (m->W - 1) * width[i] * es, err)) != NULL;
    ok = ok && (c->ws = k3rt_alloc(m->device, (size_t)dec_layout(m, B, off), err)) != NULL;
    if (!ok) {
        kda_cache_destroy(self, c);
        return err && err->code ? err->code : K3RT_ERR_NOMEM;
    }
    *cache = c;
    return K3RT_OK;
}

static int lin(const kda *m, k3rt_stream *s, const void *x, const void *w, void *y, int64_t n,
               int64_t in, int64_t out, k3rt_error *err)
{
    return k3rt_linear_fwd(s, m->dtype, x, w, NULL, y, n, in, out, err);
}

int kda_decode_step(void *self, void *cache, const k3rt_decode_args *a, k3rt_error *err)
{
    const kda *m = self;
    kda_cache *c = cache;
    const kda_dec_kernels *K = kernels(m);
    k3rt_stream *s = a->stream;
    const int64_t B = a->batch, d = m->d, H = m->H, HV = m->HV;
    const int64_t Dk = H * m->dim_k, Dv = HV * m->dim_v, Dg = HV * m->dim_k;
    const void *P[KDA_N_SLOTS];
    for (int i = 0; i < KDA_N_SLOTS; i++)
        P[i] = m->slot[i] >= 0 ? a->params[m->slot[i]].data : NULL;
    int64_t off[D_N];
    dec_layout(m, B, off);
    void *w[D_N];
    for (int i = 0; i < D_N; i++)
        w[i] = (char *)c->ws + off[i];
    const void *x = a->x.data;
    /* q, k, v: projection, short conv over the cached inputs, SiLU (+ L2 norm) */
    K3RT_TRY(lin(m, s, x, P[KDA_Q], w[D_P0], B, d, Dk, err));
    K3RT_TRY(lin(m, s, x, P[KDA_K], w[D_P1], B, d, Dk, err));
    K3RT_TRY(lin(m, s, x, P[KDA_V], w[D_P2], B, d, Dv, err));
    K3RT_TRY(K->conv(m, s, B, H, m->dim_k, w[D_P0], c->hist[0], P[KDA_QCONV], 1, w[D_N0],
                     w[D_SCRATCH], err));
    K3RT_TRY(K->conv(m, s, B, H, m->dim_k, w[D_P1], c->hist[1], P[KDA_KCONV], 1, w[D_N1],
                     w[D_SCRATCH], err));
    K3RT_TRY(K->conv(m, s, B, HV, m->dim_v, w[D_P2], c->hist[2], P[KDA_VCONV], 0, w[D_N2],
                     w[D_SCRATCH], err));
    /* forget gate and beta */
    if (m->rf) {
        K3RT_TRY(lin(m, s, x, P[KDA_FA], w[D_FA], B, d, m->rf, err));
        K3RT_TRY(lin(m, s, w[D_FA], P[KDA_FB], w[D_Z], B, m->rf, Dg, err));
    } else {
        K3RT_TRY(lin(m, s, x, P[KDA_F], w[D_Z], B, d, Dg, err));
    }
    K3RT_TRY(K->gate(m, s, B, w[D_Z], P[KDA_ALOG], P[KDA_DTB], w[D_G], err));
    K3RT_TRY(lin(m, s, x, P[KDA_B], w[D_BETA], B, d, HV, err));
    K3RT_TRY(k3rt_act_fwd(s, m->dtype, K3RT_ACT_SIGMOID, w[D_BETA], w[D_BETA], B * HV, err));
    /* one step of the recurrence, then the per-head norm, the output gate and o_proj */
    K3RT_TRY(K->recur(m, s, B, c->S, w[D_N0], w[D_N1], w[D_N2], w[D_G], w[D_BETA], w[D_O],
                      w[D_SCRATCH], err));
    K3RT_TRY(k3rt_rmsnorm_fwd(s, m->dtype, w[D_O], P[KDA_NORM], w[D_ON], NULL, B * HV,
                              m->dim_v, m->norm_eps, err));
    if (m->rg) {
        K3RT_TRY(lin(m, s, x, P[KDA_GA], w[D_GA], B, d, m->rg, err));
        K3RT_TRY(lin(m, s, w[D_GA], P[KDA_GB], w[D_GATE], B, m->rg, Dv, err));
    } else {
        K3RT_TRY(lin(m, s, x, P[KDA_G], w[D_GATE], B, d, Dv, err));
    }
    K3RT_TRY(K->ogate(m, s, B * Dv, w[D_ON], w[D_GATE], w[D_YG], err));
    return lin(m, s, w[D_YG], P[KDA_O], a->y.data, B, Dv, d, err);
}
