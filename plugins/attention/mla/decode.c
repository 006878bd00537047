/* MLA's incremental decoding (ABI 2.2 cache_create / decode_step / cache_destroy) in the
 * decode-absorbed form of mla.h's mla_cache: per token the queries, the latent ĉ and the shared
 * key kr are projected as in the forward; (ĉ, kr) is appended to the cache (dc + dr values per
 * position and layer, instead of H (dn + dr + dv) for keys and values); W_kb is folded into
 * the query and W_vb applied after the attention, so no per-head key or value is ever formed.
 * The cache grows with the sequence (doubling), without limit. Projections, norms and the
 * per-head products are the shared ops; attention and gate are mla_dec_kernels (CPU:
 * cpu_decode.inc.c in f32 or f64; CUDA: cuda_decode.c). */
#include <stdlib.h>
#include <string.h>

#include "mla.h"

/* One step's buffers in the cache's workspace, byte offsets (B sequences). */
enum { D_QA, D_QAN, D_QN, D_QR, D_C, D_KR, D_CHAT, D_QABS, D_CTX, D_O, D_Z, D_OG, D_N };

static int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }

static int64_t dec_layout(const mla *m, int64_t B, int64_t off[D_N])
{
    int64_t H = m->H;
    const int64_t width[D_N] = {m->rq, m->rq, H * m->dn, H * m->dr, m->dc, m->dr, m->dc,
                                H * m->dc, H * m->dc, H * m->dv, H * m->dv, H * m->dv};
    int64_t es = (int64_t)k3rt_dtype_size(m->dtype), at = 0;
    for (int i = 0; i < D_N; i++) {
        off[i] = at;
        at += up64(B * width[i] * es);
    }
    return at;
}

static const mla_dec_kernels *kernels(const mla *m)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (m->device != K3RT_DEVICE_CPU)
        return &mla_dec_cuda;
#endif
    return m->dtype == K3RT_F64 ? &mla_dec_cpu_f64 : &mla_dec_cpu_f32;
}

/* Bytes of a score element: REAL on the CPU, f32 on CUDA. */
static size_t score_size(const mla *m)
{
    return m->device == K3RT_DEVICE_CPU ? k3rt_dtype_size(m->dtype) : 4;
}

void mla_cache_destroy(void *self, void *cache)
{
    const mla *m = self;
    mla_cache *c = cache;
    if (!c)
        return;
    k3rt_free(m->device, c->kv);
    k3rt_free(m->device, c->scores);
    k3rt_free(m->device, c->ws);
    free(c);
}

/* Room for cap positions per sequence, the first `keep` of each copied over. */
static int reserve(const mla *m, k3rt_stream *s, mla_cache *c, int64_t cap, int64_t keep,
                   k3rt_error *err)
{
    size_t row = (size_t)(m->dc + m->dr) * k3rt_dtype_size(m->dtype);
    void *kv = k3rt_alloc(m->device, (size_t)(c->B * cap) * row, err);
    void *sc = kv ? k3rt_alloc(m->device, (size_t)(c->B * m->H * cap) * score_size(m), err)
                  : NULL;
    int rc = sc ? K3RT_OK : err && err->code ? err->code : K3RT_ERR_NOMEM;
    for (int64_t b = 0; !rc && keep && b < c->B; b++)
        rc = k3rt_memcpy(s, (char *)kv + (size_t)(b * cap) * row, m->device,
                         (char *)c->kv + (size_t)(b * c->cap) * row, m->device,
                         (size_t)keep * row, err);
    if (!rc && keep)
        rc = k3rt_stream_sync(s, err); /* the old cache is freed next */
    if (rc) {
        k3rt_free(m->device, kv);
        k3rt_free(m->device, sc);
        return rc;
    }
    k3rt_free(m->device, c->kv);
    k3rt_free(m->device, c->scores);
    c->kv = kv, c->scores = sc, c->cap = cap;
    return K3RT_OK;
}

int mla_cache_create(void *self, const k3rt_cache_args *a, void **cache, k3rt_error *err)
{
    const mla *m = self;
    int64_t off[D_N];
    mla_cache *c = calloc(1, sizeof *c);
    if (!c)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "mla: out of memory");
    c->B = a->batch;
    int rc = reserve(m, a->stream, c, a->capacity, 0, err);
    if (!rc && !(c->ws = k3rt_alloc(m->device, (size_t)dec_layout(m, c->B, off), err)))
        rc = err && err->code ? err->code : K3RT_ERR_NOMEM;
    if (rc) {
        mla_cache_destroy(self, c);
        return rc;
    }
    *cache = c;
    return K3RT_OK;
}

