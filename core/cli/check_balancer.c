/* check-plugin: balancer plugins on synthetic routing — a simulated MoE layer of `experts`
 * experts and top-k whose router prefers higher-numbered experts (scores sigmoid(o_e + noise)
 * with o_e rising from -1 to 1), selected as an MoE does (top-k of score + bias). Checks the
 * bias, that updates move it against the load, determinism, state() round trips, the
 * auxiliary-loss gradient by finite differences, data-parallel agreement and CPU vs CUDA. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check.h"
#include "comm/comm_impl.h"

typedef struct bal_run {
    check_ctx *c;
    int device, E, k, created, own_stream;
    int64_t N;                /* tokens per micro-batch: B * T */
    k3rt_stream *s;
    k3rt_comm **world;        /* a one-rank local world unless dp was given */
    k3rt_comm *dp;
    rig m;
    k3rt_rng rng;             /* the synthetic data */
    float *scores, *ds, *bias;
    int32_t *sel;
    int64_t *counts;
    void *scores_d, *sel_d, *ds_d, *counts_d;  /* device copies (the host buffers on the CPU) */
    double loss;              /* auxiliary loss of the last micro-batch */
} bal_run;

static void bal_close(bal_run *r)
{
    if (r->created)
        rig_destroy(&r->m);
    if (r->device != K3RT_DEVICE_CPU) {
        void *d[4] = {r->scores_d, r->sel_d, r->ds_d, r->counts_d};
        for (int i = 0; i < 4; i++)
            if (d[i])
                k3rt_free(r->device, d[i]);
    }
    free(r->scores), free(r->ds), free(r->bias), free(r->sel), free(r->counts);
    if (r->world)
        comm_local_destroy(r->world, 1);
    if (r->own_stream)
        k3rt_stream_destroy(r->s);
    memset(r, 0, sizeof *r);
}

/* dp: the data-parallel communicator of this rank, or NULL for one rank. data_stream picks the
 * synthetic token stream (ranks of one step see different tokens). */
static int bal_open(check_ctx *c, int device, k3rt_comm *dp, uint64_t data_stream, bal_run *r,
                    k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->c = c, r->device = device, r->E = c->experts, r->k = c->top_k, r->N = c->B * c->T;
    r->s = c->cpu;
    if (device != K3RT_DEVICE_CPU) {
        K3RT_TRY(k3rt_stream_create(device, K3RT_STREAM_COMPUTE, &r->s, err));
        r->own_stream = 1;
    } else if (dp) {
        /* a rank's own stream: c->cpu is not shared across threads */
        K3RT_TRY(k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &r->s, err));
        k3rt_stream_set_threads(r->s, 1);
        r->own_stream = 1;
    }
    if (!dp) {
        K3RT_TRY(comm_local_create(1, &r->world, err));
        dp = r->world[0];
    }
    r->dp = dp;
    k3rt_rng_seed(&r->rng, c->seed, 0xba1a0ull + data_stream);
    size_t ns = (size_t)(r->N * r->E);
    r->scores = malloc(ns * sizeof(float));
    r->ds = calloc(ns, sizeof(float));
    r->bias = calloc((size_t)r->E, sizeof(float));
    r->sel = malloc((size_t)(r->N * r->k) * sizeof(int32_t));
    r->counts = calloc((size_t)r->E, sizeof(int64_t));
    if (!r->scores || !r->ds || !r->bias || !r->sel || !r->counts)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    r->scores_d = r->scores, r->sel_d = r->sel, r->ds_d = r->ds, r->counts_d = r->counts;
    if (device != K3RT_DEVICE_CPU) {
        r->scores_d = k3rt_alloc(device, ns * sizeof(float), err);
        r->ds_d = r->scores_d ? k3rt_alloc(device, ns * sizeof(float), err) : NULL;
        r->sel_d = r->ds_d ? k3rt_alloc(device, (size_t)(r->N * r->k) * sizeof(int32_t), err)
                           : NULL;
        r->counts_d = r->sel_d ? k3rt_alloc(device, (size_t)r->E * sizeof(int64_t), err) : NULL;
        if (!r->counts_d)
            return err->code;
    }
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.comm = dp;
    K3RT_TRY(ck_create(c, &r->m, &a, K3RT_F32, device, r->s, err));
    r->created = 1;
    return K3RT_OK;
}

