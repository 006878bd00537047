/* check-plugin: attention and moe plugins — gradients by finite differences, the call
 * contract (outputs overwritten, parameter gradients accumulated, declared buffer sizes
 * respected), determinism, routing and the selection bias (moe), the recurrent state
 * (attention with state_layout), state() round trips and CPU vs CUDA. The host checks every
 * argument before a call (the rig), so a plugin is not asked to refuse bad ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check_mix.h"

/* Exactness expected of two ways to compute the same thing in one dtype. */
static double same_tol(int dtype) { return dtype == K3RT_F64 ? 1e-12 : 1e-6; }

static void check_gradients(check_ctx *c)
{
    fd_options o;
    if (!ck_fd_options(c, &o))
        return;
    fd_result r;
    k3rt_error err = {0};
    if (fd_check_module(c->e, c->config, &o, &r, &err)) {
        ck_error(c, "gradients", &err);
        return;
    }
    ck_report(c, r.worst <= c->tol ? CK_PASS : CK_FAIL, "gradients",
              "%d entries by 5-point differences (step %g), worst relative error %.2e "
              "(tolerance %.0e): %s", r.n_checked, c->fd_eps, r.worst, c->tol, r.worst_what);
}

/* ---- the call contract ------------------------------------------------------------------ */

/* After a second backward on the same forward: dx equal, parameter gradients doubled. */
static const char *accumulate_problem(const mix_run *r, const ck_blobs *one,
                                      const ck_blobs *two, char *buf, size_t len)
{
    for (int i = 0; i < two->n; i++) {
        const ck_blob *b = &two->b[i], *a = ck_blobs_find(one, b->name);
        if (!a)
            continue;
        if (!strcmp(b->name, "grad.x") || !strcmp(b->name, "grad.state_in")) {
            if (memcmp(a->data, b->data, (size_t)a->n * k3rt_dtype_size(a->dtype))) {
                snprintf(buf, len, "%s differs on a repeated backward: it must be overwritten, "
                         "not accumulated", b->name);
                return buf;
            }
            continue;
        }
        double num = 0, den = 0;
        for (int64_t j = 0; j < a->n; j++) {
            double want = 2 * ck_get(a->data, a->dtype, j), got = ck_get(b->data, b->dtype, j);
            num += (want - got) * (want - got);
            den += want * want;
        }
        if (num > same_tol(r->dtype) * same_tol(r->dtype) * (den > 0 ? den : 1)) {
            snprintf(buf, len, "%s after two backwards is not twice one (relative rms %.2e): "
                     "parameter gradients must accumulate (+=)", b->name,
                     sqrt(num / (den > 0 ? den : 1)));
            return buf;
        }
    }
    return NULL;
}

static const char *stats_problem(mix_run *r, int *n, char *buf, size_t len, k3rt_error *err)
{
    struct k3rt_tensor_sink sink;
    *n = 0;
    if (rig_stats(&r->mod.m, &sink, err)) {
        snprintf(buf, len, "stats(): %s", err->msg);
        return buf;
    }
    const char *why = NULL;
    for (int i = 0; i < sink.n && !why; i++) {
        const k3rt_tensor *t = &sink.items[i].t;
        void *h = k3rt_tensor_present(t) ? malloc(k3rt_tensor_bytes(t) + 1) : NULL;
        if (!h || ck_copy(r->mod.s, h, K3RT_DEVICE_CPU, t->data, t->device,
                          k3rt_tensor_bytes(t), err)) {
            snprintf(buf, len, "statistic '%s' has no data", sink.items[i].name);
            why = buf;
        } else if (k3rt_dtype_is_float(t->dtype) && !ck_finite(h, t->dtype,
                                                                k3rt_tensor_numel(t))) {
            snprintf(buf, len, "statistic '%s' is not finite", sink.items[i].name);
            why = buf;
        }
        free(h);
        (*n)++;
    }
    tensor_sink_free(&sink);
    return why;
}

