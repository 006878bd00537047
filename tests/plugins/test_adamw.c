/* adamw: three steps against a closed form written here, decay by role, state save/restore,
 * f32, options and bad input. */
#include "testutil/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

static const plugin_entry *plugin(void) { return tu_plugin("adamw"); }

/* A decayed matrix, a norm gain, an embedding marked no-decay and a router. */
enum { NP = 4 };
static const char *const NAMES[NP] = {"layers.0.mixer.w", "norm.weight", "embed.weight",
                                      "layers.0.ffn.router"};
static const int ROLES[NP] = {K3RT_ROLE_MATRIX, K3RT_ROLE_NORM_GAIN, K3RT_ROLE_EMBEDDING,
                              K3RT_ROLE_ROUTER};
static const int DECAYED[NP] = {1, 0, 0, 1};
static const int64_t SHAPE[NP][2] = {{3, 4}, {4, 1}, {5, 2}, {2, 4}};
static const double LR[3] = {1e-2, 2e-2, 5e-3};

typedef struct harness {
    rig m;
    k3rt_stream *s;
    int dtype;
    k3rt_param_decl decls[NP];
    k3rt_param_ref refs[NP];
} harness;

static int64_t numel(int i) { return SHAPE[i][0] * SHAPE[i][1]; }

/* Fills parameter values (seed 1) into p[i] as doubles. */
static void initial_params(double *p[NP])
{
    for (int i = 0; i < NP; i++)
        tu_randn(p[i], numel(i), 1.0, 1 + (uint64_t)i);
}

/* The gradient of parameter i at step t (1-based). */
static void grad_at(int i, int t, double *g)
{
    tu_randn(g, numel(i), 0.5, 100 * (uint64_t)t + (uint64_t)i);
}

static int harness_try(harness *h, int dtype, const char *cfg_text, k3rt_error *err)
{
    memset(h, 0, sizeof *h);
    h->dtype = dtype;
    h->s = tu_cpu_stream(1);
    double *init[NP];
    for (int i = 0; i < NP; i++)
        init[i] = malloc((size_t)numel(i) * sizeof(double));
    initial_params(init);
    for (int i = 0; i < NP; i++) {
        k3rt_param_decl *d = &h->decls[i];
        d->struct_size = sizeof *d;
        d->role = ROLES[i];
        d->name = NAMES[i];
        d->ndim = SHAPE[i][1] == 1 ? 1 : 2;
        d->shape[0] = SHAPE[i][0];
        d->shape[1] = SHAPE[i][1] == 1 ? 0 : SHAPE[i][1];
        d->flags = i == 2 ? K3RT_PARAM_NO_DECAY : 0;
        k3rt_param_ref *r = &h->refs[i];
        r->struct_size = sizeof *r;
        r->index = i;
        r->name = NAMES[i];
        r->decl = d;
        r->param = k3rt_tensor_view(malloc((size_t)numel(i) * k3rt_dtype_size(dtype)), dtype,
                                    K3RT_DEVICE_CPU, d->ndim, d->shape[0], d->shape[1], 0, 0);
        r->grad = r->param;
        r->grad.data = calloc((size_t)numel(i), k3rt_dtype_size(dtype));
        TU_OK(k3rt_convert(r->param.data, dtype, init[i], K3RT_F64, numel(i), err), *err);
        free(init[i]);
    }
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = K3RT_DEVICE_CPU;
    a.layer = -1;
    a.params = h->refs;
    a.n_params = NP;
    a.stream = h->s;
    int rc = rig_create(&h->m, plugin(), cfg, &a, "optimizer", err);
    json_decref(cfg);
    return rc;
}

static void harness_init(harness *h, int dtype, const char *cfg_text)
{
    k3rt_error err = {0};
    TU_OK(harness_try(h, dtype, cfg_text, &err), err);
}

