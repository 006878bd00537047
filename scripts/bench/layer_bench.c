/* One plugin's whole layer on CUDA (an attention or an FFN), timed as a run drives it (through
 * the host's rig): forward, and forward + backward, CUDA events around each call, the median of
 * --runs after --warmup. scripts/bench/kda_gpu.py --layer runs it next to fla's
 * KimiDeltaAttention, scripts/bench/moe_layer.py next to a PyTorch LatentMoE.
 *
 *   bench_layer --plugin PATH --config JSON --batch B --seq T --d-model D
 *               [--dtype bf16|f32] [--runs N] [--warmup N] [--skew A]
 *
 * --skew A (a routed FFN of E experts): the selection bias -A ln(1 + e) for expert e, so that
 * routing favours low ids (A = 0: none); the routing counts of the last forward are reported
 * as max_over_mean (0 for a layer without routed experts).
 * Prints one JSON object: {"fwd_ms": .., "fwdbwd_ms": .., "saved_bytes": .., "workspace_bytes": ..}.
 * Parameters are drawn by their declared init (as a run starts); x and dy ~ N(0, 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <jansson.h>
#include <k3rt/host.h>

#include "plugin/registry.h"
#include "plugin/rig.h"

#define CHECK(call)                                                                             \
    do {                                                                                        \
        int rc_ = (call);                                                                       \
        if (rc_) {                                                                              \
            fprintf(stderr, "bench_layer: %s: %s\n", #call, err.msg);                       \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)
#define CU(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "bench_layer: %s: %s\n", #call, cudaGetErrorString(e_));        \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* n values ~ N(0, 1) as dtype on device 0. */
static void *randn_dev(k3rt_stream *s, int dtype, int64_t n, k3rt_rng *rng, k3rt_error *err)
{
    double *h = malloc((size_t)n * sizeof *h);
    void *c = malloc((size_t)n * k3rt_dtype_size(dtype));
    void *d = k3rt_alloc(0, (size_t)n * k3rt_dtype_size(dtype), err);
    if (!h || !c || !d)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        h[i] = k3rt_rng_normal(rng);
    k3rt_convert(c, dtype, h, K3RT_F64, n, err);
    k3rt_memcpy(s, d, 0, c, K3RT_DEVICE_CPU, (size_t)n * k3rt_dtype_size(dtype), err);
    k3rt_stream_sync(s, err);
    free(h), free(c);
    return d;
}