static void check_contract(check_ctx *c)
{
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes)) {
        ck_report(c, CK_SKIP, "contract", "no CPU implementation");
        return;
    }
    mix_run r = {0};
    ck_blobs one = {0}, two = {0};
    k3rt_error err = {0};
    char buf[1024];
    const char *why = NULL;
    int rc = mix_open(c, dtypes[0], K3RT_DEVICE_CPU, &r, &err);
    if (!rc)
        rc = mix_collect(&r, &one, &err);
    if (!rc && ck_blobs_nonfinite(&one, buf, sizeof buf)) {
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " is not finite, with y, dx, "
                 "saved and the workspace filled with NaN bytes before the calls: outputs are "
                 "written (not accumulated) and no buffer is read before it is written");
        why = buf;
    }
    if (!rc && !why && !rig_guards_ok(&r.mod.m))
        why = "writes beyond the saved or workspace bytes that memory() declared";
    if (!rc && !why)
        rc = mix_backward(&r, &err);
    if (!rc && !why)
        rc = mix_add_grads(&r, &two, &err);
    if (!rc && !why)
        why = accumulate_problem(&r, &one, &two, buf, sizeof buf);
    /* Inference (training = 0) computes the same y. */
    if (!rc && !why)
        rc = mix_forward(&r, 0, &err);
    if (!rc && !why) {
        ck_blobs inf = {0};
        rc = ck_blobs_add(&inf, "y", r.dtype, r.n, r.y, r.device, r.mod.s, &err);
        double e = rc ? 0 : ck_rel_rms(ck_blobs_find(&one, "y")->data, inf.b[0].data, r.dtype,
                                       r.n);
        if (e > same_tol(r.dtype)) {
            snprintf(buf, sizeof buf, "y with training = 0 differs from training = 1 "
                     "(relative rms %.2e)", e);
            why = buf;
        }
        ck_blobs_free(&inf);
    }
    int n_stats = 0;
    if (!rc && !why)
        why = stats_problem(&r, &n_stats, buf, sizeof buf, &err);
    if (rc) {
        snprintf(buf, sizeof buf, "%s", err.msg);
        why = buf;
    }
    if (why)
        ck_report(c, CK_FAIL, "contract", "%s", why);
    else
        ck_report(c, CK_PASS, "contract", "%s: outputs written over NaN-filled buffers, dx "
                  "overwritten and %d parameter gradient%s accumulated on a second backward, "
                  "%d saved part%s and the workspace within what was declared (%lld/%lld "
                  "bytes), inference y = training y, %d statistic%s finite",
                  k3rt_dtype_name(r.dtype), r.mod.p.n, r.mod.p.n == 1 ? "" : "s",
                  r.mod.m.n_saved, r.mod.m.n_saved == 1 ? "" : "s",
                  (long long)r.mod.m.saved_bytes[0], (long long)r.mod.m.mem.workspace_bytes,
                  n_stats, n_stats == 1 ? "" : "s");
    ck_blobs_free(&one);
    ck_blobs_free(&two);
    mix_close(&r);
}

/* ---- determinism -------------------------------------------------------------------------- */

/* Same instance twice, then a fresh instance: every output bit for bit. */
static const char *determinism_problem(check_ctx *c, int dtype, int *outputs, char *buf,
                                       size_t len, k3rt_error *err)
{
    mix_run a = {0}, b = {0};
    ck_blobs a1 = {0}, a2 = {0}, b1 = {0};
    char where[512];
    const char *why = NULL;
    int rc = mix_open(c, dtype, K3RT_DEVICE_CPU, &a, err);
    int rb = rc ? rc : mix_open(c, dtype, K3RT_DEVICE_CPU, &b, err);
    if (!rc && !rb)
        rc = mix_collect(&a, &a1, err);
    if (!rc && !rb)
        rc = mix_collect(&a, &a2, err);
    if (!rc && !rb)
        rc = mix_collect(&b, &b1, err);
    if (rc || rb) {
        snprintf(buf, len, "%s", err->msg);
        why = buf;
    } else if (ck_blobs_differ(&a1, &a2, where, sizeof where)) {
        snprintf(buf, len, "%s: a repeated call differs at %s", k3rt_dtype_name(dtype), where);
        why = buf;
    } else if (ck_blobs_differ(&a1, &b1, where, sizeof where)) {
        snprintf(buf, len, "%s: a fresh instance differs at %s", k3rt_dtype_name(dtype), where);
        why = buf;
    }
    *outputs = a1.n;
    ck_blobs_free(&a1), ck_blobs_free(&a2), ck_blobs_free(&b1);
    mix_close(&a);
    mix_close(&b);
    return why;
}

