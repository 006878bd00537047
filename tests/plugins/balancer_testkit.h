/* Shared pieces of the balancer suites (test_quantile.c, test_balancers.c): loading a balancer,
 * one instance per (simulated) MoE layer and rank, and synthetic routing — sigmoid scores of a
 * router with fixed per-expert offsets on fresh random tokens, selected as the MoE does (top-k
 * of score + bias, ties to the lower id). */
#ifndef K3RT_TEST_BALANCER_TESTKIT_H
#define K3RT_TEST_BALANCER_TESTKIT_H

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "comm/comm_impl.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

static registry bk_reg;

static inline const plugin_entry *bk_plugin(const char *name)
{
    static int ready;
    k3rt_error err = {0};
    if (!ready) {
        TU_OK(registry_init(&bk_reg, NULL, &err), err);
        ready = 1;
    }
    const plugin_entry *e = registry_find(&bk_reg, name, K3RT_KIND_BALANCER);
    if (e)
        return e;
    char path[512];
    snprintf(path, sizeof path, "%s/libk3rt_%s.so", K3RT_PLUGIN_DIR, name);
    TU_OK(registry_load_file(&bk_reg, path, &e, &err), err);
    return e;
}

static inline int bk_create(rig *m, const char *name, const char *cfg_text, int E, int k,
                     k3rt_comm *comm, k3rt_stream *s, k3rt_error *err)
{
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = 16;
    a.n_layers = 1;
    a.n_experts = E;
    a.top_k = k;
    a.comm = comm;
    a.stream = s;
    int rc = rig_create(m, bk_plugin(name), cfg, &a, "layers.0.balancer", err);
    json_decref(cfg);
    return rc;
}

static inline const float *bk_bias(rig *m)
{
    k3rt_tensor t;
    k3rt_error err = {0};
    TU_OK(rig_bias(m, &t, &err), err);
    return t.data;
}

