/* KDA on the CPU: tokens/s and GFLOP/s of the chunked and the recurrent recurrence (forward,
 * and forward + backward) at T = 256 ... 4096, same threads, same BLAS, same inputs. The
 * FLOPs are each algorithm's own count (kda_core_flops), so GFLOP/s compares how well each uses
 * the machine and tokens/s compares the algorithms.
 *
 *   bench_kda_cpu [--threads N] [--batch B] [--heads H] [--dim_k K] [--dim_v V] [--chunk C]
 *                 [--tmax T] [--f64] [--layer] [--only chunked|recurrent] [--cpu-time]
 *
 * --layer times the whole layer (projections, conv, gates, norm) at d_model = heads * dim_k.
 * --cpu-time measures the process's CPU time instead of wall time: on a shared machine it is
 * the steadier basis for comparing variants (tokens per CPU-second; with N threads it sums
 * theirs, so compare at --threads 1).
 * Compiles the plugin's sources in (the plugin exports only its entry point). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <k3rt/host.h>
#include "plugin/options.h"

#include "plugin.c"
#include "layout.c"
#include "cpu.c"
#include "decode.c"

typedef struct bench_cfg {
    int threads, f64, layer, only; /* only: -1 both, else KDA_CHUNKED / KDA_RECURRENT */
    int64_t B, H, dim_k, dim_v, C, tmax;
} bench_cfg;

static int g_cpu_time;

static double now(void)
{
    struct timespec ts;
    clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "bench_kda_cpu: out of memory (%zu x %zu bytes)\n", n, size);
        exit(1);
    }
    return p;
}

static void fill(void *x, int f64, int64_t n, double scale, double shift, k3rt_rng *rng)
{
    for (int64_t i = 0; i < n; i++) {
        double v = shift + scale * k3rt_rng_normal(rng);
        if (f64)
            ((double *)x)[i] = v;
        else
            ((float *)x)[i] = (float)v;
    }
}