static void check_determinism(check_ctx *c)
{
    int dtypes[2], nd = ck_cpu_dtypes(c, dtypes), outputs = 0;
    char buf[1024], names[32] = "";
    k3rt_error err = {0};
    const char *why = NULL;
    for (int i = 0; i < nd && !why; i++) {
        why = determinism_problem(c, dtypes[i], &outputs, buf, sizeof buf, &err);
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 k3rt_dtype_name(dtypes[i]));
    }
    if (!nd)
        ck_report(c, CK_SKIP, "determinism", "no CPU implementation");
    else if (why && !(c->e->desc.caps & K3RT_CAP_DETERMINISTIC))
        ck_report(c, CK_SKIP, "determinism", "not declared (K3RT_CAP_DETERMINISTIC): %s", why);
    else if (why)
        ck_report(c, CK_FAIL, "determinism", "%s", why);
    else
        ck_report(c, CK_PASS, "determinism", "%s: all %d outputs bitwise equal on a repeated "
                  "call and on a fresh instance (%d threads)", names, outputs, c->threads);
}

/* ---- moe: routing, the selection bias, d_scores ------------------------------------------- */

static const char *routing_problem(mix_run *r, const float *bias, char *buf, size_t len,
                                   k3rt_error *err)
{
    int64_t N = r->B * r->T, E = r->experts, k = r->top_k;
    if (mix_upload(r, r->bias, bias, (size_t)E * sizeof(float), err) || mix_reset(r, err) ||
        mix_forward(r, 1, err)) {
        snprintf(buf, len, "%s", err->msg);
        return buf;
    }
    /* The rig checked the routing's shapes, dtypes and device after the forward. */
    const k3rt_routing *g = &r->routing;
    ck_blobs h = {0};
    int rc = ck_blobs_add(&h, "selected", K3RT_I32, N * k, g->selected.data, g->selected.device,
                          r->mod.s, err);
    if (!rc)
        rc = ck_blobs_add(&h, "scores", K3RT_F32, N * E, g->scores.data, g->scores.device,
                          r->mod.s, err);
    if (!rc)
        rc = ck_blobs_add(&h, "counts", K3RT_I64, E, g->counts.data, g->counts.device,
                          r->mod.s, err);
    const char *why = rc ? "cannot read the routing" : NULL;
    int64_t *hist = calloc((size_t)E, sizeof *hist);
    const int32_t *sel = rc ? NULL : h.b[0].data;
    for (int64_t t = 0; t < N && !why && hist; t++)
        for (int64_t j = 0; j < k && !why; j++) {
            int32_t x = sel[t * k + j];
            if (x < 0 || x >= E) {
                snprintf(buf, len, "token %lld selects expert %d, outside [0, %lld)",
                         (long long)t, x, (long long)E);
                why = buf;
                break;
            }
            for (int64_t q = 0; q < j; q++)
                if (sel[t * k + q] == x) {
                    snprintf(buf, len, "token %lld selects expert %d twice", (long long)t, x);
                    why = buf;
                }
            hist[x]++;
        }
    const int64_t *counts = rc ? NULL : h.b[2].data;
    for (int64_t e = 0; e < E && !why && hist; e++)
        if (counts[e] != hist[e]) {
            snprintf(buf, len, "routing.counts[%lld] = %lld but %lld tokens selected it",
                     (long long)e, (long long)counts[e], (long long)hist[e]);
            why = buf;
        }
    if (!why && !ck_finite(h.b[1].data, K3RT_F32, N * E))
        why = "routing.scores are not finite";
    if (!why && bias[0] > 0 && hist && hist[0] != N) {
        snprintf(buf, len, "with a +%g bias on expert 0 only %lld of %lld tokens select it: the "
                 "bias must enter the selection", bias[0], (long long)hist[0], (long long)N);
        why = buf;
    }
    free(hist);
    ck_blobs_free(&h);
    return why;
}

