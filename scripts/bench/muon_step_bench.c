/* One per_head_muon step over a model's parameters on CUDA device 0, for
 * scripts/bench/muon_step.py (which times the PyTorch peer at the same shapes).
 *
 *   bench_muon_step PARAMS.txt [--ns bf16|full] [--runs R] [--warmup W]
 *
 * PARAMS.txt: one parameter a line, "name role AxBxC heads head_axis none|sqrt|full" (the
 * format of k3_mini_params.txt). Weights N(0, 0.02^2), gradients N(0, 1), max logits of the
 * QK-clip parameters 100 + 30 N(0, 1) (about half the heads clipped with tau 100). Prints
 * one "op=CASE ... ms=T" line per case, the median of R runs after W warm-ups (CUDA events):
 *   step    the plugin's step over every parameter (Muon, AdamW group, QK-clip)
 *   muon    an instance over the Muon parameters alone (momentum, Newton-Schulz, update)
 *   adamw   k3rt_adamw_step_multi over the AdamW group, as the plugin calls it
 * The plugin comes from K3RT_PLUGIN_PATH. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_bench.h"
#include "plugin/registry.h"
#include "plugin/rig.h"

enum { MAXP = 1024 };

typedef struct model {
    int n;
    char names[MAXP][96];
    k3rt_param_decl decls[MAXP];
    k3rt_param_ref refs[MAXP];
    int64_t numel[MAXP];
} model;

static int role_of(const char *s)
{
    for (int r = 1; r < 64; r++) {
        const char *n = k3rt_role_name(r);
        if (n && !strcmp(n, s))
            return r;
    }
    bench_die("params", s);
    return 0;
}

/* Random values without generating a billion of them on the host: a pool of 2^24 N(0, 1)
 * values on the device, copied from a different offset into each tensor. */
enum { POOL = 1 << 24 };
static float *pool;
static k3rt_stream *fill_stream;

static void fill(float *dev, int64_t n, double scale, uint64_t seed)
{
    if (!pool) {
        float *h = malloc((size_t)POOL * sizeof *h);
        k3rt_rng r;
        k3rt_rng_seed(&r, 1, 7);
        for (int64_t i = 0; i < POOL; i++)
            h[i] = (float)k3rt_rng_normal(&r);
        pool = bench_dev((size_t)POOL * sizeof *h);
        bench_cuda_check(cudaMemcpy(pool, h, (size_t)POOL * sizeof *h, cudaMemcpyHostToDevice),
                         "cudaMemcpy");
        free(h);
    }
    for (int64_t done = 0; done < n;) {
        int64_t from = (int64_t)((seed * 2654435761ull + (uint64_t)done) % (POOL / 2));
        int64_t len = n - done < POOL / 2 ? n - done : POOL / 2;
        bench_cuda_check(cudaMemcpy(dev + done, pool + from, (size_t)len * sizeof(float),
                                    cudaMemcpyDeviceToDevice), "cudaMemcpy");
        done += len;
    }
    k3rt_error err = {0};
    if (k3rt_axpby(fill_stream, K3RT_F32, n, scale, dev, 0.0, dev, &err) ||
        k3rt_stream_sync(fill_stream, &err))
        bench_die("fill", err.msg);
}