/* The current bias, checked (f32 [E] on the run's device) and copied to r->bias. */
static int bal_bias(bal_run *r, k3rt_error *err)
{
    k3rt_tensor t;
    K3RT_TRY(rig_bias(&r->m, &t, err));
    K3RT_TRY(ck_copy(r->s, r->bias, K3RT_DEVICE_CPU, t.data, t.device,
                     (size_t)r->E * sizeof(float), err));
    if (!ck_finite(r->bias, K3RT_F32, r->E))
        return k3rt_fail(err, K3RT_ERR_NUMERIC, "bias() holds a non-finite value");
    return K3RT_OK;
}

static k3rt_routing bal_routing(bal_run *r)
{
    k3rt_routing g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.batch = r->c->B, g.seq = r->c->T;
    g.experts = r->E, g.top_k = r->k;
    g.scores = k3rt_tensor_view(r->scores_d, K3RT_F32, r->device, 2, r->N, r->E, 0, 0);
    g.selected = k3rt_tensor_view(r->sel_d, K3RT_I32, r->device, 2, r->N, r->k, 0, 0);
    g.counts = k3rt_tensor_view(r->counts_d, K3RT_I64, r->device, 1, r->E, 0, 0, 0);
    return g;
}

/* Fresh scores, routed with the current bias. */
static void bal_route(bal_run *r)
{
    memset(r->counts, 0, (size_t)r->E * sizeof *r->counts);
    for (int64_t t = 0; t < r->N; t++) {
        float *s = r->scores + t * r->E;
        for (int e = 0; e < r->E; e++) {
            double o = -1.0 + 2.0 * e / (r->E > 1 ? r->E - 1 : 1);
            s[e] = (float)(1.0 / (1.0 + exp(-(o + k3rt_rng_normal(&r->rng)))));
        }
        int n = 0;
        for (int e = 0; e < r->E; e++) {
            float v = s[e] + r->bias[e];
            int beaten = 0;
            for (int j = 0; j < r->E; j++) {
                float w = s[j] + r->bias[j];
                beaten += w > v || (w == v && j < e);
            }
            if (beaten < r->k && n < r->k) {
                r->sel[t * r->k + n++] = e;
                r->counts[e]++;
            }
        }
    }
}

/* What the engine does with one micro-batch: route, observe, ask for the auxiliary loss. */
static int bal_micro(bal_run *r, double scale, k3rt_error *err)
{
    K3RT_TRY(bal_bias(r, err));
    bal_route(r);
    if (r->device != K3RT_DEVICE_CPU) {
        K3RT_TRY(ck_copy(r->s, r->scores_d, r->device, r->scores, K3RT_DEVICE_CPU,
                         (size_t)(r->N * r->E) * sizeof(float), err));
        K3RT_TRY(ck_copy(r->s, r->sel_d, r->device, r->sel, K3RT_DEVICE_CPU,
                         (size_t)(r->N * r->k) * sizeof(int32_t), err));
        K3RT_TRY(ck_copy(r->s, r->counts_d, r->device, r->counts, K3RT_DEVICE_CPU,
                         (size_t)r->E * sizeof(int64_t), err));
    }
    k3rt_routing g = bal_routing(r);
    K3RT_TRY(rig_observe(&r->m, &g, err));
    r->loss = 0;
    if (rig_has_aux_loss(&r->m)) {
        k3rt_tensor ds = k3rt_tensor_view(r->ds_d, K3RT_F32, r->device, 2, r->N, r->E, 0, 0);
        K3RT_TRY(rig_aux_loss(&r->m, &g, scale, &r->loss, ds, err));
        K3RT_TRY(ck_copy(r->s, r->ds, K3RT_DEVICE_CPU, r->ds_d, r->device,
                         (size_t)(r->N * r->E) * sizeof(float), err));
        if (!isfinite(r->loss) || !ck_finite(r->ds, K3RT_F32, r->N * r->E))
            return k3rt_fail(err, K3RT_ERR_NUMERIC, "aux_loss() gave a non-finite loss or "
                             "d_scores");
    }
    return K3RT_OK;
}

