/* per_head_muon on CUDA against the same plugin on the CPU (f64, on the exact f32 values the
 * device holds). What is compared is each step's update W_new - W_old, not W_new: at the test's
 * learning rates the weights (rms 0.02) move by about their own size, so fp32 rounding of W
 * does not hide the update's error. Error = rms(ref - x) / rms(ref) per parameter:
 *   ns_precision "full" (f32 Newton-Schulz, TF32 off)           <= 1e-5 against the f64 CPU
 *   ns_precision "bf16" (tensor cores, fp32 accumulation)       as close to the exact f64 map
 *                        as the CPU's emulation (each product rounded to bf16 as it is stored;
 *                        ERRATA) is: error(gpu, f64) <= 1.35 x error(emulation, f64)
 *   the AdamW group, in either mode                             <= 1e-5
 * Why not issue 19's "<= 2e-3 against the emulation": on the H200 (2026-12-02) the device was
 * 3.6e-2 from the emulation, while each was 2.6-3.3e-2 from the exact map (ratio 1.00-1.20 per
 * parameter): two bf16 pipelines that differ only in fp32 accumulation order already drift
 * 7e-3 apart on a 24x40 block through the rounding of 30 stored results, so the two errors are
 * independent and their difference is as large as either. The spec measures the same (about
 * 1.5e-2 from the exact map for one bf16 Newton-Schulz, "test spectra, not elements").
 * over head matrices split by rows and by columns, a plain matrix of the same block shape
 * (one batched group with the heads), plain wide and tall matrices, experts, blocks of more
 * than one chunk, and every AdamW role. The Muon blocks are Gaussian with aspect ratio <= 0.6,
 * so their smallest singular value is far from 0, where the quintic's slope (a^5 = 485) would
 * amplify rounding (ERRATA).
 * Poison: the parameters and gradients sit in one arena with NaN-bit gaps between them; a
 * kernel that reads outside a parameter makes NaN, one that writes outside breaks the gaps,
 * and both are checked. QK-clip: exactly the heads whose max logit exceeds tau are scaled, by
 * the factor the CPU uses, bit for bit against an unclipped run; a NaN logit leaves its head
 * alone and fails the next step.
 *
 * Skips (exit 77) without a CUDA device; runs without fork. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

enum { DEV = 0, MAXP = 16, GAP = 5 };
static k3rt_stream *G;  /* CUDA stream on DEV */
static k3rt_stream *H;  /* CPU stream of the reference */

typedef struct pspec {
    const char *name;
    int role, ndim;
    int64_t shape[3];
    int heads, axis, qk;
} pspec;

static const pspec MIXED[] = {
    {"heads_rows", K3RT_ROLE_HEAD_MATRIX, 2, {96, 40, 0}, 4, 0, 0},   /* 4 x (24 x 40) */
    {"heads_cols", K3RT_ROLE_HEAD_MATRIX, 2, {40, 96, 0}, 4, 1, 0},   /* 4 x (40 x 24) strided */
    {"plain_24x40", K3RT_ROLE_MATRIX, 2, {24, 40, 0}, 0, 0, 0},       /* joins heads_rows */
    {"plain_wide", K3RT_ROLE_MATRIX, 2, {48, 112, 0}, 0, 0, 0},
    {"plain_tall", K3RT_ROLE_MATRIX, 2, {256, 96, 0}, 0, 0, 0},       /* two chunks */
    {"experts", K3RT_ROLE_EXPERT_MATRIX, 3, {3, 20, 56}, 0, 0, 0},
    {"experts_big", K3RT_ROLE_EXPERT_MATRIX, 3, {2, 160, 96}, 0, 0, 0}, /* 15360 + tall */
    {"experts_2chunk", K3RT_ROLE_EXPERT_MATRIX, 3, {2, 96, 192}, 0, 0, 0}, /* 18432 each */
    {"embed", K3RT_ROLE_EMBEDDING, 2, {50, 40, 0}, 0, 0, 0},
    {"norm", K3RT_ROLE_NORM_GAIN, 1, {40, 0, 0}, 0, 0, 0},
    {"bias", K3RT_ROLE_VECTOR, 1, {7, 0, 0}, 0, 0, 0},
    {"conv", K3RT_ROLE_CONV, 2, {40, 4, 0}, 0, 0, 0},
    {"router", K3RT_ROLE_ROUTER, 2, {6, 40, 0}, 0, 0, 0},
    {"head", K3RT_ROLE_OUTPUT_HEAD, 2, {50, 40, 0}, 0, 0, 0},
};
enum { NMIXED = sizeof MIXED / sizeof MIXED[0] };