static void read_model(const char *path, model *m)
{
    FILE *f = fopen(path, "r");
    if (!f)
        bench_die(path, "cannot open");
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char name[96], role[32], shape[64], qk[16];
        int heads, axis;
        if (line[0] == '#' ||
            sscanf(line, "%95s %31s %63s %d %d %15s", name, role, shape, &heads, &axis, qk) != 6)
            continue;
        if (m->n == MAXP)
            bench_die(path, "too many parameters");
        int i = m->n++;
        k3rt_param_decl *d = &m->decls[i];
        snprintf(m->names[i], sizeof m->names[i], "%s", name);
        d->struct_size = sizeof *d;
        d->role = role_of(role);
        d->name = m->names[i];
        int64_t dims[3] = {0, 0, 0};
        d->ndim = sscanf(shape, "%ldx%ldx%ld", &dims[0], &dims[1], &dims[2]);
        memcpy(d->shape, dims, sizeof dims);
        d->heads = heads, d->head_axis = axis, d->layer = -1;
        d->experts = d->role == K3RT_ROLE_EXPERT_MATRIX ? (int32_t)dims[0] : 0;
        d->qk_clip = !strcmp(qk, "sqrt") ? K3RT_QK_SQRT : !strcmp(qk, "full") ? K3RT_QK_FULL
                                                                             : K3RT_QK_NONE;
        m->numel[i] = 1;
        for (int k = 0; k < d->ndim; k++)
            m->numel[i] *= dims[k];
        k3rt_param_ref *r = &m->refs[i];
        r->struct_size = sizeof *r;
        r->index = i;
        r->name = m->names[i];
        r->decl = d;
        r->param = k3rt_tensor_view(bench_dev((size_t)m->numel[i] * 4), K3RT_F32, 0, d->ndim,
                                    dims[0], dims[1], dims[2], 0);
        r->grad = r->param;
        r->grad.data = bench_dev((size_t)m->numel[i] * 4);
        fill(r->param.data, m->numel[i], 0.02, 2 * (uint64_t)i);
        fill(r->grad.data, m->numel[i], 1.0, 2 * (uint64_t)i + 1);
        if (d->qk_clip) {  /* 100 + 30 N(0, 1): about half the heads above tau = 100 */
            float h[64];
            k3rt_rng r2;
            k3rt_rng_seed(&r2, 1000 + (uint64_t)i, 0);
            for (int k = 0; k < heads && k < 64; k++)
                h[k] = (float)(100.0 + 30.0 * k3rt_rng_normal(&r2));
            r->head_max_logit = k3rt_tensor_view(bench_dev(sizeof h), K3RT_F32, 0, 1, heads, 0,
                                                 0, 0);
            bench_cuda_check(cudaMemcpy(r->head_max_logit.data, h, sizeof h,
                                        cudaMemcpyHostToDevice), "cudaMemcpy");
        }
    }
    fclose(f);
}

typedef struct step_ctx {
    rig *m;
    const k3rt_param_ref *refs;
    int n;
    int64_t t;
} step_ctx;

/* lr 1e-4 keeps the weights in range over the runs; the work does not depend on it */
static int run_step(void *c, k3rt_error *err)
{
    step_ctx *s = c;
    return rig_step(s->m, NULL, 1e-4, ++s->t, s->refs, s->n, err);
}

typedef struct adamw_ctx {
    k3rt_stream *s;
    int n;
    void *w[MAXP], *m[MAXP], *v[MAXP];
    const void *g[MAXP];
    int64_t len[MAXP], t;
    double wd[MAXP];
} adamw_ctx;

static int run_adamw(void *c, k3rt_error *err)
{
    adamw_ctx *a = c;
    return k3rt_adamw_step_multi(a->s, K3RT_F32, a->n, a->w, a->g, a->m, a->v, a->len, a->wd,
                                 1e-4, 0.9, 0.95, 1e-8, ++a->t, err);
}

static int is_muon(int role)
{
    return role == K3RT_ROLE_MATRIX || role == K3RT_ROLE_HEAD_MATRIX ||
           role == K3RT_ROLE_EXPERT_MATRIX;
}

static void create(rig *r, const plugin_entry *e, const char *ns, k3rt_param_ref *refs, int n,
                   k3rt_stream *s)
{
    char cfg_text[128];
    snprintf(cfg_text, sizeof cfg_text, "{\"ns_precision\": \"%s\"}", ns);
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32;
    a.device = 0;
    a.layer = -1;
    a.params = refs;
    a.n_params = n;
    a.stream = s;
    k3rt_error err = {0};
    if (rig_create(r, e, cfg, &a, "cuda", &err))
        bench_die("per_head_muon create", err.msg);
    json_decref(cfg);
}