static int lin(const mla *m, k3rt_stream *s, const void *x, const void *w, void *y, int64_t n,
               int64_t in, int64_t out, k3rt_error *err)
{
    return k3rt_linear_fwd(s, m->dtype, x, w, NULL, y, n, in, out, err);
}

int mla_decode_step(void *self, void *cache, const k3rt_decode_args *a, k3rt_error *err)
{
    const mla *m = self;
    mla_cache *c = cache;
    const mla_dec_kernels *K = kernels(m);
    k3rt_stream *s = a->stream;
    const int dt = m->dtype;
    const size_t es = k3rt_dtype_size(dt);
    const int64_t B = a->batch, pos = a->pos, d = m->d, H = m->H, w = m->dc + m->dr;
    const int64_t dn = m->dn, dr = m->dr, dv = m->dv, dc = m->dc, rq = m->rq;
    const void *W[MLA_N_SLOTS];
    for (int i = 0; i < MLA_N_SLOTS; i++)
        W[i] = m->slot[i] >= 0 ? a->params[m->slot[i]].data : NULL;
    int64_t off[D_N];
    dec_layout(m, B, off);
    void *t[D_N];
    for (int i = 0; i < D_N; i++)
        t[i] = (char *)c->ws + off[i];
    const void *x = a->x.data;
    if (pos >= c->cap)
        K3RT_TRY(reserve(m, s, c, 2 * c->cap > pos + 1 ? 2 * c->cap : pos + 1, pos, err));

    /* queries, as the forward: qin = RMSNorm(x Wqa^T) (rq > 0) or x */
    const void *qin = x;
    int64_t din = d;
    if (rq) {
        K3RT_TRY(lin(m, s, x, W[MLA_Q_A], t[D_QA], B, d, rq, err));
        K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, t[D_QA], W[MLA_Q_A_NORM], t[D_QAN], NULL, B, rq,
                                  m->eps, err));
        qin = t[D_QAN], din = rq;
    }
    K3RT_TRY(lin(m, s, qin, W[MLA_Q_NOPE], t[D_QN], B, din, H * dn, err));
    if (dr)
        K3RT_TRY(lin(m, s, qin, W[MLA_Q_SHARED], t[D_QR], B, din, H * dr, err));

    /* this token's ĉ and kr into the cache at pos */
    K3RT_TRY(lin(m, s, x, W[MLA_KV_A], t[D_C], B, d, dc, err));
    if (dr)
        K3RT_TRY(lin(m, s, x, (const char *)W[MLA_KV_A] + (size_t)(dc * d) * es, t[D_KR], B, d,
                     dr, err));
    K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, t[D_C], W[MLA_KV_A_NORM], t[D_CHAT], NULL, B, dc, m->eps,
                              err));
    for (int64_t b = 0; b < B; b++) {
        char *row = (char *)c->kv + (size_t)((b * c->cap + pos) * w) * es;
        K3RT_TRY(k3rt_memcpy(s, row, m->device, (char *)t[D_CHAT] + (size_t)(b * dc) * es,
                             m->device, (size_t)dc * es, err));
        if (dr)
            K3RT_TRY(k3rt_memcpy(s, row + (size_t)dc * es, m->device,
                                 (char *)t[D_KR] + (size_t)(b * dr) * es, m->device,
                                 (size_t)dr * es, err));
    }

    /* q_abs[b, h] = W_kb,h^T q_h^n (dn -> dc), per head over the B tokens */
    K3RT_TRY(k3rt_gemm_strided_batched(s, dt, 0, 0, B, dc, dn, 1.0, t[D_QN], H * dn, dn,
                                       W[MLA_K_B], dc, dn * dc, 0.0, t[D_QABS], H * dc, dc, H,
                                       err));
    K3RT_TRY(K->attend(m, s, B, pos + 1, c, t[D_QABS], dr ? t[D_QR] : NULL, t[D_CTX], err));
    /* o[b, h] = W_vb,h ctx[b, h] (dc -> dv) */
    K3RT_TRY(k3rt_gemm_strided_batched(s, dt, 0, 1, B, dv, dc, 1.0, t[D_CTX], H * dc, dc,
                                       W[MLA_V_B], dc, dv * dc, 0.0, t[D_O], H * dv, dv, H,
                                       err));
    const void *og = t[D_O];
    if (m->gate) {
        K3RT_TRY(lin(m, s, x, W[MLA_GATE], t[D_Z], B, d, H * dv, err));
        K3RT_TRY(K->gate(m, s, B * H * dv, t[D_O], t[D_Z], t[D_OG], err));
        og = t[D_OG];
    }
    return lin(m, s, og, W[MLA_O], a->y.data, B, H * dv, d, err);
}
