/* check-plugin: an attention plugin's incremental decoding against its own forward. T decode
 * steps of one token each, from an empty cache with room for one token (so a cache that grows
 * must grow), give the forward's y over the whole sequence at every position: on the CPU in
 * the plugin's most exact dtype, and with CUDA, decoding on device 0 against the CPU forward
 * in f32. Plugins that decode through the ABI 2.0 decode() are checked the same way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check_mix.h"

/* y of T decode steps over r's x, into host `out` [B, T, d] of r's dtype. */
static int decode_all(mix_run *r, void *out, k3rt_error *err)
{
    rig *m = &r->mod.m;
    k3rt_stream *s = r->mod.s;
    const size_t es = k3rt_dtype_size(r->dtype), row = (size_t)r->d * es;
    const int64_t B = r->B, T = r->T;
    if (!m->e->vt.attention.decode_step) {  /* decode() runs on buffers bound at (B, 1) */
        rig_unbind_shape(m);
        K3RT_TRY(rig_alloc_shape(m, B, 1, 0, err));
    }
    void *x = malloc((size_t)r->n * es), *xt = k3rt_alloc(r->device, (size_t)B * row, err);
    void *yt = xt ? k3rt_alloc(r->device, (size_t)B * row, err) : NULL;
    rig_cache cache;
    memset(&cache, 0, sizeof cache);
    int rc = x && yt ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = ck_copy(s, x, K3RT_DEVICE_CPU, r->x, r->device, (size_t)r->n * es, err);
    if (!rc)
        rc = rig_cache_create(m, B, 1, &cache, err);
    for (int64_t t = 0; !rc && t < T; t++) {
        for (int64_t b = 0; !rc && b < B; b++)
            rc = ck_copy(s, (char *)xt + b * row, r->device, (char *)x + (b * T + t) * row,
                         K3RT_DEVICE_CPU, row, err);
        if (!rc)  /* NaN bytes: every element of y must be written */
            rc = k3rt_memset(s, yt, r->device, 0xff, (size_t)B * row, err);
        k3rt_tensor tx = k3rt_tensor_view(xt, r->dtype, r->device, 3, B, 1, r->d, 0);
        k3rt_tensor ty = k3rt_tensor_view(yt, r->dtype, r->device, 3, B, 1, r->d, 0);
        if (!rc)
            rc = rig_decode_step(m, &cache, tx, ty, err);
        for (int64_t b = 0; !rc && b < B; b++)
            rc = ck_copy(s, (char *)out + (b * T + t) * row, K3RT_DEVICE_CPU,
                         (char *)yt + b * row, r->device, row, err);
    }
    rig_cache_destroy(m, &cache);
    free(x);
    k3rt_free(r->device, xt);
    k3rt_free(r->device, yt);
    return rc;
}

/* The worst over positions t of rms(want - got) / rms(want) across the B rows at t. */
static double worst_position(const void *want, const void *got, int dtype, int64_t B,
                             int64_t T, int64_t d, int64_t *at)
{
    double worst = 0;
    *at = 0;
    for (int64_t t = 0; t < T; t++) {
        double num = 0, den = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < d; j++) {
                int64_t i = (b * T + t) * d + j;
                double w = ck_get(want, dtype, i), g = ck_get(got, dtype, i);
                num += (w - g) * (w - g);
                den += w * w;
            }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (!(e <= worst)) /* NaN counts as worst */
            worst = e, *at = t;
    }
    return worst;
}

/* Decodes on `device` in `dtype` against the forward of a CPU instance of the same dtype
 * (both from the check's seed: the same parameters and inputs). */
static void run_check(check_ctx *c, const char *name, int dtype, int device, double tol)
{
    mix_run f = {0}, g = {0};
    k3rt_error err = {0};
    size_t bytes = (size_t)(c->B * c->T * c->d) * k3rt_dtype_size(dtype);
    void *want = malloc(bytes), *got = malloc(bytes);
    int rc = want && got ? K3RT_OK : k3rt_fail(&err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = mix_open(c, dtype, K3RT_DEVICE_CPU, &f, &err);
    if (!rc) {
        f.use_state = 0;  /* the sequence starts from nothing, as the cache does */
        rc = mix_forward(&f, 0, &err);
    }
    if (!rc)
        rc = ck_copy(f.mod.s, want, K3RT_DEVICE_CPU, f.y, f.device, bytes, &err);
    if (!rc)
        rc = mix_open(c, dtype, device, &g, &err);
    if (!rc)
        rc = decode_all(&g, got, &err);
    if (rc) {
        ck_error(c, name, &err);
    } else {
        int64_t at;
        double worst = worst_position(want, got, dtype, c->B, c->T, c->d, &at);
        ck_report(c, worst <= tol ? CK_PASS : CK_FAIL, name,
                  "%s%s: %lld steps of one token through %s from an empty cache: worst "
                  "relative rms against forward's y %.2e at position %lld (tolerance %.0e)",
                  k3rt_dtype_name(dtype), device == K3RT_DEVICE_CPU ? "" : " on CUDA device 0",
                  (long long)c->T,
                  c->e->vt.attention.decode_step ? "decode_step" : "decode() and its state",
                  worst, (long long)at, tol);
    }
    free(want), free(got);
    mix_close(&f);
    mix_close(&g);
}

void ck_decode(check_ctx *c)
{
    int dtypes[2];
    if (c->e->desc.kind != K3RT_KIND_ATTENTION || !ck_cpu_dtypes(c, dtypes))
        return;
    const k3rt_attention_vtable *v = &c->e->vt.attention;
    if (!v->decode_step && !v->decode) {
        ck_report(c, CK_SKIP, "decode", "no incremental decoding (decode_step): sampling runs "
                  "the forward over the whole context for every token");
        return;
    }
    run_check(c, "decode", dtypes[0], K3RT_DEVICE_CPU, dtypes[0] == K3RT_F64 ? 1e-9 : 1e-4);
}

void ck_decode_cuda(check_ctx *c)
{
    const k3rt_attention_vtable *v = &c->e->vt.attention;
    if (c->e->desc.kind != K3RT_KIND_ATTENTION || (!v->decode_step && !v->decode) ||
        !ck_cuda_ready(c, "decode cuda"))
        return;
    run_check(c, "decode cuda", K3RT_F32, 0, c->cuda_tol);
}