/* One optimizer step of two micro-batches; the bias after it lands in r->bias. */
static int bal_step(bal_run *r, int64_t step, k3rt_error *err)
{
    rig_reset_stats(&r->m);
    for (int micro = 0; micro < 2; micro++)
        K3RT_TRY(bal_micro(r, 0.5, err));
    K3RT_TRY(rig_update(&r->m, r->dp, step, err));
    K3RT_TRY(k3rt_stream_sync(r->s, err));
    return bal_bias(r, err);
}

/* ---- checks ------------------------------------------------------------------------------- */

static double maxvio(const int64_t *counts, int E)
{
    int64_t hi = 0, total = 0;
    for (int e = 0; e < E; e++) {
        hi = counts[e] > hi ? counts[e] : hi;
        total += counts[e];
    }
    return total ? (double)hi * E / (double)total - 1.0 : 0.0;
}

/* bias() is well formed; one step on the skewed load moves the bias against the load; 20
 * more keep it finite. */
static void check_update(check_ctx *c)
{
    bal_run r = {0};
    k3rt_error err = {0};
    int rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &r, &err);
    float *b0 = calloc((size_t)c->experts, sizeof *b0);
    if (!rc && !b0)
        rc = k3rt_fail(&err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = bal_bias(&r, &err);
    if (!rc) {
        memcpy(b0, r.bias, (size_t)r.E * sizeof *b0);
        rc = bal_step(&r, 1, &err);
    }
    double corr = 0, moved = 0, v0 = 0, v1 = 0;
    if (!rc) {
        /* the load of the step: two micro-batches; the last one's counts are in r.counts */
        double mean = 0;
        for (int e = 0; e < r.E; e++)
            mean += (double)r.counts[e] / r.E;
        for (int e = 0; e < r.E; e++) {
            double db = (double)r.bias[e] - b0[e];
            corr += db * ((double)r.counts[e] - mean);
            moved += fabs(db);
        }
        v0 = maxvio(r.counts, r.E);
    }
    for (int64_t step = 2; step <= 21 && !rc; step++)
        rc = bal_step(&r, step, &err);
    if (!rc)
        v1 = maxvio(r.counts, r.E);
    int aux = r.created && rig_has_aux_loss(&r.m);
    if (rc)
        ck_error(c, "update", &err);
    else if (moved > 0 && !(corr < 0))
        ck_report(c, CK_FAIL, "update", "the bias moved with the load instead of against it "
                  "(sum of bias change x (load - mean) = %.3g > 0)", corr);
    else if (moved == 0 && !aux)
        ck_report(c, CK_FAIL, "update", "the bias never moves and there is no auxiliary loss: "
                  "nothing balances the experts");
    else
        ck_report(c, CK_PASS, "update", "bias() f32 [%d] finite; %s; max violation %.3f after "
                  "step 1, %.3f after step 21 (top-%d, %lld tokens x 2 micro-batches a step)",
                  r.E, moved > 0 ? "one step on a skewed load moves the bias against the load"
                                 : "the bias stays (it balances through its auxiliary loss)",
                  v0, v1, r.k, (long long)r.N);
    free(b0);
    bal_close(&r);
}

/* Two fresh instances fed the same routing: the same bias and loss bit for bit. Then a third
 * instance loaded with the first's state continues identically. */