static void harness_free(harness *h)
{
    for (int i = 0; i < NP; i++)
        free(h->refs[i].param.data), free(h->refs[i].grad.data);
    rig_destroy(&h->m);
    k3rt_stream_destroy(h->s);
}

/* Sets the gradients of step t and runs the optimizer with engine step number `number`. */
static int step(harness *h, int t, int64_t number, k3rt_error *err)
{
    for (int i = 0; i < NP; i++) {
        double *g = malloc((size_t)numel(i) * sizeof(double));
        grad_at(i, t, g);
        TU_OK(k3rt_convert(h->refs[i].grad.data, h->dtype, g, K3RT_F64, numel(i), err), *err);
        free(g);
    }
    return rig_step(&h->m, NULL, LR[t - 1], number, h->refs, NP, err);
}

static void run_step(harness *h, int t)
{
    k3rt_error err = {0};
    TU_OK(step(h, t, t, &err), err);
}

/* Textbook AdamW with decoupled decay, in double, three steps. */
static void expected(double b1, double b2, double eps, double wd, double *p[NP])
{
    initial_params(p);
    for (int i = 0; i < NP; i++) {
        int64_t n = numel(i);
        double *m = calloc((size_t)n, sizeof(double)), *v = calloc((size_t)n, sizeof(double));
        double *g = malloc((size_t)n * sizeof(double));
        for (int t = 1; t <= 3; t++) {
            grad_at(i, t, g);
            for (int64_t j = 0; j < n; j++) {
                m[j] = b1 * m[j] + (1 - b1) * g[j];
                v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j];
                double mhat = m[j] / (1 - pow(b1, t)), vhat = v[j] / (1 - pow(b2, t));
                double decay = DECAYED[i] ? LR[t - 1] * wd * p[i][j] : 0.0;
                p[i][j] = p[i][j] - decay - LR[t - 1] * mhat / (sqrt(vhat) + eps);
            }
        }
        free(m), free(v), free(g);
    }
}

static double worst_error(const harness *h, double *const want[NP])
{
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        double *got = malloc((size_t)numel(i) * sizeof(double));
        k3rt_error err = {0};
        TU_OK(k3rt_convert(got, K3RT_F64, h->refs[i].param.data, h->dtype, numel(i), &err),
              err);
        for (int64_t j = 0; j < numel(i); j++)
            worst = fmax(worst, fabs(got[j] - want[i][j]) / fmax(1.0, fabs(want[i][j])));
        free(got);
    }
    return worst;
}

static void closed_form(int dtype, const char *cfg, double b1, double b2, double eps, double wd,
                        double tol)
{
    harness h;
    harness_init(&h, dtype, cfg);
    for (int t = 1; t <= 3; t++)
        run_step(&h, t);
    double *want[NP], *nodecay[NP];
    for (int i = 0; i < NP; i++) {
        want[i] = malloc((size_t)numel(i) * sizeof(double));
        nodecay[i] = malloc((size_t)numel(i) * sizeof(double));
    }
    expected(b1, b2, eps, wd, want);
    expected(b1, b2, eps, 0.0, nodecay);
    double e = worst_error(&h, want), e_nodecay = worst_error(&h, nodecay);
    printf("adamw %s %s: worst relative error %.2e over 3 steps (%.2e against no decay)\n",
           k3rt_dtype_name(dtype), cfg, e, e_nodecay);
    ck_assert_msg(e < tol, "error %.3e", e);
    ck_assert(e_nodecay > 1e-4);  /* the decay is there and matters at this tolerance */
    for (int i = 0; i < NP; i++)
        free(want[i]), free(nodecay[i]);
    harness_free(&h);
}

START_TEST(three_steps_closed_form)
{
    closed_form(K3RT_F64, "{}", 0.9, 0.95, 1e-8, 0.1, 1e-14);
    closed_form(K3RT_F64, "{\"beta1\": 0.8, \"beta2\": 0.9, \"eps\": 1e-3, "
                "\"weight_decay\": 0.3}", 0.8, 0.9, 1e-3, 0.3, 1e-14);
    closed_form(K3RT_F32, "{}", 0.9, 0.95, 1e-8, 0.1, 1e-6);
}
END_TEST