/* Backward with d_scores = G and 2G: the change of the gradients is non-zero and linear. */
static const char *d_scores_problem(mix_run *r, char *buf, size_t len, k3rt_error *err)
{
    int64_t ns = r->B * r->T * r->experts;
    float *g = malloc((size_t)ns * sizeof *g);
    ck_blobs o[3] = {{0}, {0}, {0}};
    int rc = g ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc && r->device == K3RT_DEVICE_CPU)
        r->d_scores = malloc((size_t)ns * sizeof(float) + 64);
    if (!rc && !r->d_scores)
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    k3rt_rng rng;
    k3rt_rng_seed(&rng, r->c->seed, 0xd5c0ull);
    for (int64_t i = 0; i < ns && !rc; i++)
        g[i] = (float)k3rt_rng_normal(&rng);
    float *keep = r->d_scores;
    for (int pass = 0; pass < 3 && !rc; pass++) {
        r->d_scores = pass ? keep : NULL;
        if (pass == 2)
            for (int64_t i = 0; i < ns; i++)
                g[i] *= 2;
        if (pass)
            rc = mix_upload(r, keep, g, (size_t)ns * sizeof(float), err);
        if (!rc)
            rc = mix_collect(r, &o[pass], err);
    }
    r->d_scores = keep;
    free(g);
    const char *why = NULL;
    if (rc) {
        snprintf(buf, len, "%s", err->msg);
        why = buf;
    }
    double change = 0, num = 0, den = 0;
    for (int i = 0; i < o[0].n && !why; i++) {
        const ck_blob *b0 = &o[0].b[i], *b1 = &o[1].b[i], *b2 = &o[2].b[i];
        if (strncmp(b0->name, "grad.", 5))
            continue;
        for (int64_t j = 0; j < b0->n; j++) {
            double d1 = ck_get(b1->data, b1->dtype, j) - ck_get(b0->data, b0->dtype, j);
            double d2 = ck_get(b2->data, b2->dtype, j) - ck_get(b0->data, b0->dtype, j);
            change += d1 * d1;
            num += (d2 - 2 * d1) * (d2 - 2 * d1);
            den += 4 * d1 * d1;
        }
    }
    double tol = r->dtype == K3RT_F64 ? 1e-6 : 1e-3;
    if (!why && !(change > 0))
        why = "gradients ignore d_scores: an auxiliary-loss balancer would have no effect";
    else if (!why && num > tol * tol * den) {
        snprintf(buf, len, "the gradient's response to d_scores is not linear (relative rms "
                 "%.2e between the responses to 2G and twice G)", sqrt(num / den));
        why = buf;
    }
    for (int i = 0; i < 3; i++)
        ck_blobs_free(&o[i]);
    return why;
}

static void check_routing(check_ctx *c)
{
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes))
        return;
    mix_run r = {0};
    k3rt_error err = {0};
    char buf[1024];
    if (mix_open(c, dtypes[0], K3RT_DEVICE_CPU, &r, &err)) {
        ck_error(c, "routing", &err);
        mix_close(&r);
        return;
    }
    if (r.experts <= 0) {
        ck_report(c, CK_SKIP, "routing", "a dense FFN (experts() reports no routed experts)");
        mix_close(&r);
        return;
    }
    float *bias = calloc((size_t)r.experts, sizeof *bias);
    const char *why = bias ? routing_problem(&r, bias, buf, sizeof buf, &err) : "out of memory";
    if (!why) {
        bias[0] = 1000.0f;
        why = routing_problem(&r, bias, buf, sizeof buf, &err);
        bias[0] = 0.0f;
    }
    if (!why && !mix_upload(&r, r.bias, bias, (size_t)r.experts * sizeof(float), &err))
        why = d_scores_problem(&r, buf, sizeof buf, &err);
    free(bias);
    if (why)
        ck_report(c, CK_FAIL, "routing", "%s", why);
    else
        ck_report(c, CK_PASS, "routing", "top-%d of %d experts: selections in range and "
                  "distinct, counts equal their histogram, scores finite; a +1000 bias on "
                  "expert 0 routes every token to it; gradients respond linearly to d_scores",
                  r.top_k, r.experts);
    mix_close(&r);
}

/* ---- attention: the recurrent state --------------------------------------------------------- */

static double state_rel(mix_run *r, const void *want_dev, const void *got_dev, k3rt_error *err)
{
    size_t bytes = (size_t)r->state_n * k3rt_dtype_size(r->dtype);
    void *a = malloc(bytes), *b = malloc(bytes);
    double e = INFINITY;
    if (a && b && !ck_copy(r->mod.s, a, K3RT_DEVICE_CPU, want_dev, r->device, bytes, err) &&
        !ck_copy(r->mod.s, b, K3RT_DEVICE_CPU, got_dev, r->device, bytes, err))
        e = ck_rel_rms(a, b, r->dtype, r->state_n);
    free(a), free(b);
    return e;
}