static void check_determinism_and_state(check_ctx *c)
{
    bal_run a = {0}, b = {0}, l = {0};
    k3rt_error err = {0};
    int rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &a, &err);
    if (!rc)
        rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &b, &err);
    int differ = 0, changed = 0, n_state = 0;
    float first[256];
    if (!rc)
        rc = bal_bias(&a, &err);
    if (!rc)
        memcpy(first, a.bias, (size_t)a.E * sizeof(float));
    for (int64_t step = 1; step <= 5 && !rc && !differ; step++) {
        rc = bal_step(&a, step, &err);
        if (!rc)
            rc = bal_step(&b, step, &err);
        if (!rc)
            differ = memcmp(a.bias, b.bias, (size_t)a.E * sizeof(float)) ||
                     memcmp(&a.loss, &b.loss, sizeof a.loss) ||
                     memcmp(a.ds, b.ds, (size_t)(a.N * a.E) * sizeof(float));
    }
    if (rc) {
        ck_error(c, "determinism", &err);
    } else if (differ) {
        ck_report(c, (c->e->desc.caps & K3RT_CAP_DETERMINISTIC) ? CK_FAIL : CK_SKIP,
                  "determinism", "two instances given the same routing differ in the bias, the "
                  "auxiliary loss or d_scores%s", (c->e->desc.caps & K3RT_CAP_DETERMINISTIC)
                                                      ? "" : " (not declared deterministic)");
    } else {
        ck_report(c, CK_PASS, "determinism", "two instances given the same routing for 5 steps: "
                  "bias%s bitwise equal", rig_has_aux_loss(&a.m)
                                              ? ", auxiliary loss and d_scores" : "");
    }
    changed = !rc && memcmp(first, a.bias, (size_t)a.E * sizeof(float));
    /* state: a fresh instance loaded after step 5 continues as the original */
    if (!rc && !differ) {
        rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &l, &err);
        if (!rc && !c->e->inst.state) {
            if (changed)
                ck_report(c, CK_FAIL, "state()", "the bias changes from step to step but there "
                          "is no state(): a checkpoint would lose it");
            else
                ck_report(c, CK_PASS, "state()", "none, and none needed: the bias does not "
                          "change");
        } else if (!rc) {
            l.rng = a.rng;  /* the same routing from here on */
            rc = ck_state_copy(&a.m, &l.m, a.s, &n_state, &err);
            int same = 1;
            for (int64_t step = 6; step <= 8 && !rc && same; step++) {
                rc = bal_step(&a, step, &err);
                if (!rc)
                    rc = bal_step(&l, step, &err);
                same = !rc && !memcmp(a.bias, l.bias, (size_t)a.E * sizeof(float)) &&
                       !memcmp(&a.loss, &l.loss, sizeof a.loss);
            }
            if (rc)
                ck_error(c, "state()", &err);
            else if (!same)
                ck_report(c, CK_FAIL, "state()", "an instance loaded with the %d state tensors "
                          "after step 5 diverges from the original in steps 6-8: state() "
                          "misses something the updates depend on", n_state);
            else
                ck_report(c, CK_PASS, "state()", "%d tensor%s saved after step 5 and loaded "
                          "into a fresh instance: steps 6-8 identical bit for bit", n_state,
                          n_state == 1 ? "" : "s");
        } else {
            ck_error(c, "state()", &err);
        }
    }
    bal_close(&a), bal_close(&b), bal_close(&l);
}