#define CHECK(call)                                                                             \
    do {                                                                                        \
        if ((call) != K3RT_OK) {                                                                \
            fprintf(stderr, "bench_kda_cpu: %s failed: %s\n", #call, err.msg);                  \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

/* Best of `reps` timings of the recurrence (forward, then forward + backward). */
static void time_core(const bench_cfg *bc, k3rt_stream *s, int alg, int64_t T, double *t_fwd,
                      double *t_all)
{
    kda_dims d = {bc->B, T, bc->H, bc->H, bc->dim_k, bc->dim_v, bc->C,
                  1.0 / sqrt((double)bc->dim_k)};
    int f64 = bc->f64;
    size_t es = f64 ? 8 : 4;
    int64_t nq = d.B * T * d.H * d.dim_k, nv = d.B * T * d.HV * d.dim_v, nb = d.B * T * d.HV;
    int64_t nst = d.B * d.HV * kda_chunks(T, d.C) * d.dim_k * d.dim_v,
        ns = d.B * d.HV * d.dim_k * d.dim_v;
    int64_t wn = f64 ? kda_core_ws_elems_f64(&d, bc->threads) : kda_core_ws_elems_f32(&d, bc->threads);
    void *q = xcalloc((size_t)nq, es), *k = xcalloc((size_t)nq, es), *v = xcalloc((size_t)nv, es);
    void *g = xcalloc((size_t)nq, es), *be = xcalloc((size_t)nb, es), *o = xcalloc((size_t)nv, es);
    void *st = xcalloc((size_t)nst, es), *sT = xcalloc((size_t)ns, es), *ws = xcalloc((size_t)wn, es);
    void *dO = xcalloc((size_t)nv, es), *dq = xcalloc((size_t)nq, es), *dk = xcalloc((size_t)nq, es);
    void *dv = xcalloc((size_t)nv, es), *dg = xcalloc((size_t)nq, es), *db = xcalloc((size_t)nb, es);
    void *ds0 = xcalloc((size_t)ns, es);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 1, 1);
    fill(q, f64, nq, 1 / sqrt((double)d.dim_k), 0, &rng);
    fill(k, f64, nq, 1 / sqrt((double)d.dim_k), 0, &rng);
    fill(v, f64, nv, 1, 0, &rng);
    fill(g, f64, nq, 0.02, -0.05, &rng); /* retention ~0.95 per step */
    fill(be, f64, nb, 0.1, 0.5, &rng);
    fill(dO, f64, nv, 1, 0, &rng);
    k3rt_error err;
    int reps = T <= 1024 ? 5 : 3;
    *t_fwd = *t_all = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (f64)
            CHECK(kda_core_fwd_f64(s, alg, &d, q, k, v, g, be, NULL, o, st, sT, ws, wn, &err));
        else
            CHECK(kda_core_fwd_f32(s, alg, &d, q, k, v, g, be, NULL, o, st, sT, ws, wn, &err));
        double t1 = now();
        if (f64)
            CHECK(kda_core_bwd_f64(s, alg, &d, q, k, v, g, be, st, dO, NULL, dq, dk, dv, dg, db,
                                   ds0, ws, wn, &err));
        else
            CHECK(kda_core_bwd_f32(s, alg, &d, q, k, v, g, be, st, dO, NULL, dq, dk, dv, dg, db,
                                   ds0, ws, wn, &err));
        double t2 = now();
        *t_fwd = fmin(*t_fwd, t1 - t0);
        *t_all = fmin(*t_all, t2 - t0);
    }
    void *all[] = {q, k, v, g, be, o, st, sT, ws, dO, dq, dk, dv, dg, db, ds0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* The whole layer through its internal entry points (f32 or f64 by bc->f64). */
static void time_layer(const bench_cfg *bc, k3rt_stream *s, int alg, int64_t T, double *t_fwd,
                       double *t_all, double *flops_fwd, double *flops_all)
{
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "{\"heads\": %lld, \"head_dk\": %lld, \"head_dv\": %lld, \"chunk_size\": "
             "%lld, \"algorithm\": \"%s\"}", (long long)bc->H, (long long)bc->dim_k,
             (long long)bc->dim_v, (long long)bc->C, alg ? "chunked" : "recurrent");
    json_t *c = json_loads(cfg, 0, NULL);
    k3rt_error err;
    CHECK(options_apply(kda_options, KDA_N_OPTIONS, sizeof(k3rt_option), c, "bench", &err));
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.config = config_of(c);
    a.dtype = bc->f64 ? K3RT_F64 : K3RT_F32;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = bc->H * bc->dim_k;
    a.stream = s;
    void *self;
    CHECK(kda_create(&a, &self, &err));
    kda *m = self;
    kda_io io;
    memset(&io, 0, sizeof io);
    size_t es = bc->f64 ? 8 : 4;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 2, 2);
    void *p[KDA_N_SLOTS] = {0}, *gr[KDA_N_SLOTS] = {0};
    for (int sl = 0; sl < KDA_N_SLOTS; sl++)
        if (m->slot[sl] >= 0) {
            k3rt_param_decl pd = decl_of(m, sl);
            int64_t n = pd.shape[0] * (pd.ndim == 2 ? pd.shape[1] : 1);
            p[sl] = xcalloc((size_t)n, es), gr[sl] = xcalloc((size_t)n, es);
            double std = pd.init == K3RT_INIT_NORMAL ? pd.init_a : 0;
            double shift = sl == KDA_NORM ? 1 : sl == KDA_DTB ? -4 : 0;
            fill(p[sl], bc->f64, n, std, shift, &rng);
            io.params[sl] = p[sl], io.grads[sl] = gr[sl];
        }
    k3rt_memory mem;
    memset(&mem, 0, sizeof mem);
    kda_memory(m, bc->B, T, &mem);
    int64_t n = bc->B * T * m->d;
    void *x = xcalloc((size_t)n, es), *y = xcalloc((size_t)n, es), *dy = xcalloc((size_t)n, es);
    void *dx = xcalloc((size_t)n, es);
    fill(x, bc->f64, n, 1, 0, &rng);
    fill(dy, bc->f64, n, 1, 0, &rng);
    io.B = bc->B, io.T = T, io.x = x, io.y = y, io.dy = dy, io.dx = dx;
    void *saved = xcalloc((size_t)mem.saved_bytes, 1), *parts[KDA_SAVED_N];
    kda_layout lay;
    kda_layout_make(m, bc->B, T, m->slots, &lay);
    kda_parts_in_block(&lay, saved, (size_t)es, parts);
    io.saved = parts, io.ws = xcalloc((size_t)mem.workspace_bytes, 1);
    k3rt_flops f;
    memset(&f, 0, sizeof f);
    kda_flops(m, bc->B, T, &f);
    *flops_fwd = f.forward, *flops_all = f.forward + f.backward;
    int reps = T <= 1024 ? 5 : 3;
    *t_fwd = *t_all = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (bc->f64)
            CHECK(kda_layer_fwd_f64(m, s, &io, &err));
        else
            CHECK(kda_layer_fwd_f32(m, s, &io, &err));
        double t1 = now();
        if (bc->f64)
            CHECK(kda_layer_bwd_f64(m, s, &io, &err));
        else
            CHECK(kda_layer_bwd_f32(m, s, &io, &err));
        double t2 = now();
        *t_fwd = fmin(*t_fwd, t1 - t0);
        *t_all = fmin(*t_all, t2 - t0);
    }
    for (int sl = 0; sl < KDA_N_SLOTS; sl++)
        free(p[sl]), free(gr[sl]);
    free(x), free(y), free(dy), free(dx), free(saved), free(io.ws);
    kda_destroy(self);
    json_decref(c);
}