int main(int argc, char **argv)
{
    const char *plugin = NULL, *config = "{}", *dname = "bf16";
    int64_t B = 1, T = 4096, d = 1024;
    int runs = 20, warmup = 3;
    double skew = 0.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--plugin")) plugin = v;
        else if (!strcmp(k, "--config")) config = v;
        else if (!strcmp(k, "--batch")) B = atoll(v);
        else if (!strcmp(k, "--seq")) T = atoll(v);
        else if (!strcmp(k, "--d-model")) d = atoll(v);
        else if (!strcmp(k, "--dtype")) dname = v;
        else if (!strcmp(k, "--runs")) runs = atoi(v);
        else if (!strcmp(k, "--warmup")) warmup = atoi(v);
        else if (!strcmp(k, "--skew")) skew = atof(v);
        else {
            fprintf(stderr, "bench_layer: unknown argument %s\n", k);
            return 2;
        }
    }
    if (!plugin || runs < 1 || runs > 1000) {
        fprintf(stderr, "usage: bench_layer --plugin PATH --config JSON --batch B --seq T "
                        "--d-model D [--dtype bf16|f32] [--runs N] [--warmup N] [--skew A]\n");
        return 2;
    }
    int dtype = !strcmp(dname, "f32") ? K3RT_F32 : K3RT_BF16;
    k3rt_error err = {0};
    registry reg;
    memset(&reg, 0, sizeof reg);
    const plugin_entry *e;
    CHECK(registry_load_file(&reg, plugin, &e, &err));
    k3rt_stream *s;
    CHECK(k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &s, &err));
    json_error_t je;
    json_t *cfg = json_loads(config, 0, &je);
    if (!cfg) {
        fprintf(stderr, "bench_layer: --config: %s\n", je.text);
        return 2;
    }
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = 0, a.d_model = d, a.vocab = 32, a.n_layers = 1, a.stream = s;
    a.seed = 1, a.deterministic = 1;
    rig r;
    CHECK(rig_create(&r, e, cfg, &a, "bench", &err));
    CHECK(rig_alloc_params(&r, &err));
    for (int i = 0; i < rig_n_params(&r); i++) { /* the declared init, as a run starts */
        const k3rt_param_decl *p = rig_param(&r, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F32, K3RT_DEVICE_CPU, p->ndim, p->shape[0],
                                         p->shape[1], p->shape[2], p->shape[3]);
        int64_t n = k3rt_tensor_numel(&t);
        float *h = malloc((size_t)n * sizeof *h);
        void *c = malloc((size_t)n * k3rt_dtype_size(dtype));
        t.data = h;
        CHECK(rig_init_param(&r, i, t, 1, p->name, &err));
        CHECK(k3rt_convert(c, dtype, h, K3RT_F32, n, &err));
        CHECK(k3rt_memcpy(s, r.params[i].data, 0, c, K3RT_DEVICE_CPU,
                          (size_t)n * k3rt_dtype_size(dtype), &err));
        CHECK(k3rt_stream_sync(s, &err));
        free(h), free(c);
    }
    CHECK(rig_alloc_shape(&r, B, T, 0, &err));
    int64_t saved = 0;
    CHECK(rig_saved_total(&r, B, T, &saved, &err));
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 3, 4);
    int64_t n = B * T * d;
    void *x = randn_dev(s, dtype, n, &rng, &err), *dy = randn_dev(s, dtype, n, &rng, &err);
    void *y = k3rt_alloc(0, (size_t)n * k3rt_dtype_size(dtype), &err);
    void *dx = k3rt_alloc(0, (size_t)n * k3rt_dtype_size(dtype), &err);
    if (!x || !dy || !y || !dx) {
        fprintf(stderr, "bench_layer: out of device memory: %s\n", err.msg);
        return 1;
    }
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.training = 1;
    f.x = k3rt_tensor_view(x, dtype, 0, 3, B, T, d, 0);
    f.y = k3rt_tensor_view(y, dtype, 0, 3, B, T, d, 0);
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.x = f.x;
    b.dy = k3rt_tensor_view(dy, dtype, 0, 3, B, T, d, 0);
    b.dx = k3rt_tensor_view(dx, dtype, 0, 3, B, T, d, 0);
    /* a routed FFN: the bias that skews its selection, and the counts it reports */
    const int64_t E = r.experts;
    if (skew != 0.0 && E == 0) {
        fprintf(stderr, "bench_layer: --skew needs a routed FFN; %s has no routed experts\n",
                plugin);
        return 2;
    }
    k3rt_routing routing;
    memset(&routing, 0, sizeof routing);
    void *db = NULL;
    if (E > 0) {
        float *hb = malloc((size_t)E * sizeof *hb);
        db = k3rt_alloc(0, (size_t)E * sizeof *hb, &err);
        if (!hb || !db) {
            fprintf(stderr, "bench_layer: out of memory for the bias: %s\n", err.msg);
            return 1;
        }
        for (int64_t i = 0; i < E; i++)
            hb[i] = (float)(-skew * log1p((double)i));
        CHECK(k3rt_memcpy(s, db, 0, hb, K3RT_DEVICE_CPU, (size_t)E * sizeof *hb, &err));
        CHECK(k3rt_stream_sync(s, &err));
        free(hb);
        f.bias = k3rt_tensor_view(db, K3RT_F32, 0, 1, E, 0, 0, 0);
        f.routing = &routing;
    }
    cudaStream_t st = k3rt_stream_native(s);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double *t_f = malloc((size_t)runs * sizeof *t_f), *t_fb = malloc((size_t)runs * sizeof *t_fb);
    for (int pass = 0; pass < 2; pass++) /* 0: forward, 1: forward + backward */
        for (int it = -warmup; it < runs; it++) {
            CU(cudaEventRecord(e0, st));
            CHECK(rig_forward(&r, &f, &err));
            if (pass)
                CHECK(rig_backward(&r, &b, &err));
            CU(cudaEventRecord(e1, st));
            CU(cudaEventSynchronize(e1));
            float ms;
            CU(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= 0)
                (pass ? t_fb : t_f)[it] = ms;
        }
    qsort(t_f, (size_t)runs, sizeof *t_f, cmp);
    qsort(t_fb, (size_t)runs, sizeof *t_fb, cmp);
    double max_over_mean = 0.0;
    if (E > 0 && routing.counts.ndim == 1) {
        int64_t *counts = malloc((size_t)E * sizeof *counts), total = 0, most = 0;
        CHECK(k3rt_memcpy(s, counts, K3RT_DEVICE_CPU, routing.counts.data, 0,
                          (size_t)E * sizeof *counts, &err));
        CHECK(k3rt_stream_sync(s, &err));
        for (int64_t i = 0; i < E; i++)
            total += counts[i], most = counts[i] > most ? counts[i] : most;
        max_over_mean = total > 0 ? (double)most * (double)E / (double)total : 0.0;
        free(counts);
    }
    k3rt_flops fl;
    CHECK(rig_flops(&r, B, T, &fl, &err));
    printf("{\"fwd_ms\": %.4f, \"fwdbwd_ms\": %.4f, \"fwd_min_ms\": %.4f, \"fwdbwd_min_ms\": "
           "%.4f, \"flops_fwd\": %.6g, \"flops_bwd\": %.6g, \"saved_bytes\": %lld, "
           "\"workspace_bytes\": %lld, \"max_over_mean\": %.4f}\n",
           t_f[runs / 2], t_fb[runs / 2], t_f[0], t_fb[0], fl.forward, fl.backward,
           (long long)saved, (long long)r.mem.workspace_bytes, max_over_mean);
    free(t_f), free(t_fb);
    k3rt_free(0, x), k3rt_free(0, dy), k3rt_free(0, y), k3rt_free(0, dx);
    if (db)
        k3rt_free(0, db);
    rig_destroy(&r);
    json_decref(cfg);
    k3rt_stream_destroy(s);
    return 0;
}