/* d_scores against finite differences of the loss in the scores (the routing held fixed). */
static void check_aux_loss(check_ctx *c)
{
    if (!c->e->vt.balancer.aux_loss)
        return;
    bal_run r = {0};
    k3rt_error err = {0};
    int rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &r, &err);
    if (!rc)
        rc = bal_micro(&r, 1.0, &err);
    int64_t ns = r.N * r.E;
    float *g = rc ? NULL : malloc((size_t)ns * sizeof *g);
    if (!rc && !g)
        rc = k3rt_fail(&err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        memcpy(g, r.ds, (size_t)ns * sizeof *g);
    double loss1 = r.loss, worst = 0, rms = 0;
    char what[256] = "";
    k3rt_routing rt = bal_routing(&r);
    k3rt_tensor ds = k3rt_tensor_view(r.ds, K3RT_F32, K3RT_DEVICE_CPU, 2, r.N, r.E, 0, 0);
    /* scale: d_scores doubles, the loss stays */
    if (!rc)
        rc = rig_aux_loss(&r.m, &rt, 2.0, &r.loss, ds, &err);
    double scale_err = 0;
    for (int64_t i = 0; i < ns && !rc; i++) {
        scale_err = fmax(scale_err, fabs(r.ds[i] - 2.0f * g[i]));
        rms += (double)g[i] * g[i];
    }
    rms = sqrt(rms / (double)(ns ? ns : 1));
    int scale_ok = !rc && r.loss == loss1 && scale_err <= 1e-6 * (2 * rms + 1e-30);
    /* the device form, where present: the same loss added into a sum, the same d_scores */
    int has_add = c->e->vt.balancer.aux_loss_add != NULL, add_ok = 1;
    double sum = 0.5, host_sum = 0;
    if (!rc && scale_ok && has_add) {
        k3rt_tensor st = k3rt_tensor_view(&sum, K3RT_F64, K3RT_DEVICE_CPU, 1, 1, 0, 0, 0);
        rc = rig_aux_loss_add(&r.m, &rt, 1.0, st, &host_sum, ds, &err);
        add_ok = !rc && sum == 0.5 + loss1 && host_sum == 0 &&
                 !memcmp(r.ds, g, (size_t)ns * sizeof *g);
    }
    k3rt_rng pick;
    k3rt_rng_seed(&pick, c->seed, 0xa0c5ull);
    int checked = 0;
    for (int s = 0; s < 4 * c->samples && !rc && scale_ok; s++, checked++) {
        int64_t i = (int64_t)(k3rt_rng_u64(&pick) % (uint64_t)ns);
        float keep = r.scores[i];
        double lp = 0, lm = 0, h = 1e-3 * fmax(fabs(keep), 0.1);
        float up = (float)(keep + h), dn = (float)(keep - h);
        r.scores[i] = up;
        rc = rig_aux_loss(&r.m, &rt, 1.0, &lp, ds, &err);
        r.scores[i] = dn;
        if (!rc)
            rc = rig_aux_loss(&r.m, &rt, 1.0, &lm, ds, &err);
        r.scores[i] = keep;
        double num = (lp - lm) / ((double)up - (double)dn);
        double rel = fabs(num - g[i]) / fmax(fmax(fabs(num), fabs((double)g[i])), 1e-3 * rms);
        if (rel > worst || checked == 0) {
            worst = rel;
            snprintf(what, sizeof what, "d_scores[%lld]: analytic %.6e, numeric %.6e",
                     (long long)i, g[i], num);
        }
    }
    double tol = 1e-3;  /* d_scores is f32 */
    if (rc)
        ck_error(c, "aux loss", &err);
    else if (!scale_ok)
        ck_report(c, CK_FAIL, "aux loss", "with scale 2 the loss must stay (%.9g, got %.9g) and "
                  "d_scores double (largest error %.3g)", loss1, r.loss, scale_err);
    else if (!add_ok)
        ck_report(c, CK_FAIL, "aux loss", "aux_loss_add must add aux_loss's value into the sum "
                  "(0.5 + %.17g, got %.17g) and write the same d_scores", loss1, sum);
    else
        ck_report(c, worst <= tol ? CK_PASS : CK_FAIL, "aux loss",
                  "loss %.6g; %d entries of d_scores against central differences, worst "
                  "relative error %.2e (tolerance %.0e): %s; scale 2 doubles d_scores%s", loss1,
                  checked, worst, tol, what,
                  has_add ? "; aux_loss_add adds the same loss, the same d_scores" : "");
    free(g);
    bal_close(&r);
}

