/* Incremental decoding against the full forward, shared by tests/unit/test_decode.c (CPU) and
 * tests/gpu/test_decode_cuda.c: a model of tiny.lua's shape at toy sizes (three KDA layers and
 * an MLA layer, a dense SiTU-GLU first layer, LatentMoE with Quantile Balancing after it, Block
 * AttnRes over blocks of two layers), its norm gains and vector parameters moved off their
 * initial values (AttnRes queries start at zero, norms at one: a test would not see them), the
 * logits of every position from the full forward, and the same from decode steps over an
 * activation arena poisoned with NaN bytes. */
#ifndef K3RT_TEST_DECODE_KIT_H
#define K3RT_TEST_DECODE_KIT_H

#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "testutil/testutil.h"

/* kda_dim: KDA's head width (CUDA takes 32, 64, 128); kda_extra / mla_extra: further config
 * keys (a leading comma each, or ""). */
static inline json_t *dk_model_doc(int kda_dim, const char *kda_extra, const char *mla_extra)
{
    char text[4096];
    snprintf(text, sizeof text,
             "{\"d_model\": 32, \"vocab\": 256, \"layers\": 4, \"pattern\": \"KKKM\","
             " \"norm_eps\": 1e-5, \"init_std\": 0.1, \"dense_layers\": 1,"
             " \"mixers\": {"
             "  \"K\": {\"plugin\": \"kda\", \"kind\": \"attention\", \"path\": null,"
             "         \"config\": {\"heads\": 2, \"head_dim\": %d, \"lower_bound\": -5,"
             "                      \"chunk_size\": 4, \"init_std\": 0.2%s}},"
             "  \"M\": {\"plugin\": \"mla\", \"kind\": \"attention\", \"path\": null,"
             "         \"config\": {\"heads\": 2, \"kv_rank\": 16, \"qk_nope_dim\": 8,"
             "                      \"qk_shared_dim\": 4, \"v_dim\": 8, \"output_gate\": true,"
             "                      \"init_std\": 0.2%s}}},"
             " \"dense_ffn\": {\"plugin\": \"dense_glu\", \"kind\": \"moe\", \"path\": null,"
             "   \"config\": {\"hidden\": 48, \"act\": \"situ\", \"init_std\": 0.2}},"
             " \"ffn\": {\"plugin\": \"latent_moe\", \"kind\": \"moe\", \"path\": null,"
             "   \"config\": {\"experts\": 4, \"top_k\": 2, \"latent\": 16, \"expert_hidden\": 24,"
             "               \"shared\": 1, \"shared_hidden\": 32, \"act\": \"situ\","
             "               \"init_std\": 0.2}},"
             " \"balancer\": {\"plugin\": \"quantile\", \"kind\": \"balancer\", \"path\": null,"
             "   \"config\": {}},"
             " \"residual\": {\"plugin\": \"block_attnres\", \"kind\": \"residual\","
             "   \"path\": null, \"config\": {\"block_layers\": 2}}}",
             kda_dim, kda_extra, mla_extra);
    json_error_t je;
    json_t *doc = json_loads(text, 0, &je);
    ck_assert_msg(doc != NULL, "model document: %s", je.text);
    return doc;
}

/* 1 when the plugins of dk_model_doc are built (a build may leave some out). */
static inline int dk_have_plugins(registry *reg)
{
    static const char *const names[] = {"kda", "mla", "dense_glu", "latent_moe", "quantile",
                                        "block_attnres"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!registry_find(reg, names[i], 0))
            return 0;
    return 1;
}

/* Moves every norm gain and vector parameter by N(0, 0.2^2) (the same numbers for the same
 * seed on any device and dtype), then refreshes the compute copies. */
