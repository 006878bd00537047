/* latent_moe on CUDA against the CPU.
 *  (a) Routing kernels on the same f32 scores as the CPU's f32 loops (cpu.c, compiled
 *      into this test): the selection and the counting-sort dispatch must be EQUAL (experts 8,
 *      64, 896, 1024; top-k 1, 2, 8, 16; N up to 3000 tokens, so several sort chunks), with
 *      scores on a coarse grid so that equal biased scores are common (ties go to the lower
 *      expert id), and with counts that are ragged, that leave experts empty, and where one
 *      expert takes every token. The gates within 1 ulp.
 *  (b) The whole layer through the host's rig, forward and backward, f32 and bf16, against the
 *      CPU plugin in f64 on the values the device holds (bf16 inputs and weights rounded
 *      first): y, dx and the increment of every parameter gradient (router, down, experts,
 *      norm, up, shared; they accumulate onto random values), a balancer gradient d_scores
 *      included. The GPU's selection must equal the reference's (both routers are fp32 or
 *      better on identical inputs) and so must the counts; scores to 1e-5. Error = rms(ref -
 *      x) / rms(ref) <= 1e-5 (f32) or 2e-2 (bf16). Latent and hidden widths not multiples of
 *      64 (f32) and K3-mini's shapes (bf16: d 1024, 64 experts top-8, latent 512, expert
 *      hidden 768, one shared expert of 1024). Outputs, saved parts and workspace poisoned
 *      first; a second run of every case gives the same bits (the deterministic combine), and
 *      so does a run with the shared experts on the call's stream (overlap_shared false)
 *      instead of the instance's second stream.
 * Exit: 1 when a check fails; 77 (skipped) without a CUDA device. Runs without fork.
 * K3RT_MOE_TEST_SMALL=1 leaves out the K3-mini shape (for compute-sanitizer). */
#include "gpu_testkit.h"

#include "plugin/rig.h"
#include "plugin/registry.h"
#include "latent_moe.h"
#include "lmoe_cuda.h"

static k3rt_stream *H;  /* CPU stream of the reference */

/* ---- (a) routing and dispatch ---------------------------------------------------------------- */

/* The CPU's order (moe.c): a stable counting sort of the (token, slot) pairs by expert. */
static void dispatch_ref(const int32_t *sel, int64_t R, int E, int64_t *counts, int64_t *off,
                         int32_t *pos, int32_t *src)
{
    memset(counts, 0, (size_t)E * sizeof *counts);
    for (int64_t i = 0; i < R; i++)
        counts[sel[i]]++;
    off[0] = 0;
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + counts[e];
    int64_t *cur = malloc((size_t)E * sizeof *cur);
    memcpy(cur, off, (size_t)E * sizeof *cur);
    for (int64_t i = 0; i < R; i++) {
        pos[i] = (int32_t)cur[sel[i]]++;
        src[pos[i]] = (int32_t)i;
    }
    free(cur);
}

enum { SKEW_RAGGED, SKEW_ONE_TAKES_ALL, SKEW_EMPTY };
static const char *const skew_name[] = {"ragged", "one expert takes all", "empty experts"};

/* The selection bias of a skew: ragged (small), one expert far above the rest, or half of the
 * experts far below (they receive nothing once k <= E / 2). */
static void skew_bias(float *b, int E, int k, int skew, uint64_t seed)
{
    tu_randnf(b, E, 0.05, seed);
    for (int e = 0; e < E; e++) {
        b[e] = roundf(b[e] * 64) / 64;  /* on the scores' grid: biased ties stay common */
        if (skew == SKEW_ONE_TAKES_ALL && e == E / 2)
            b[e] = 4;
        if (skew == SKEW_EMPTY && e % 2 == 1 && k <= E / 2)
            b[e] = -4;
    }
}