START_TEST(describe_by_role)
{
    harness h;
    harness_init(&h, K3RT_F64, "{}");
    char buf[64];
    for (int i = 0; i < NP; i++) {
        ck_assert_int_eq(rig_describe(&h.m, i, buf, sizeof buf), 0);
        ck_assert_str_eq(buf, DECAYED[i] ? "adamw" : "adamw (no decay)");
    }
    ck_assert_int_ne(rig_describe(&h.m, NP, buf, sizeof buf), 0);
    k3rt_memory mem;
    k3rt_error err = {0};
    TU_OK(rig_memory(&h.m, 1, 1, &mem, &err), err);
    ck_assert_int_eq(mem.state_bytes, 2 * (12 + 4 + 10 + 8) * 8);
    harness_free(&h);
}
END_TEST

/* ---- state -------------------------------------------------------------------------------- */

typedef struct snapshot {
    int n;
    char names[2 * NP + 1][128];
    void *data[2 * NP + 1];
    size_t bytes[2 * NP + 1];
} snapshot;

static void save_state(harness *h, snapshot *s)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&h->m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 2 * NP + 1);
    s->n = sink.n;
    for (int i = 0; i < sink.n; i++) {
        snprintf(s->names[i], sizeof s->names[i], "%s", sink.items[i].name);
        s->bytes[i] = k3rt_tensor_bytes(&sink.items[i].t);
        s->data[i] = malloc(s->bytes[i]);
        memcpy(s->data[i], sink.items[i].t.data, s->bytes[i]);
    }
    tensor_sink_free(&sink);
}

/* Writes a snapshot into h's live state tensors by name, then calls state_loaded. */
static void load_state(harness *h, const snapshot *s)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&h->m, &sink, &err), err);
    ck_assert_int_eq(sink.n, s->n);
    for (int i = 0; i < s->n; i++) {
        int found = 0;
        for (int k = 0; k < sink.n && !found; k++) {
            if (strcmp(sink.items[k].name, s->names[i]))
                continue;
            ck_assert_int_eq(k3rt_tensor_bytes(&sink.items[k].t), s->bytes[i]);
            memcpy(sink.items[k].t.data, s->data[i], s->bytes[i]);
            found = 1;
        }
        ck_assert_msg(found, "state %s missing", s->names[i]);
    }
    tensor_sink_free(&sink);
    TU_OK(rig_state_loaded(&h->m, &err), err);
}

static int64_t state_step(harness *h)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&h->m, &sink, &err), err);
    const tensor_sink_item *it = &sink.items[sink.n - 1];
    ck_assert_str_eq(it->name, "step");
    ck_assert_int_eq(it->t.dtype, K3RT_I64);
    ck_assert_int_eq(k3rt_tensor_numel(&it->t), 1);
    int64_t v = *(const int64_t *)it->t.data;
    tensor_sink_free(&sink);
    return v;
}

static void copy_params(harness *dst, const harness *src)
{
    for (int i = 0; i < NP; i++)
        memcpy(dst->refs[i].param.data, src->refs[i].param.data,
               k3rt_tensor_bytes(&src->refs[i].param));
}

static int same_params(const harness *a, const harness *b)
{
    for (int i = 0; i < NP; i++)
        if (memcmp(a->refs[i].param.data, b->refs[i].param.data,
                   k3rt_tensor_bytes(&a->refs[i].param)))
            return 0;
    return 1;
}