static const pspec CLIPPED[] = {
    {"q_nope", K3RT_ROLE_HEAD_MATRIX, 2, {64, 40, 0}, 4, 0, K3RT_QK_SQRT},
    {"q_shared", K3RT_ROLE_HEAD_MATRIX, 2, {32, 40, 0}, 4, 0, K3RT_QK_FULL},
    {"k_cols", K3RT_ROLE_HEAD_MATRIX, 2, {40, 64, 0}, 4, 1, K3RT_QK_SQRT},
    {"kv_a", K3RT_ROLE_MATRIX, 2, {24, 40, 0}, 0, 0, 0},
    {"norm", K3RT_ROLE_NORM_GAIN, 1, {40, 0, 0}, 0, 0, 0},
};
enum { NCLIPPED = sizeof CLIPPED / sizeof CLIPPED[0] };
/* tau = 100: above it 150, 1e4, 100.0001, 250, 101, 300; at or below it, or -inf, untouched */
static const float LOGITS[3][4] = {{150, 100, 99, -INFINITY},
                                   {1e4f, 100.0001f, 0, 250},
                                   {101, 50, 300, 100}};

/* ---- one side: an instance over parameters in a poisoned arena ------------------------- */

typedef struct side {
    rig m;
    int device, dtype, np;
    const pspec *spec;
    k3rt_param_decl decls[MAXP];
    k3rt_param_ref refs[MAXP];
    int64_t numel[MAXP], off[MAXP + 1];  /* element offsets, GAP apart */
    void *pbuf, *gbuf, *logit;
} side;

static size_t esize(const side *s) { return k3rt_dtype_size(s->dtype); }

static int64_t numel_of(const pspec *p)
{
    int64_t n = 1;
    for (int k = 0; k < p->ndim; k++)
        n *= p->shape[k];
    return n;
}