static inline void dk_perturb(model *m, uint64_t seed)
{
    k3rt_error err = {0};
    for (int i = 0; i < m->n_params; i++) {
        param_slot *p = &m->params[i];
        if (p->decl.role != K3RT_ROLE_NORM_GAIN && p->decl.role != K3RT_ROLE_VECTOR)
            continue;
        size_t es = k3rt_dtype_size(p->master.dtype), bytes = (size_t)p->numel * es;
        void *host = malloc(bytes);
        double *v = malloc((size_t)p->numel * sizeof *v);
        ck_assert(host && v);
        TU_OK(k3rt_memcpy(m->opt.stream, host, K3RT_DEVICE_CPU, p->master.data, p->master.device,
                          bytes, &err), err);
        TU_OK(k3rt_stream_sync(m->opt.stream, &err), err);
        TU_OK(k3rt_convert(v, K3RT_F64, host, p->master.dtype, p->numel, &err), err);
        k3rt_rng rng;
        k3rt_rng_seed(&rng, seed, (uint64_t)i);
        for (int64_t k = 0; k < p->numel; k++)
            v[k] += 0.2 * k3rt_rng_normal(&rng);
        TU_OK(k3rt_convert(host, p->master.dtype, v, K3RT_F64, p->numel, &err), err);
        TU_OK(k3rt_memcpy(m->opt.stream, p->master.data, p->master.device, host, K3RT_DEVICE_CPU,
                          bytes, &err), err);
        TU_OK(k3rt_stream_sync(m->opt.stream, &err), err);
        free(host);
        free(v);
    }
    TU_OK(model_sync_compute(m, &err), err);
}

static inline void dk_build(model *m, registry *reg, const json_t *doc, k3rt_stream *s, int dtype,
                     int device)
{
    k3rt_error err = {0};
    model_options o = {dtype, device, s, NULL, 11, 0, NULL, NULL};
    TU_OK(model_build(m, doc, reg, &o, &err), err);
    dk_perturb(m, 5);
}

/* tokens [B, T]: a byte sequence per row that is not periodic. */
static inline void dk_tokens(int32_t *tok, int64_t B, int64_t T)
{
    for (int64_t i = 0; i < B * T; i++)
        tok[i] = (int32_t)((i * 37 + (i * i) % 11 + 5) % 256);
}

/* logits [T][B][V] of every position from full forwards over the B x T tokens. */
static inline void dk_full_logits(model *m, const int32_t *tok, int64_t B, int64_t T, double *logits)
{
    k3rt_error err = {0};
    TU_OK(model_set_shape(m, B, T, &err), err);
    for (int64_t t = 0; t < T; t++)
        TU_OK(model_logits_at(m, tok, t, logits + t * B * m->vocab, &err), err);
}

/* The same from T decode steps, each position's logits after feeding its token. */
static inline void dk_decode_logits(model *m, const int32_t *tok, int64_t B, int64_t T, double *logits)
{
    k3rt_error err = {0};
    int32_t *step = malloc((size_t)B * sizeof *step);
    ck_assert_ptr_nonnull(step);
    /* a small capacity hint, so a growing cache grows while the test runs */
    TU_OK(model_decode_begin(m, B, 2, &err), err);
    /* NaN bytes over the activations: a step must write whatever it reads */
    TU_OK(k3rt_memset(m->opt.stream, m->act, m->opt.device, 0xff, m->act_bytes, &err), err);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t b = 0; b < B; b++)
            step[b] = tok[b * T + t];
        TU_OK(model_decode_step(m, step, logits + t * B * m->vocab, &err), err);
    }
    ck_assert_int_eq(model_decode_pos(m), T);
    model_decode_end(m);
    free(step);
}

/* The worst over positions and rows of rms(ref - x) / rms(ref) of one logits vector. */
static inline double dk_worst(const double *ref, const double *x, int64_t rows, int64_t V,
                       int64_t *where)
{
    double worst = 0;
    *where = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e = tu_rel_rms(ref + r * V, x + r * V, V);
        if (!(e <= worst)) { /* NaN counts as worst */
            worst = e;
            *where = r;
        }
    }
    return worst;
}

#endif