/* state_out = m state_in + b, with (m, b) from cp_summary and applied through cp_compose. */
static const char *cp_problem(mix_run *r, char *buf, size_t len, k3rt_error *err)
{
    k3rt_tensor M = r->mod.m.state.summary_m, Bt = r->mod.m.state.summary_b;
    size_t mb = k3rt_tensor_bytes(&M), bb = k3rt_tensor_bytes(&Bt);
    if (M.ndim < 1 || Bt.ndim < 1 || bb != (size_t)r->state_n * k3rt_dtype_size(r->dtype))
        return "state_layout() gives no summary shapes, or summary b is not state-shaped";
    void *m = calloc(1, mb), *b = calloc(1, bb), *m0 = calloc(1, mb), *mo = calloc(1, mb),
         *bo = calloc(1, bb);
    const char *why = NULL;
    int rc = m && b && m0 && mo && bo ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (r->device != K3RT_DEVICE_CPU)
        rc = k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "context-parallel check runs on the CPU");
    if (!rc) {
        k3rt_fwd_args a;
        mix_fwd_args(r, 0, &a);
        k3rt_tensor tm = M, tb = Bt;
        tm.data = m, tb.data = b;
        rc = rig_cp_summary(&r->mod.m, &a, tm, tb, err);
        if (!rc) {
            k3rt_tensor t0 = M, ts = r->mod.m.state.state, tmo = M, tbo = Bt;
            t0.data = m0, ts.data = r->s_in, tmo.data = mo, tbo.data = bo;
            rc = rig_cp_compose(&r->mod.m, t0, ts, tm, tb, tmo, tbo, err);
        }
    }
    if (!rc)
        rc = mix_reset(r, err);
    if (!rc)
        rc = mix_forward(r, 0, err);
    if (rc) {
        snprintf(buf, len, "context parallel: %s", err->msg);
        why = buf;
    } else {
        double e = state_rel(r, r->s_out, bo, err);
        double tol = r->dtype == K3RT_F64 ? 1e-9 : 1e-4;
        if (!(e <= tol)) {
            snprintf(buf, len, "state_out differs from m state_in + b of cp_summary/cp_compose "
                     "(relative rms %.2e, tolerance %.0e)", e, tol);
            why = buf;
        }
    }
    free(m), free(b), free(m0), free(mo), free(bo);
    return why;
}

static void check_state(check_ctx *c)
{
    if (c->e->desc.kind != K3RT_KIND_ATTENTION || !c->e->vt.attention.state_layout)
        return;
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes))
        return;
    mix_run r = {0};
    k3rt_error err = {0};
    char buf[1024];
    const char *why = NULL;
    ck_blobs none = {0}, zero = {0}, rnd = {0};
    int rc = mix_open(c, dtypes[0], K3RT_DEVICE_CPU, &r, &err);
    size_t sb = (size_t)r.state_n * k3rt_dtype_size(r.dtype);
    void *keep = rc ? NULL : malloc(sb);
    if (!rc && !keep)
        rc = k3rt_fail(&err, K3RT_ERR_NOMEM, "out of memory");
    /* no state_in, a zero state_in, a random one */
    if (!rc)
        rc = ck_copy(r.mod.s, keep, K3RT_DEVICE_CPU, r.s_in, r.device, sb, &err);
    if (!rc) {
        r.use_state = 0;
        rc = mix_reset(&r, &err);
    }
    if (!rc)
        rc = mix_forward(&r, 0, &err);
    if (!rc)
        rc = ck_blobs_add(&none, "y", r.dtype, r.n, r.y, r.device, r.mod.s, &err);
    if (!rc)
        rc = ck_blobs_add(&none, "state_out", r.dtype, r.state_n, r.s_out, r.device, r.mod.s, &err);
    r.use_state = 1;
    if (!rc)
        rc = k3rt_memset(r.mod.s, r.s_in, r.device, 0, sb, &err);
    if (!rc)
        rc = mix_forward(&r, 0, &err);
    if (!rc)
        rc = ck_blobs_add(&zero, "y", r.dtype, r.n, r.y, r.device, r.mod.s, &err);
    if (!rc)
        rc = ck_blobs_add(&zero, "state_out", r.dtype, r.state_n, r.s_out, r.device, r.mod.s, &err);
    if (!rc)
        rc = mix_upload(&r, r.s_in, keep, sb, &err);
    if (!rc)
        rc = mix_forward(&r, 0, &err);
    if (!rc)
        rc = ck_blobs_add(&rnd, "y", r.dtype, r.n, r.y, r.device, r.mod.s, &err);
    if (rc) {
        snprintf(buf, sizeof buf, "%s", err.msg);
        why = buf;
    }
    char where[256];
    if (!why && ck_blobs_nonfinite(&none, where, sizeof where))
        why = "state_out is not finite";
    else if (!why && ck_blobs_worst(&none, &zero, where, sizeof where) > same_tol(r.dtype)) {
        snprintf(buf, sizeof buf, "%s with a zero state_in differs from no state_in (absent "
                 "means zero)", where);
        why = buf;
    } else if (!why && !(ck_rel_rms(none.b[0].data, rnd.b[0].data, r.dtype, r.n) > 1e-6))
        why = "y does not depend on state_in: the initial state is ignored";
    int cp = c->e->vt.attention.cp_summary != NULL;
    if (!why && cp)
        why = cp_problem(&r, buf, sizeof buf, &err);
    if (why)
        ck_report(c, CK_FAIL, "state", "%s", why);
    else
        ck_report(c, CK_PASS, "state", "state [%lld elements]: no state_in = a zero one, y "
                  "depends on state_in, state_out finite%s; its gradient is part of the "
                  "gradient check", (long long)r.state_n,
                  cp ? ", state_out = m state_in + b through cp_summary and cp_compose" : "");
    ck_blobs_free(&none), ck_blobs_free(&zero), ck_blobs_free(&rnd);
    free(keep);
    mix_close(&r);
}