/* The arena's values (parameters at off[i], NaN elsewhere) into dst of the side's dtype. */
static void put_arena(side *s, void *dst, const double *vals)
{
    k3rt_error err = {0};
    int64_t total = s->off[s->np];
    size_t bytes = (size_t)total * esize(s);
    void *h = malloc(bytes);
    memset(h, 0xff, bytes);
    for (int i = 0; i < s->np; i++)
        TU_OK(k3rt_convert((char *)h + s->off[i] * (int64_t)esize(s), s->dtype, vals + s->off[i],
                           K3RT_F64, s->numel[i], &err), err);
    if (s->device == K3RT_DEVICE_CPU) {
        memcpy(dst, h, bytes);
    } else {
        TU_OK(k3rt_memcpy(G, dst, DEV, h, K3RT_DEVICE_CPU, bytes, &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
    }
    free(h);
}

/* The parameters in double (gaps NaN); the gaps must still hold the poison's bits. */
static double *get_params(side *s, const char *where)
{
    k3rt_error err = {0};
    int64_t total = s->off[s->np];
    size_t bytes = (size_t)total * esize(s);
    unsigned char *h = malloc(bytes);
    if (s->device == K3RT_DEVICE_CPU) {
        memcpy(h, s->pbuf, bytes);
    } else {
        TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, s->pbuf, DEV, bytes, &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
    }
    for (int i = 0; i < s->np; i++)
        for (int64_t b = (s->off[i] + s->numel[i]) * (int64_t)esize(s);
             b < s->off[i + 1] * (int64_t)esize(s); b++)
            ck_assert_msg(h[b] == 0xff, "%s: the gap after parameter %s was written", where,
                          s->spec[i].name);
    double *x = malloc((size_t)total * sizeof(double));
    TU_OK(k3rt_convert(x, K3RT_F64, h, s->dtype, total, &err), err);
    free(h);
    return x;
}

/* The arena's layout alone (enough for arena_randn). */
static void side_layout(side *s, const pspec *spec, int np, int device)
{
    memset(s, 0, sizeof *s);
    s->device = device;
    s->dtype = device == K3RT_DEVICE_CPU ? K3RT_F64 : K3RT_F32;
    s->np = np;
    s->spec = spec;
    for (int i = 0; i < np; i++) {
        s->numel[i] = numel_of(&spec[i]);
        s->off[i + 1] = s->off[i] + s->numel[i] + GAP;
    }
}

static void side_init(side *s, const pspec *spec, int np, int device, const char *cfg_text,
                      const double *p0, const float (*logits)[4])
{
    k3rt_error err = {0};
    side_layout(s, spec, np, device);
    size_t bytes = (size_t)s->off[np] * esize(s), lbytes = 3 * 4 * sizeof(float);
    if (device == K3RT_DEVICE_CPU) {
        s->pbuf = malloc(bytes), s->gbuf = malloc(bytes), s->logit = malloc(lbytes);
    } else {
        s->pbuf = k3rt_alloc(DEV, bytes, &err);
        s->gbuf = k3rt_alloc(DEV, bytes, &err);
        s->logit = k3rt_alloc(DEV, lbytes, &err);
        ck_assert_msg(s->pbuf && s->gbuf && s->logit, "k3rt_alloc: %s", err.msg);
    }
    put_arena(s, s->pbuf, p0);
    if (logits && device == K3RT_DEVICE_CPU) {
        memcpy(s->logit, logits, lbytes);
    } else if (logits) {
        TU_OK(k3rt_memcpy(G, s->logit, device, logits, K3RT_DEVICE_CPU, lbytes, &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
    }
    int clip = 0;
    for (int i = 0; i < np; i++) {
        const pspec *p = &spec[i];
        k3rt_param_decl *d = &s->decls[i];
        d->struct_size = sizeof *d;
        d->role = p->role;
        d->name = p->name;
        d->ndim = p->ndim;
        memcpy(d->shape, p->shape, sizeof p->shape);
        d->heads = p->heads, d->head_axis = p->axis, d->qk_clip = p->qk;
        d->experts = p->role == K3RT_ROLE_EXPERT_MATRIX ? (int32_t)p->shape[0] : 0;
        d->layer = -1;
        k3rt_param_ref *r = &s->refs[i];
        r->struct_size = sizeof *r;
        r->index = i;
        r->name = p->name;
        r->decl = d;
        r->param = k3rt_tensor_view((char *)s->pbuf + s->off[i] * (int64_t)esize(s), s->dtype,
                                    device, p->ndim, p->shape[0], p->shape[1], p->shape[2], 0);
        r->grad = r->param;
        r->grad.data = (char *)s->gbuf + s->off[i] * (int64_t)esize(s);
        if (p->qk && logits)
            r->head_max_logit = k3rt_tensor_view((float *)s->logit + 4 * clip++, K3RT_F32,
                                                 device, 1, p->heads, 0, 0, 0);
    }
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_msg(cfg != NULL, "bad test config %s", cfg_text);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = s->dtype;
    a.device = device;
    a.layer = -1;
    a.params = s->refs;
    a.n_params = np;
    a.stream = device == K3RT_DEVICE_CPU ? H : G;
    const plugin_entry *e = tu_plugin("per_head_muon");
    ck_assert_msg(e->desc.caps & K3RT_CAP_CUDA, "per_head_muon does not declare K3RT_CAP_CUDA "
                  "in this CUDA build");
    TU_OK(rig_create(&s->m, e, cfg, &a, device == K3RT_DEVICE_CPU ? "cpu" : "cuda", &err), err);
    json_decref(cfg);
}

static void side_free(side *s)
{
    rig_destroy(&s->m);
    if (s->device == K3RT_DEVICE_CPU) {
        free(s->pbuf), free(s->gbuf), free(s->logit);
    } else {
        k3rt_free(DEV, s->pbuf), k3rt_free(DEV, s->gbuf), k3rt_free(DEV, s->logit);
    }
}

static int side_step(side *s, const double *g, double lr, int64_t t, k3rt_error *err)
{
    put_arena(s, s->gbuf, g);
    int rc = rig_step(&s->m, NULL, lr, t, s->refs, s->np, err);
    k3rt_error e2 = {0};
    if (s->device != K3RT_DEVICE_CPU)
        TU_OK(k3rt_stream_sync(G, &e2), e2);
    return rc;
}

/* Random values of every parameter (gaps NaN), exact in f32. */
static double *arena_randn(const side *s, double scale, uint64_t seed)
{
    int64_t total = s->off[s->np];
    double *x = malloc((size_t)total * sizeof(double));
    float *f = malloc((size_t)total * sizeof(float));
    tu_randnf(f, total, scale, seed);
    for (int64_t i = 0; i < total; i++)
        x[i] = f[i];
    free(f);
    return x;
}

static int is_muon(const pspec *p)
{
    return p->role == K3RT_ROLE_MATRIX || p->role == K3RT_ROLE_HEAD_MATRIX ||
           p->role == K3RT_ROLE_EXPERT_MATRIX;
}

/* d = after - before over parameter i */
static void delta(const side *s, int i, const double *before, const double *after, double *d)
{
    for (int64_t k = 0; k < s->numel[i]; k++)
        d[k] = after[s->off[i] + k] - before[s->off[i] + k];
}

/* Each parameter's update on the device against the CPU's: finite everywhere, rel rms within
 * muon_tol (Muon group) or 1e-5 (AdamW group). */
/* Asserts each parameter's update error within its tolerance; errs (if given) gets them. */
static void compare_updates(const char *where, side *ref, side *dev, const double *ref_before,
                            const double *dev_before, double muon_tol, double *errs)
{
    double *ra = get_params(ref, where), *da = get_params(dev, where);
    for (int i = 0; i < ref->np; i++) {
        int64_t n = ref->numel[i];
        double *dr = malloc((size_t)n * sizeof(double)), *dd = malloc((size_t)n * sizeof(double));
        delta(ref, i, ref_before, ra, dr);
        delta(dev, i, dev_before, da, dd);
        for (int64_t k = 0; k < n; k++)
            ck_assert_msg(isfinite(dd[k]), "%s: %s element %lld of the update is %g: read "
                          "outside its parameter, or not written", where, ref->spec[i].name,
                          (long long)k, dd[k]);
        double tol = is_muon(&ref->spec[i]) ? muon_tol : 1e-5, e = tu_rel_rms(dr, dd, n);
        printf("  %-44s %-16s update rel rms %.2e (tol %.0e)\n", where, ref->spec[i].name, e,
               tol);
        if (errs)
            errs[i] = e;
        ck_assert_msg(e <= tol, "%s: parameter %s: update relative rms error %.3g > %.1g", where,
                      ref->spec[i].name, e, tol);
        free(dr), free(dd);
    }
    free(ra), free(da);
}

/* The state tensor `name` in double. */
static double *state_of(side *s, const char *name, int64_t n)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&s->m, &sink, &err), err);
    double *out = NULL;
    for (int i = 0; i < sink.n && !out; i++) {
        const k3rt_tensor *t = &sink.items[i].t;
        if (strcmp(sink.items[i].name, name))
            continue;
        ck_assert_int_eq(k3rt_tensor_numel(t), n);
        ck_assert_int_eq(t->device, s->device);
        size_t bytes = k3rt_tensor_bytes(t);
        void *h = malloc(bytes);
        TU_OK(k3rt_memcpy(s->device == K3RT_DEVICE_CPU ? H : G, h, K3RT_DEVICE_CPU, t->data,
                          t->device, bytes, &err), err);
        if (s->device != K3RT_DEVICE_CPU)
            TU_OK(k3rt_stream_sync(G, &err), err);
        out = malloc((size_t)n * sizeof(double));
        TU_OK(k3rt_convert(out, K3RT_F64, h, t->dtype, n, &err), err);
        free(h);
    }
    tensor_sink_free(&sink);
    ck_assert_msg(out != NULL, "per_head_muon state has no tensor %s", name);
    return out;
}

/* Steps of random gradients on the CPU and the device with the same config; every update
 * compared. A second device instance must give the same bits (K3RT_CAP_DETERMINISTIC). */
static void run_vs_cpu(const char *what, const char *cfg, double muon_tol, int steps)
{
    static const double LR[] = {0.05, 0.03, 0.04};
    side ref, dev, dev2, exact;
    side_layout(&ref, MIXED, NMIXED, K3RT_DEVICE_CPU);
    double *p0 = arena_randn(&ref, 0.02, 101);
    side_init(&ref, MIXED, NMIXED, K3RT_DEVICE_CPU, cfg, p0, NULL);
    side_init(&dev, MIXED, NMIXED, DEV, cfg, p0, NULL);
    side_init(&dev2, MIXED, NMIXED, DEV, cfg, p0, NULL);
    side_init(&exact, MIXED, NMIXED, K3RT_DEVICE_CPU, "{\"ns_precision\": \"full\"}", p0, NULL);
    k3rt_error err = {0};
    for (int t = 1; t <= steps; t++) {
        char where[64];
        snprintf(where, sizeof where, "%s step %d", what, t);
        double *g = arena_randn(&ref, 1.0, 200 + (uint64_t)t);
        double *rb = get_params(&ref, where), *db = get_params(&dev, where);
        double *eb = get_params(&exact, where);
        TU_OK(side_step(&ref, g, LR[t - 1], t, &err), err);
        TU_OK(side_step(&dev, g, LR[t - 1], t, &err), err);
        TU_OK(side_step(&dev2, g, LR[t - 1], t, &err), err);
        TU_OK(side_step(&exact, g, LR[t - 1], t, &err), err);
        if (muon_tol > 0) {
            compare_updates(where, &ref, &dev, rb, db, muon_tol, NULL);
        } else {  /* bf16: the device as close to the exact map as the emulation is */
            char w2[80];
            double e_cpu[NMIXED], e_gpu[NMIXED];
            snprintf(w2, sizeof w2, "%s: cpu bf16 vs f64", where);
            compare_updates(w2, &exact, &ref, eb, rb, 1.0, e_cpu);
            snprintf(w2, sizeof w2, "%s: gpu bf16 vs f64", where);
            compare_updates(w2, &exact, &dev, eb, db, 1.0, e_gpu);
            for (int i = 0; i < NMIXED; i++)
                if (is_muon(&MIXED[i]))
                    ck_assert_msg(e_gpu[i] <= 1.35 * e_cpu[i], "%s: %s: the device's update is "
                                  "%.3g from the exact map, the CPU's bf16 emulation %.3g "
                                  "(allowed 1.35x)", where, MIXED[i].name, e_gpu[i], e_cpu[i]);
        }
        free(rb), free(db), free(eb), free(g);
    }
    double *a = get_params(&dev, what), *b = get_params(&dev2, what);
    ck_assert_msg(memcmp(a, b, (size_t)dev.off[dev.np] * sizeof(double)) == 0,
                  "%s: two device instances given the same gradients differ", what);
    free(a), free(b);
    for (int i = 0; i < NMIXED; i++) {  /* the Muon momentum: plain f32 arithmetic */
        if (!is_muon(&MIXED[i]))
            continue;
        char name[64];
        snprintf(name, sizeof name, "%s.momentum", MIXED[i].name);
        double *r = state_of(&ref, name, ref.numel[i]), *d = state_of(&dev, name, dev.numel[i]);
        double e = tu_rel_rms(r, d, ref.numel[i]);
        ck_assert_msg(e <= 1e-6, "%s: state %s relative rms error %.3g > 1e-6", what, name, e);
        free(r), free(d);
    }
    side_free(&ref), side_free(&dev), side_free(&dev2), side_free(&exact);
    free(p0);
}

START_TEST(f32_newton_schulz_vs_cpu)
{
    run_vs_cpu("full", "{\"ns_precision\": \"full\"}", 1e-5, 3);
}
END_TEST

START_TEST(bf16_newton_schulz_vs_cpu_emulation)
{
    run_vs_cpu("bf16", "{\"ns_precision\": \"bf16\"}", -1, 2);  /* < 0: against the exact map */
}
END_TEST

/* ---- QK-clip ----------------------------------------------------------------------------- */

/* One step with QK-clip on (CPU, device) and off (device) from the same weights. */
typedef struct clip_run {
    side ref, on, off;
    double *p0, *g, *w_ref, *w_on, *w_off;
} clip_run;

static void clip_open(clip_run *c, const float (*logits)[4])
{
    const char *on = "{\"ns_precision\": \"full\", \"qk_tau\": 100}";
    const char *off = "{\"ns_precision\": \"full\", \"qk_clip\": false}";
    memset(c, 0, sizeof *c);
    side_layout(&c->ref, CLIPPED, NCLIPPED, K3RT_DEVICE_CPU);
    c->p0 = arena_randn(&c->ref, 0.02, 301);
    c->g = arena_randn(&c->ref, 1.0, 302);
    side_init(&c->ref, CLIPPED, NCLIPPED, K3RT_DEVICE_CPU, on, c->p0, logits);
    side_init(&c->on, CLIPPED, NCLIPPED, DEV, on, c->p0, logits);
    side_init(&c->off, CLIPPED, NCLIPPED, DEV, off, c->p0, logits);
}

static void clip_close(clip_run *c)
{
    side_free(&c->ref), side_free(&c->on), side_free(&c->off);
    free(c->p0), free(c->g), free(c->w_ref), free(c->w_on), free(c->w_off);
}

/* Head h's block of parameter i: element k of the head's rows x cols. */
static int64_t head_elem(const pspec *p, int h, int64_t k)
{
    int64_t R = p->axis ? p->shape[0] : p->shape[0] / p->heads;
    int64_t C = p->axis ? p->shape[1] / p->heads : p->shape[1];
    int64_t r = k / C, c = k % C;
    return p->axis ? r * p->shape[1] + h * C + c : (h * R + r) * p->shape[1] + c;
}

/* Every head of every clipped parameter: on == off bit for bit where the logit is <= tau,
 * -inf or not finite; on == fl(off * f) with the CPU's f otherwise. Returns the clipped count. */
static int check_heads(const clip_run *c, const float (*logits)[4])
{
    int clipped = 0;
    for (int i = 0, clip = 0; i < NCLIPPED; i++) {
        const pspec *p = &CLIPPED[i];
        if (!p->qk)
            continue;
        for (int h = 0; h < p->heads; h++) {
            float s = logits[clip][h];
            int scale = isfinite(s) && s > 100.0;
            double gamma = 100.0 / (double)s;
            float f = scale ? (float)(p->qk == K3RT_QK_SQRT ? sqrt(gamma) : gamma) : 1.0f;
            clipped += scale;
            for (int64_t k = 0; k < numel_of(p) / p->heads; k++) {
                int64_t e = c->on.off[i] + head_elem(p, h, k);
                float off = (float)c->w_off[e], want = scale ? off * f : off;
                ck_assert_msg((float)c->w_on[e] == want, "qk-clip %s head %d (max logit %g): "
                              "element %lld is %.9g, expected %.9g (%s)", p->name, h, (double)s,
                              (long long)k, c->w_on[e], (double)want,
                              scale ? "scaled by the CPU's factor" : "left alone");
            }
        }
        clip++;
    }
    return clipped;
}

START_TEST(qk_clip_scales_exactly_the_heads_above_tau)
{
    k3rt_error err = {0};
    clip_run c;
    clip_open(&c, LOGITS);
    double *rb = get_params(&c.ref, "qk-clip"), *db = get_params(&c.on, "qk-clip");
    TU_OK(side_step(&c.ref, c.g, 0.05, 1, &err), err);
    TU_OK(side_step(&c.on, c.g, 0.05, 1, &err), err);
    TU_OK(side_step(&c.off, c.g, 0.05, 1, &err), err);
    compare_updates("qk-clip tau 100", &c.ref, &c.on, rb, db, 1e-5, NULL);
    c.w_on = get_params(&c.on, "qk-clip");
    c.w_off = get_params(&c.off, "qk-clip");
    ck_assert_int_eq(check_heads(&c, LOGITS), 6);
    /* the parameters without qk_clip are the unclipped run's, bit for bit */
    for (int i = 3; i < NCLIPPED; i++)
        ck_assert_msg(memcmp(c.w_on + c.on.off[i], c.w_off + c.on.off[i],
                             (size_t)c.on.numel[i] * sizeof(double)) == 0,
                      "qk-clip changed %s, which declares no qk_clip", CLIPPED[i].name);
    free(rb), free(db);
    clip_close(&c);
}
END_TEST

START_TEST(qk_clip_nan_logit_fails_the_next_step)
{
    k3rt_error err = {0};
    float bad[3][4];
    memcpy(bad, LOGITS, sizeof bad);
    bad[1][3] = NAN;  /* 250 before: a head that would be clipped */
    clip_run c;
    clip_open(&c, (const float (*)[4])bad);
    /* the CPU refuses the step itself */
    ck_assert_int_eq(side_step(&c.ref, c.g, 0.05, 1, &err), K3RT_ERR_NUMERIC);
    /* the device cannot without a read back: it leaves the head alone, clips the others ... */
    TU_OK(side_step(&c.on, c.g, 0.05, 1, &err), err);
    TU_OK(side_step(&c.off, c.g, 0.05, 1, &err), err);
    c.w_on = get_params(&c.on, "qk-clip nan");
    c.w_off = get_params(&c.off, "qk-clip nan");
    ck_assert_int_eq(check_heads(&c, (const float (*)[4])bad), 5);
    /* ... and the next step reports it, naming the parameter, the head and the step */
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(side_step(&c.on, c.g, 0.05, 2, &err), K3RT_ERR_NUMERIC);
    ck_assert_msg(strstr(err.msg, "q_shared: head 3 reported a max logit of NaN or +inf by "
                         "step 1"), "%s", err.msg);
    /* reported once: with the logit fixed, steps go on */
    float fixed[3][4];
    memcpy(fixed, LOGITS, sizeof fixed);
    TU_OK(k3rt_memcpy(G, c.on.logit, DEV, fixed, K3RT_DEVICE_CPU, sizeof fixed, &err), err);
    TU_OK(side_step(&c.on, c.g, 0.05, 2, &err), err);
    TU_OK(side_step(&c.on, c.g, 0.05, 3, &err), err);
    clip_close(&c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("per_head_muon_cuda");
    TCase *t = tcase_create("cuda");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, f32_newton_schulz_vs_cpu);
    tcase_add_test(t, bf16_newton_schulz_vs_cpu_emulation);
    tcase_add_test(t, qk_clip_scales_exactly_the_heads_above_tau);
    tcase_add_test(t, qk_clip_nan_logit_fails_the_next_step);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    H = tu_cpu_stream(2);
    int rc = tu_run_gpu_suite(suite, &G);
    k3rt_stream_destroy(H);
    return rc;
}