static int64_t arg_int(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "bench_kda_cpu: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return atoll(argv[++*i]);
}

int main(int argc, char **argv)
{
    bench_cfg bc = {2, 0, 0, -1, 1, 4, 64, 64, 0, 4096};
    const char *env = getenv("K3RT_THREADS");
    if (env && atoi(env) > 0)
        bc.threads = atoi(env);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads"))
            bc.threads = (int)arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--batch"))
            bc.B = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--heads"))
            bc.H = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--dk"))
            bc.dim_k = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--dv"))
            bc.dim_v = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--chunk"))
            bc.C = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--tmax"))
            bc.tmax = arg_int(argc, argv, &i);
        else if (!strcmp(argv[i], "--f64"))
            bc.f64 = 1;
        else if (!strcmp(argv[i], "--layer"))
            bc.layer = 1;
        else if (!strcmp(argv[i], "--cpu-time"))
            g_cpu_time = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            bc.only = strcmp(argv[++i], "recurrent") ? KDA_CHUNKED : KDA_RECURRENT;
        else {
            fprintf(stderr, "usage: bench_kda_cpu [--threads N] [--batch B] [--heads H] [--dk K] "
                            "[--dv V] [--chunk C] [--tmax T] [--f64] [--layer] "
                            "[--only chunked|recurrent] [--cpu-time]\n");
            return 2;
        }
    }
    if (bc.C <= 0) { /* the plugin's default */
        for (uint32_t i = 0; i < KDA_N_OPTIONS; i++)
            if (!strcmp(kda_options[i].name, "chunk_size"))
                bc.C = atoll(kda_options[i].default_json);
    }
    k3rt_stream *s;
    k3rt_error err;
    CHECK(k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &s, &err));
    k3rt_stream_set_threads(s, bc.threads);
    printf("KDA %s on the CPU: batch %lld, heads %lld, dk %lld, dv %lld, chunk %lld, %d threads, "
           "%s, %s time\n", bc.layer ? "layer" : "recurrence", (long long)bc.B, (long long)bc.H,
           (long long)bc.dim_k, (long long)bc.dim_v, (long long)bc.C, bc.threads,
           bc.f64 ? "f64" : "f32", g_cpu_time ? "CPU" : "wall");
    printf("| T | algorithm | fwd tokens/s | fwd GFLOP/s | fwd+bwd tokens/s | fwd+bwd GFLOP/s |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int64_t T = 256; T <= bc.tmax; T *= 2)
        for (int alg = KDA_CHUNKED; alg >= KDA_RECURRENT; alg--) {
            if (bc.only >= 0 && alg != bc.only)
                continue;
            double tf, ta, ff, fa;
            if (bc.layer) {
                time_layer(&bc, s, alg, T, &tf, &ta, &ff, &fa);
            } else {
                kda_dims d = {bc.B, T, bc.H, bc.H, bc.dim_k, bc.dim_v, bc.C, 0};
                double cb;
                kda_core_flops(&d, alg, &ff, &cb);
                fa = ff + cb;
                time_core(&bc, s, alg, T, &tf, &ta);
            }
            double tok = (double)(bc.B * T);
            printf("| %lld | %s | %.0f | %.2f | %.0f | %.2f |\n", (long long)T,
                   alg ? "chunked" : "recurrent", tok / tf, ff / tf * 1e-9, tok / ta,
                   fa / ta * 1e-9);
            fflush(stdout);
        }
    k3rt_stream_destroy(s);
    return 0;
}