/* Two ranks of a local world see different tokens and must end every step with the same bias. */
typedef struct dp_rank {
    check_ctx *c;
    k3rt_comm *comm;
    int rank, rc;
    float bias[256];
    k3rt_error err;
} dp_rank;

static void *dp_main(void *arg)
{
    dp_rank *d = arg;
    bal_run r = {0};
    d->rc = bal_open(d->c, K3RT_DEVICE_CPU, d->comm, 1 + (uint64_t)d->rank, &r, &d->err);
    for (int64_t step = 1; step <= 3 && !d->rc; step++)
        d->rc = bal_step(&r, step, &d->err);
    if (!d->rc)
        memcpy(d->bias, r.bias, (size_t)(r.E < 256 ? r.E : 256) * sizeof(float));
    bal_close(&r);
    return NULL;
}

static void check_data_parallel(check_ctx *c)
{
    k3rt_comm **comms = NULL;
    k3rt_error err = {0};
    if (comm_local_create(2, &comms, &err)) {
        ck_error(c, "data parallel", &err);
        return;
    }
    dp_rank d[2];
    memset(d, 0, sizeof d);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        d[i].c = c, d[i].comm = comms[i], d[i].rank = i;
        pthread_create(&th[i], NULL, dp_main, &d[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    comm_local_destroy(comms, 2);
    int E = c->experts < 256 ? c->experts : 256;
    if (d[0].rc || d[1].rc)
        ck_error(c, "data parallel", d[0].rc ? &d[0].err : &d[1].err);
    else if (memcmp(d[0].bias, d[1].bias, (size_t)E * sizeof(float)))
        ck_report(c, CK_FAIL, "data parallel", "two data-parallel ranks that saw different "
                  "tokens end a step with different biases: update() must combine the "
                  "statistics across the dp communicator");
    else
        ck_report(c, CK_PASS, "data parallel", "2 ranks of the local backend, different tokens: "
                  "the same bias bit for bit after each of 3 steps");
}

static void check_cuda(check_ctx *c)
{
    if (!ck_cuda_ready(c, "cuda"))
        return;
    bal_run h = {0}, g = {0};
    k3rt_error err = {0};
    int rc = bal_open(c, K3RT_DEVICE_CPU, NULL, 0, &h, &err);
    if (!rc)
        rc = bal_open(c, 0, NULL, 0, &g, &err);
    double worst = 0;
    for (int64_t step = 1; step <= 5 && !rc; step++) {
        rc = bal_step(&h, step, &err);
        if (!rc)
            rc = bal_step(&g, step, &err);
        if (!rc)
            worst = fmax(worst, ck_rel_rms(h.bias, g.bias, K3RT_F32, h.E));
        if (!rc && rig_has_aux_loss(&h.m))
            worst = fmax(worst, ck_rel_rms(h.ds, g.ds, K3RT_F32, h.N * h.E));
    }
    if (rc)
        ck_error(c, "cuda", &err);
    else
        ck_report(c, worst <= c->cuda_tol ? CK_PASS : CK_FAIL, "cuda", "5 steps on CUDA device "
                  "0 against the CPU: worst relative rms of the bias%s %.2e (tolerance %.0e)",
                  rig_has_aux_loss(&h.m) ? " and d_scores" : "", worst, c->cuda_tol);
    bal_close(&h);
    bal_close(&g);
}

void ck_balancer(check_ctx *c)
{
    if (c->experts < 2 || c->experts > 256 || c->top_k < 1 || c->top_k >= c->experts) {
        ck_report(c, CK_FAIL, "balancer", "--experts must be in 2..256 and --top-k in 1..experts-1");
        return;
    }
    check_update(c);
    check_determinism_and_state(c);
    check_aux_loss(c);
    check_data_parallel(c);
    check_cuda(c);
}