static void routing_case(int64_t N, int E, int k, int skew)
{
    char where[160];
    snprintf(where, sizeof where, "routing N=%lld E=%d top-%d %s", (long long)N, E, k,
             skew_name[skew]);
    k3rt_error err = {0};
    int64_t R = N * k;
    float *s = malloc((size_t)(N * E) * sizeof *s), *bias = malloc((size_t)E * sizeof *bias);
    tu_randnf(s, N * E, 1.0, (uint64_t)(N * 131 + E * 7 + k + skew));
    for (int64_t i = 0; i < N * E; i++)  /* sigmoid scores on a grid of 1/64: many ties */
        s[i] = roundf(64.0f / (1.0f + expf(-s[i]))) / 64.0f;
    skew_bias(bias, E, k, skew, (uint64_t)(E + k));
    int32_t *sel = malloc((size_t)R * sizeof *sel), *pos = malloc((size_t)R * sizeof *pos);
    int32_t *src = malloc((size_t)R * sizeof *src);
    float *p = malloc((size_t)R * sizeof *p);
    int64_t *counts = malloc((size_t)E * sizeof *counts);
    int64_t *off = malloc((size_t)(E + 1) * sizeof *off);
    lmoe_kernels_f32.route(H, s, bias, N, E, k, 1, 1.0, sel, p);
    dispatch_ref(sel, R, E, counts, off, pos, src);

    void *ds = gk_dev_copy(s, (size_t)(N * E) * sizeof *s);
    void *db = gk_dev_copy(bias, (size_t)E * sizeof *bias);
    size_t scratch = (size_t)lmoe_cu_dispatch_scratch(R, E);
    void *dsel = gk_alloc((size_t)R * 4), *dp = gk_alloc((size_t)R * 4);
    void *dpos = gk_alloc((size_t)R * 4), *dsrc = gk_alloc((size_t)R * 4);
    void *dcnt = gk_alloc((size_t)E * 8), *doff = gk_alloc((size_t)(E + 1) * 8);
    void *dscr = gk_alloc(scratch);
    void *bufs[] = {dsel, dp, dpos, dsrc, dscr};
    size_t sizes[] = {(size_t)R * 4, (size_t)R * 4, (size_t)R * 4, (size_t)R * 4, scratch};
    for (int i = 0; i < 5; i++)
        gk_poison(bufs[i], sizes[i]);
    gk_poison(dcnt, (size_t)E * 8), gk_poison(doff, (size_t)(E + 1) * 8);
    void *st = k3rt_stream_native(GK_G);
    TU_OK(lmoe_cu_route(st, ds, db, N, E, k, 1, 1.0, dsel, dp, &err), err);
    TU_OK(lmoe_cu_dispatch(st, dsel, R, E, dscr, dcnt, doff, dpos, dsrc, &err), err);

    int32_t *gsel = gk_get_raw(dsel, (size_t)R * 4), *gpos = gk_get_raw(dpos, (size_t)R * 4);
    int32_t *gsrc = gk_get_raw(dsrc, (size_t)R * 4);
    float *gp = gk_get_raw(dp, (size_t)R * 4);
    int64_t *gcnt = gk_get_raw(dcnt, (size_t)E * 8), *goff = gk_get_raw(doff, (size_t)(E + 1) * 8);
    int64_t bad = 0, badp = 0;
    for (int64_t i = 0; i < R; i++) {
        bad += gsel[i] != sel[i];
        badp += !(fabsf(gp[i] - p[i]) <= 1.2e-7f * fabsf(p[i]));
    }
    if (bad)
        gk_fail("%s: %lld of %lld selections differ from the CPU's (first pair %d vs %d)",
                where, (long long)bad, (long long)R, gsel[0], sel[0]);
    if (badp)
        gk_fail("%s: %lld gates differ from the CPU's by more than 1 ulp", where,
                (long long)badp);
    if (memcmp(gcnt, counts, (size_t)E * 8) || memcmp(goff, off, (size_t)(E + 1) * 8))
        gk_fail("%s: counts or offsets differ from the CPU's", where);
    if (memcmp(gpos, pos, (size_t)R * 4) || memcmp(gsrc, src, (size_t)R * 4))
        gk_fail("%s: the permutation differs from the CPU's stable order", where);
    int64_t empty = 0, most = 0;
    for (int e = 0; e < E; e++)
        empty += counts[e] == 0, most = counts[e] > most ? counts[e] : most;
    printf("  %-64s equal (%lld empty experts, largest %lld of %lld tokens)\n", where,
           (long long)empty, (long long)most, (long long)N);
    if (skew == SKEW_ONE_TAKES_ALL && most != N)
        gk_fail("%s: the skew did not route every token to one expert", where);
    free(gsel), free(gpos), free(gsrc), free(gp), free(gcnt), free(goff);
    void *all[] = {ds, db, dsel, dp, dpos, dsrc, dcnt, doff, dscr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        k3rt_free(GK_DEV, all[i]);
    free(s), free(bias), free(sel), free(pos), free(src), free(p), free(counts), free(off);
}

START_TEST(routing_equals_cpu)
{
    if (GK_DEV == K3RT_DEVICE_CPU)
        return;  /* harness mode: the kernels need the GPU */
    const int E[] = {8, 64, 896, 1024}, K[] = {1, 2, 8, 16};
    const int64_t N[] = {1, 37, 3000};
    for (int e = 0; e < 4; e++)
        for (int j = 0; j < 4; j++)
            for (int n = 0; n < 3; n++)
                for (int skew = 0; skew < 3; skew++)
                    if (K[j] <= E[e])
                        routing_case(N[n], E[e], K[j], skew);
    ck_assert_msg(gk_failed == 0, "%d routing checks failed", gk_failed);
}
END_TEST

/* ---- (b) the layer ------------------------------------------------------------------------- */

typedef struct moe_case {
    int E, k;
    int64_t d, l, m, shared, shared_hidden, B, T;
    int skew;
    const char *extra;  /* more options, "" or starting with a comma */
} moe_case;

enum { MAXP = LMOE_N_SLOTS };

typedef struct moe_side {
    rig m;
    int dtype, gdtype, device, np;
    k3rt_tensor params[MAXP], grads[MAXP];
    void *x, *dy, *y, *dx, *bias, *dscores;
    k3rt_routing routing;
} moe_side;

typedef struct moe_inputs {
    double *p[MAXP], *g0[MAXP], *x, *dy, *bias, *dscores;
    int64_t pn[MAXP], n, N;
} moe_inputs;

/* The reference (f64) keeps host doubles; the side under test buffers of its dtype. */
static void *side_buf(const moe_side *s, int dtype, const double *x, int64_t n)
{
    if (s->dtype != K3RT_F64)
        return gk_from(dtype, x, n);
    double *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    memcpy(c, x, (size_t)n * sizeof(double));
    return c;
}

static void side_free_buf(const moe_side *s, void *p)
{
    if (s->dtype != K3RT_F64)
        k3rt_free(GK_DEV, p);
    else
        free(p);
}

static void side_create(moe_side *s, const char *cfg_text, const moe_case *c, int dtype,
                        int device, k3rt_error *err, int *rc)
{
    memset(s, 0, sizeof *s);
    s->dtype = dtype, s->device = device;
    s->gdtype = dtype == K3RT_BF16 ? K3RT_F32 : dtype;
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_msg(cfg != NULL, "bad test config %s", cfg_text);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = device, a.d_model = c->d, a.n_layers = 2, a.layer = 1;
    a.stream = device == K3RT_DEVICE_CPU ? H : GK_G;
    *rc = rig_create(&s->m, tu_plugin("latent_moe"), cfg, &a, device == K3RT_DEVICE_CPU ? "cpu"
                     : "cuda", err);
    json_decref(cfg);
}

static void side_init(moe_side *s, const moe_case *c, const char *cfg, int dtype, int device,
                      const moe_inputs *in)
{
    k3rt_error err = {0};
    int rc;
    side_create(s, cfg, c, dtype, device, &err, &rc);
    TU_OK(rc, err);
    s->np = rig_n_params(&s->m);
    for (int i = 0; i < s->np; i++) {
        const k3rt_param_decl *pd = rig_param(&s->m, i);
        s->params[i] = k3rt_tensor_view(NULL, dtype, device, pd->ndim, pd->shape[0],
                                        pd->shape[1], pd->shape[2], 0);
        s->grads[i] = s->params[i];
        s->grads[i].dtype = s->gdtype;
        s->params[i].data = side_buf(s, dtype, in->p[i], in->pn[i]);
        s->grads[i].data = side_buf(s, s->gdtype, in->g0[i], in->pn[i]);
    }
    s->x = side_buf(s, dtype, in->x, in->n);
    s->dy = side_buf(s, dtype, in->dy, in->n);
    s->y = side_buf(s, dtype, in->x, in->n);
    s->dx = side_buf(s, dtype, in->x, in->n);
    /* bias and d_scores are f32 for the plugin on both sides */
    float *bf = malloc((size_t)c->E * sizeof(float));
    float *df = malloc((size_t)(in->N * c->E) * sizeof(float));
    for (int e = 0; e < c->E; e++)
        bf[e] = (float)in->bias[e];
    for (int64_t i = 0; i < in->N * c->E; i++)
        df[i] = (float)in->dscores[i];
    if (dtype == K3RT_F64) {
        s->bias = bf, s->dscores = df;
    } else {
        s->bias = gk_dev_copy(bf, (size_t)c->E * sizeof(float));
        s->dscores = gk_dev_copy(df, (size_t)(in->N * c->E) * sizeof(float));
        free(bf), free(df);
    }
    TU_OK(rig_bind_params(&s->m, s->params, s->grads, &err), err);
    TU_OK(rig_alloc_shape(&s->m, c->B, c->T, 0, &err), err);
}

static void side_free(moe_side *s)
{
    rig_destroy(&s->m);
    for (int i = 0; i < s->np; i++)
        side_free_buf(s, s->params[i].data), side_free_buf(s, s->grads[i].data);
    void *b[] = {s->x, s->dy, s->y, s->dx, s->bias, s->dscores};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        side_free_buf(s, b[i]);
}

static k3rt_tensor act(const moe_side *s, void *p, const moe_case *c)
{
    return k3rt_tensor_view(p, s->dtype, s->device, 3, c->B, c->T, c->d, 0);
}

static void side_run(moe_side *s, const moe_case *c)
{
    k3rt_error err = {0};
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.training = 1;
    f.x = act(s, s->x, c), f.y = act(s, s->y, c);
    f.bias = k3rt_tensor_view(s->bias, K3RT_F32, s->device, 1, c->E, 0, 0, 0);
    f.routing = &s->routing;
    TU_OK(rig_forward(&s->m, &f, &err), err);
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.x = act(s, s->x, c), b.dy = act(s, s->dy, c), b.dx = act(s, s->dx, c);
    b.d_scores = k3rt_tensor_view(s->dscores, K3RT_F32, s->device, 2, c->B * c->T, c->E, 0, 0);
    TU_OK(rig_backward(&s->m, &b, &err), err);
}

static void dev_poison_all(moe_side *s, const moe_inputs *in)
{
    k3rt_error err = {0};
    gk_poison(s->y, gk_bytes(s->dtype, in->n));
    gk_poison(s->dx, gk_bytes(s->dtype, in->n));
    TU_OK(rig_fill_buffers(&s->m, 0xff, &err), err);
}

/* Everything the device wrote, as bytes, for the determinism check. */
static void *snapshot(const moe_side *s, const moe_inputs *in, size_t *bytes)
{
    size_t at = 0, total = 2 * gk_bytes(s->dtype, in->n);
    for (int i = 0; i < s->np; i++)
        total += gk_bytes(s->gdtype, in->pn[i]);
    char *out = malloc(total);
    const void *src[MAXP + 2];
    size_t len[MAXP + 2];
    int n = 0;
    src[n] = s->y, len[n++] = gk_bytes(s->dtype, in->n);
    src[n] = s->dx, len[n++] = gk_bytes(s->dtype, in->n);
    for (int i = 0; i < s->np; i++)
        src[n] = s->grads[i].data, len[n++] = gk_bytes(s->gdtype, in->pn[i]);
    for (int i = 0; i < n; i++) {
        void *h = gk_get_raw(src[i], len[i]);
        memcpy(out + at, h, len[i]);
        at += len[i];
        free(h);
    }
    *bytes = total;
    return out;
}

static void layer_case(const moe_case *c, int dtype)
{
    char cfg[512], where[200];
    snprintf(cfg, sizeof cfg, "{\"experts\": %d, \"top_k\": %d, \"latent\": %lld, "
             "\"expert_hidden\": %lld, \"shared\": %lld, \"shared_hidden\": %lld%s}", c->E, c->k,
             (long long)c->l, (long long)c->m, (long long)c->shared,
             (long long)c->shared_hidden, c->extra);
    snprintf(where, sizeof where, "latent_moe E=%d k=%d d=%lld l=%lld m=%lld Hs=%lld N=%lld %s%s "
             "%s", c->E, c->k, (long long)c->d, (long long)c->l, (long long)c->m,
             (long long)(c->shared * c->shared_hidden), (long long)(c->B * c->T),
             skew_name[c->skew], c->extra, k3rt_dtype_name(dtype));
    uint64_t seed = 1000 + (uint64_t)(c->E * 31 + c->k * 7 + c->d + c->l + c->skew + dtype);
    int gdt = dtype == K3RT_BF16 ? K3RT_F32 : dtype;
    moe_inputs in;
    memset(&in, 0, sizeof in);
    in.N = c->B * c->T, in.n = in.N * c->d;

    /* the reference first: it declares the parameters both sides share */
    moe_side ref, dev;
    {
        k3rt_error err = {0};
        int rc;
        side_create(&ref, cfg, c, K3RT_F64, K3RT_DEVICE_CPU, &err, &rc);
        TU_OK(rc, err);
    }
    int np = rig_n_params(&ref.m);
    for (int i = 0; i < np; i++) {
        const k3rt_param_decl *pd = rig_param(&ref.m, i);
        int64_t n = 1, fan = pd->shape[pd->ndim - 1];
        for (int j = 0; j < pd->ndim; j++)
            n *= pd->shape[j];
        in.pn[i] = n;
        int gain = pd->init == K3RT_INIT_ONES, router = pd->role == K3RT_ROLE_ROUTER;
        /* the router spread wide enough that the selection is not a coin toss */
        in.p[i] = gk_randn(n, (router ? 3.0 : 1.0) / sqrt((double)fan) * (gain ? 0.1 : 1.0),
                           dtype, seed + (uint64_t)i);
        if (gain)
            for (int64_t j = 0; j < n; j++)
                in.p[i][j] += 1.0;
        in.g0[i] = gk_randn(n, 0.1, gdt, seed + 100 + (uint64_t)i);
    }
    rig_destroy(&ref.m);
    in.x = gk_randn(in.n, 1.0, dtype, seed + 200);
    in.dy = gk_randn(in.n, 1.0, dtype, seed + 201);
    in.dscores = gk_randn(in.N * c->E, 0.01, K3RT_F32, seed + 202);
    float *bf = malloc((size_t)c->E * sizeof(float));
    skew_bias(bf, c->E, c->k, c->skew, seed + 203);
    in.bias = malloc((size_t)c->E * sizeof(double));
    for (int e = 0; e < c->E; e++)
        in.bias[e] = bf[e];
    free(bf);

    side_init(&ref, c, cfg, K3RT_F64, K3RT_DEVICE_CPU, &in);
    side_init(&dev, c, cfg, dtype, GK_DEV, &in);
    side_run(&ref, c);
    dev_poison_all(&dev, &in);
    side_run(&dev, c);

    double tol = dtype == K3RT_BF16 ? 2e-2 : 1e-5;
    int64_t NK = in.N * c->k;
    int32_t *gsel = gk_get_raw(dev.routing.selected.data, (size_t)NK * 4);
    int64_t *gcnt = gk_get_raw(dev.routing.counts.data, (size_t)c->E * 8);
    const int32_t *rsel = ref.routing.selected.data;
    int64_t bad = 0;
    for (int64_t i = 0; i < NK; i++)
        bad += gsel[i] != rsel[i];
    if (bad)
        gk_fail("%s: %lld of %lld selections differ from the reference's", where,
                (long long)bad, (long long)NK);
    if (memcmp(gcnt, ref.routing.counts.data, (size_t)c->E * 8))
        gk_fail("%s: routing counts differ from the reference's", where);
    double *rs = malloc((size_t)(in.N * c->E) * sizeof(double));
    for (int64_t i = 0; i < in.N * c->E; i++)
        rs[i] = ((const float *)ref.routing.scores.data)[i];
    double *gs = gk_get(dev.routing.scores.data, K3RT_F32, in.N * c->E);
    gk_close(where, "routing.scores", rs, gs, in.N * c->E, 1e-5);
    free(rs), free(gs), free(gsel), free(gcnt);

    double *y = gk_get(dev.y, dtype, in.n), *dx = gk_get(dev.dx, dtype, in.n);
    gk_close(where, "y", ref.y, y, in.n, tol);
    gk_close(where, "dx", ref.dx, dx, in.n, tol);
    free(y), free(dx);
    for (int i = 0; i < np; i++) {
        double *got = gk_get(dev.grads[i].data, gdt, in.pn[i]);
        double *want = ref.grads[i].data;
        for (int64_t j = 0; j < in.pn[i]; j++)
            got[j] -= in.g0[i][j], want[j] -= in.g0[i][j];
        char what[80];
        snprintf(what, sizeof what, "d %s", rig_param(&dev.m, i)->name);
        gk_close(where, what, want, got, in.pn[i], tol);
        free(got);
    }

    /* the same inputs again: the same bits */
    size_t b1, b2;
    void *s1 = snapshot(&dev, &in, &b1);
    for (int i = 0; i < np; i++)
        gk_put(dev.grads[i].data, gdt, in.g0[i], in.pn[i]);
    dev_poison_all(&dev, &in);
    side_run(&dev, c);
    void *s2 = snapshot(&dev, &in, &b2);
    gk_same_bytes(where, "y, dx and the gradients", s1, s2, b1);
    free(s2);

    /* the shared experts on the call's stream instead of the side stream: the same bits */
    if (c->shared > 0) {
        char cfg1[560];
        snprintf(cfg1, sizeof cfg1, "%.*s, \"overlap_shared\": false}", (int)strlen(cfg) - 1,
                 cfg);
        moe_side one;
        side_init(&one, c, cfg1, dtype, GK_DEV, &in);
        dev_poison_all(&one, &in);
        side_run(&one, c);
        size_t b3;
        void *s3 = snapshot(&one, &in, &b3);
        if (b3 != b1 || memcmp(s1, s3, b1))
            gk_fail("%s: y, dx or a gradient differs between overlap_shared true and false",
                    where);
        else
            printf("  %-64s overlap_shared false: the same bits\n", where);
        free(s3);
        side_free(&one);
    }
    free(s1);

    side_free(&ref);
    side_free(&dev);
    for (int i = 0; i < np; i++)
        free(in.p[i]), free(in.g0[i]);
    free(in.x), free(in.dy), free(in.dscores), free(in.bias);
}

static const moe_case F32_CASES[] = {
    {8, 2, 37, 19, 23, 1, 13, 2, 9, SKEW_RAGGED, ""},
    {8, 1, 37, 19, 23, 1, 13, 3, 7, SKEW_ONE_TAKES_ALL, ""},
    {64, 8, 70, 33, 45, 2, 17, 2, 25, SKEW_EMPTY, ""},
    {64, 16, 48, 40, 24, 0, 0, 1, 40, SKEW_RAGGED, ""},
    {8, 2, 29, 21, 31, 1, 11, 2, 13, SKEW_RAGGED,
     ", \"act\": \"swiglu\", \"latent_norm\": false, \"renormalize\": false, "
     "\"routed_scaling\": 2.5"},
    {64, 2, 24, 18, 20, 1, 8, 4, 300, SKEW_EMPTY, ""},  /* 2400 routed rows: two sort chunks */
};

static const moe_case BF16_CASES[] = {
    {8, 2, 64, 64, 96, 1, 64, 2, 32, SKEW_ONE_TAKES_ALL, ""},
    {64, 8, 256, 128, 192, 1, 256, 2, 48, SKEW_EMPTY, ""},
    {64, 8, 1024, 512, 768, 1, 1024, 1, 128, SKEW_RAGGED, ""},  /* K3-mini */
};

START_TEST(layer_f32_vs_cpu)
{
    for (size_t i = 0; i < sizeof F32_CASES / sizeof F32_CASES[0]; i++)
        layer_case(&F32_CASES[i], K3RT_F32);
    ck_assert_msg(gk_failed == 0, "%d checks failed", gk_failed);
}
END_TEST

START_TEST(layer_bf16_vs_cpu)
{
    if (GK_DEV == K3RT_DEVICE_CPU)
        return;  /* harness mode: bf16 is the GPU's */
    const char *small = getenv("K3RT_MOE_TEST_SMALL");
    size_t n = sizeof BF16_CASES / sizeof BF16_CASES[0];
    for (size_t i = 0; i < n - (small && *small == '1'); i++)
        layer_case(&BF16_CASES[i], K3RT_BF16);
    ck_assert_msg(gk_failed == 0, "%d checks failed", gk_failed);
}
END_TEST

START_TEST(cuda_refuses_what_it_cannot_route)
{
    if (GK_DEV == K3RT_DEVICE_CPU)
        return;
    moe_case c = {2048, 8, 16, 8, 8, 0, 0, 1, 1, SKEW_RAGGED, ""};
    moe_side s;
    k3rt_error err = {0};
    int rc;
    side_create(&s, "{\"experts\": 2048, \"top_k\": 8}", &c, K3RT_F32, GK_DEV, &err, &rc);
    ck_assert_int_eq(rc, K3RT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "experts must be <= 1024"), "%s", err.msg);
    c.E = 64;
    side_create(&s, "{\"experts\": 64, \"top_k\": 32}", &c, K3RT_F32, GK_DEV, &err, &rc);
    ck_assert_int_eq(rc, K3RT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "top_k <= 16"), "%s", err.msg);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("latent_moe_cuda");
    TCase *t = tcase_create("cuda");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, routing_equals_cpu);
    tcase_add_test(t, layer_f32_vs_cpu);
    tcase_add_test(t, layer_bf16_vs_cpu);
    tcase_add_test(t, cuda_refuses_what_it_cannot_route);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    H = tu_cpu_stream(8);
    int rc = gk_main(suite);
    k3rt_stream_destroy(H);
    return rc;
}