int main(int argc, char **argv)
{
    bench_program = "bench_muon_step";
    const char *ns = "bf16";
    int runs = 30, warm = 5;
    if (argc < 2)
        bench_die("usage", "bench_muon_step PARAMS.txt [--ns bf16|full] [--runs R] [--warmup W]");
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ns"))
            ns = argv[i + 1];
        else if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup"))
            warm = atoi(argv[i + 1]);
        else
            bench_die("unknown option", argv[i]);
    }
    k3rt_error err = {0};
    k3rt_stream *s;
    if (k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &s, &err))
        bench_die("stream", err.msg);
    cudaStream_t st = (cudaStream_t)k3rt_stream_native(s);
    fill_stream = s;
    static model m;
    read_model(argv[1], &m);
    registry reg;
    if (registry_init(&reg, NULL, &err))
        bench_die("registry", err.msg);
    const plugin_entry *e = registry_find(&reg, "per_head_muon", K3RT_KIND_OPTIMIZER);
    if (!e)
        bench_die("registry", "no per_head_muon plugin on K3RT_PLUGIN_PATH");

    /* the whole step */
    static rig whole, muon_only;
    create(&whole, e, ns, m.refs, m.n, s);
    step_ctx sc = {&whole, m.refs, m.n, 0};
    double t_step = bench_median_ms(run_step, &sc, st, warm, runs, "step");
    rig_destroy(&whole);

    /* the Muon parameters alone */
    static k3rt_param_ref mu[MAXP];
    static adamw_ctx ac;
    int nm = 0;
    int64_t muon_elems = 0, adamw_elems = 0;
    for (int i = 0; i < m.n; i++) {
        if (is_muon(m.decls[i].role)) {
            mu[nm] = m.refs[i];
            mu[nm].index = nm;
            nm++;
            muon_elems += m.numel[i];
            continue;
        }
        int j = ac.n++;
        ac.w[j] = m.refs[i].param.data;
        ac.g[j] = m.refs[i].grad.data;
        ac.m[j] = bench_dev((size_t)m.numel[i] * 4);
        ac.v[j] = bench_dev((size_t)m.numel[i] * 4);
        bench_cuda_check(cudaMemset(ac.m[j], 0, (size_t)m.numel[i] * 4), "cudaMemset");
        bench_cuda_check(cudaMemset(ac.v[j], 0, (size_t)m.numel[i] * 4), "cudaMemset");
        ac.len[j] = m.numel[i];
        int role = m.decls[i].role;
        ac.wd[j] = role == K3RT_ROLE_EMBEDDING || role == K3RT_ROLE_OUTPUT_HEAD ||
                   role == K3RT_ROLE_ROUTER ? 0.1 : 0.0;
        adamw_elems += m.numel[i];
    }
    create(&muon_only, e, ns, mu, nm, s);
    step_ctx mc = {&muon_only, mu, nm, 0};
    double t_muon = bench_median_ms(run_step, &mc, st, warm, runs, "muon");
    rig_destroy(&muon_only);

    ac.s = s;
    double t_adamw = bench_median_ms(run_adamw, &ac, st, warm, runs, "adamw");

    printf("op=step ns=%s params=%d elements=%lld ms=%.4f\n", ns, m.n,
           (long long)(muon_elems + adamw_elems), t_step);
    printf("op=muon ns=%s params=%d elements=%lld ms=%.4f\n", ns, nm, (long long)muon_elems,
           t_muon);
    printf("op=adamw params=%d elements=%lld ms=%.4f\n", ac.n, (long long)adamw_elems, t_adamw);
    registry_free(&reg);
    k3rt_stream_destroy(s);
    return 0;
}