/* ---- state() round trip --------------------------------------------------------------------- */

static void check_instance_state(check_ctx *c)
{
    int dtypes[2];
    if (!c->e->inst.state || !ck_cpu_dtypes(c, dtypes))
        return;
    mix_run a = {0}, b = {0};
    ck_blobs oa = {0}, ob = {0};
    k3rt_error err = {0};
    char where[512];
    int n = 0;
    int rc = mix_open(c, dtypes[0], K3RT_DEVICE_CPU, &a, &err);
    int rb = rc ? rc : mix_open(c, dtypes[0], K3RT_DEVICE_CPU, &b, &err);
    if (!rc && !rb)
        rc = mix_collect(&a, &oa, &err);
    if (!rc && !rb)
        rc = ck_state_copy(&a.mod.m, &b.mod.m, a.mod.s, &n, &err);
    ck_blobs_free(&oa);
    if (!rc && !rb)
        rc = mix_collect(&a, &oa, &err);
    if (!rc && !rb)
        rc = mix_collect(&b, &ob, &err);
    if (rc || rb)
        ck_error(c, "state()", &err);
    else if (ck_blobs_differ(&oa, &ob, where, sizeof where))
        ck_report(c, CK_FAIL, "state()", "an instance loaded with another's %d state tensors "
                  "computes differently: %s", n, where);
    else
        ck_report(c, CK_PASS, "state()", "%d tensors saved from one instance and loaded into a "
                  "fresh one: the same outputs bit for bit", n);
    ck_blobs_free(&oa), ck_blobs_free(&ob);
    mix_close(&a);
    mix_close(&b);
}

void ck_mixer(check_ctx *c)
{
    check_gradients(c);
    check_contract(c);
    check_determinism(c);
    if (c->e->desc.kind == K3RT_KIND_MOE)
        check_routing(c);
    check_state(c);
    check_instance_state(c);
}

/* ---- CPU vs CUDA ------------------------------------------------------------------------------ */

void ck_mixer_cuda(check_ctx *c)
{
    if (!ck_cuda_ready(c, "cuda"))
        return;
    mix_run h = {0}, g = {0};
    ck_blobs oh = {0}, og = {0};
    k3rt_error err = {0};
    char where[256];
    int rc = mix_open(c, K3RT_F32, K3RT_DEVICE_CPU, &h, &err);
    int rg = rc ? rc : mix_open(c, K3RT_F32, 0, &g, &err);
    if (!rc && !rg)
        rc = mix_collect(&h, &oh, &err);
    if (!rc && !rg)
        rc = mix_collect(&g, &og, &err);
    if (rc || rg) {
        ck_error(c, "cuda", &err);
    } else {
        double worst = ck_blobs_worst(&oh, &og, where, sizeof where);
        ck_report(c, worst <= c->cuda_tol ? CK_PASS : CK_FAIL, "cuda",
                  "f32 on CUDA device 0 against the CPU: %d outputs, worst relative rms %.2e "
                  "(%s; tolerance %.0e)", oh.n, worst, where, c->cuda_tol);
    }
    ck_blobs_free(&oh), ck_blobs_free(&og);
    mix_close(&h);
    mix_close(&g);
}