START_TEST(state_round_trip)
{
    harness a, b, fresh;
    harness_init(&a, K3RT_F64, "{}");
    run_step(&a, 1);
    run_step(&a, 2);
    ck_assert_int_eq(state_step(&a), 2);
    snapshot snap;
    save_state(&a, &snap);
    for (int i = 0; i < NP; i++) {
        size_t len = strlen(NAMES[i]);  /* "<param>.m", then "<param>.v" */
        ck_assert(!strncmp(snap.names[2 * i], NAMES[i], len));
        ck_assert(!strncmp(snap.names[2 * i + 1], NAMES[i], len));
        ck_assert_str_eq(snap.names[2 * i] + len, ".m");
        ck_assert_str_eq(snap.names[2 * i + 1] + len, ".v");
    }
    ck_assert_str_eq(snap.names[2 * NP], "step");

    harness_init(&b, K3RT_F64, "{}");
    harness_init(&fresh, K3RT_F64, "{}");
    copy_params(&b, &a);
    copy_params(&fresh, &a);
    load_state(&b, &snap);
    ck_assert_int_eq(state_step(&b), 2);

    run_step(&a, 3);
    run_step(&b, 3);
    ck_assert(same_params(&a, &b));
    ck_assert_int_eq(state_step(&b), 3);
    /* A fresh instance (zero moments, step 3) lands elsewhere: the state carried. */
    run_step(&fresh, 3);
    ck_assert(!same_params(&a, &fresh));
    for (int i = 0; i < snap.n; i++)
        free(snap.data[i]);
    harness_free(&a), harness_free(&b), harness_free(&fresh);
}
END_TEST

/* ---- options and refusals ---------------------------------------------------------------- */

static void expect_refused(const char *cfg, const char *msg)
{
    harness h;
    k3rt_error err = {0};
    int rc = harness_try(&h, K3RT_F64, cfg, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, msg) != NULL, "%s: message '%s' lacks '%s'", cfg, err.msg,
                  msg);
    harness_free(&h);
}

START_TEST(options_refused)
{
    expect_refused("{\"weight_decy\": 0.1}", "unknown key 'weight_decy'; did you mean "
                   "'weight_decay'?");
    expect_refused("{\"beta1\": 1.0}", "key 'beta1' must be < 1");
    expect_refused("{\"beta2\": 1.5}", "key 'beta2' must be in [0, 1], got 1.5");
    expect_refused("{\"eps\": 0}", "key 'eps' must be > 0, got 0");
    expect_refused("{\"weight_decay\": -1}", "key 'weight_decay' must be in [0, 100], got -1");
    /* defaults are filled in */
    harness h;
    harness_init(&h, K3RT_F64, "{}");
    ck_assert(json_real_value(json_object_get(h.m.config, "beta2")) == 0.95);
    ck_assert(json_real_value(json_object_get(h.m.config, "weight_decay")) == 0.1);
    harness_free(&h);
}
END_TEST

/* The host checks the step's arguments (tests/unit/test_rig.c); what adamw itself refuses is
 * a master-weight dtype its CUDA step does not update. */
START_TEST(cuda_needs_f32_master_weights)
{
    harness h;
    harness_init(&h, K3RT_F64, "{}");
    k3rt_error err = {0};
    const plugin_entry *e = plugin();
    if (!(e->desc.caps & K3RT_CAP_CUDA) || k3rt_cuda_device_count() < 1) {
        harness_free(&h);
        return;  /* nothing to ask of a CPU-only build */
    }
    rig m;
    k3rt_create_args c;
    memset(&c, 0, sizeof c);
    c.dtype = K3RT_BF16, c.device = 0, c.d_model = 4, c.n_layers = 1;
    c.stream = h.s;
    ck_assert_int_eq(rig_create(&m, e, NULL, &c, "optimizer", &err), K3RT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(err.msg, "master weights on CUDA must be f32"), "%s", err.msg);
    harness_free(&h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adamw");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, three_steps_closed_form);
    tcase_add_test(tc, describe_by_role);
    tcase_add_test(tc, state_round_trip);
    tcase_add_test(tc, options_refused);
    tcase_add_test(tc, cuda_needs_f32_master_weights);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