/* The live bias through state() ("bias"), for tests that set a starting bias. */
static inline float *bk_state_bias(rig *m)
{
    struct k3rt_tensor_sink sink;
    k3rt_error err = {0};
    TU_OK(rig_state(m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 1);
    ck_assert_str_eq(sink.items[0].name, "bias");
    float *b = sink.items[0].t.data;
    tensor_sink_free(&sink);
    return b;
}

/* One micro-batch of routing owned by the test. */
typedef struct bk_batch {
    int64_t B, T, N;
    int E, k;
    float *scores;
    int32_t *sel;
    int64_t counts[256];
    k3rt_routing r;
} bk_batch;

static inline void bk_batch_alloc(bk_batch *b, int64_t B, int64_t T, int E, int k)
{
    memset(b, 0, sizeof *b);
    ck_assert_int_le(E, 256);
    b->B = B, b->T = T, b->N = B * T, b->E = E, b->k = k;
    b->scores = malloc((size_t)(b->N * E) * sizeof(float));
    b->sel = malloc((size_t)(b->N * k) * sizeof(int32_t));
}

static inline void bk_batch_free(bk_batch *b)
{
    free(b->scores), free(b->sel);
}

/* scores = sigmoid(offset_e + noise * N(0, 1)) */
static inline void bk_scores(bk_batch *b, const double *offset, double noise, k3rt_rng *rng)
{
    for (int64_t t = 0; t < b->N; t++)
        for (int e = 0; e < b->E; e++)
            b->scores[t * b->E + e] =
                (float)(1.0 / (1.0 + exp(-(offset[e] + noise * k3rt_rng_normal(rng)))));
}

/* Top-k of score + bias in float, as the f32 MoE computes it; fills sel, counts, routing. */
static inline void bk_route(bk_batch *b, const float *bias)
{
    memset(b->counts, 0, sizeof b->counts);
    for (int64_t t = 0; t < b->N; t++) {
        const float *s = b->scores + t * b->E;
        int32_t *sel = b->sel + t * b->k;
        int n = 0;
        for (int e = 0; e < b->E; e++) {
            float v = s[e] + bias[e];
            int beaten = 0;
            for (int j = 0; j < b->E; j++) {
                float vj = s[j] + bias[j];
                beaten += vj > v || (vj == v && j < e);
            }
            if (beaten < b->k)
                sel[n++] = e;
        }
        ck_assert_int_eq(n, b->k);
        for (int j = 0; j < b->k; j++)
            b->counts[sel[j]]++;
    }
    memset(&b->r, 0, sizeof b->r);
    b->r.struct_size = sizeof b->r;
    b->r.batch = b->B, b->r.seq = b->T;
    b->r.experts = b->E, b->r.top_k = b->k;
    b->r.scores = k3rt_tensor_view(b->scores, K3RT_F32, K3RT_DEVICE_CPU, 2, b->N, b->E, 0, 0);
    b->r.selected = k3rt_tensor_view(b->sel, K3RT_I32, K3RT_DEVICE_CPU, 2, b->N, b->k, 0, 0);
    b->r.counts = k3rt_tensor_view(b->counts, K3RT_I64, K3RT_DEVICE_CPU, 1, b->E, 0, 0, 0);
    b->r.bias = k3rt_tensor_view((void *)bias, K3RT_F32, K3RT_DEVICE_CPU, 1, b->E, 0, 0, 0);
}

/* A view of tokens [t0, t0 + n) of a batch of single-token sequences. */
static inline k3rt_routing bk_slice(const bk_batch *b, int64_t t0, int64_t n)
{
    k3rt_routing r = b->r;
    r.batch = n, r.seq = 1;
    r.scores.data = b->scores + t0 * b->E, r.scores.shape[0] = n;
    r.selected.data = b->sel + t0 * b->k, r.selected.shape[0] = n;
    return r;
}

static inline void bk_observe(rig *m, const k3rt_routing *r)
{
    k3rt_error err = {0};
    TU_OK(rig_observe(m, r, &err), err);
}

static inline void bk_update(rig *m, k3rt_comm *dp, int64_t step)
{
    k3rt_error err = {0};
    TU_OK(rig_update(m, dp, step, &err), err);
}

/* A one-token routing that carries just these counts (what aux_free reads): scores zero,
 * experts 0 .. k-1 selected. sel and scores hold k and E entries. */
static inline k3rt_routing bk_counts_routing(const int64_t *counts, int E, int k, int32_t *sel,
                                             float *scores)
{
    k3rt_routing r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.batch = 1, r.seq = 1, r.experts = E, r.top_k = k;
    for (int j = 0; j < k; j++)
        sel[j] = j;
    memset(scores, 0, (size_t)E * sizeof *scores);
    r.scores = k3rt_tensor_view(scores, K3RT_F32, K3RT_DEVICE_CPU, 2, 1, E, 0, 0);
    r.selected = k3rt_tensor_view(sel, K3RT_I32, K3RT_DEVICE_CPU, 2, 1, k, 0, 0);
    r.counts = k3rt_tensor_view((void *)counts, K3RT_I64, K3RT_DEVICE_CPU, 1, E, 0, 0, 0);
    return r;
}

/* (max load - mean load) / mean load */
static inline double bk_maxvio(const int64_t *counts, int E)
{
    int64_t hi = 0, total = 0;
    for (int e = 0; e < E; e++) {
        hi = counts[e] > hi ? counts[e] : hi;
        total += counts[e];
    }
    double mean = (double)total / E;
    return (double)hi / mean - 1.0;
}

/* Runs fn(rank, arg) on `ranks` threads and joins them. */
typedef void *(*bk_rank_fn)(void *);
static inline void bk_threads(int ranks, bk_rank_fn fn, void *args, size_t arg_size)
{
    pthread_t th[8];
    for (int r = 0; r < ranks; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, fn, (char *)args + r * arg_size), 0);
    for (int r = 0; r < ranks; r++)
        pthread_join(th[r], NULL);
}

#endif
