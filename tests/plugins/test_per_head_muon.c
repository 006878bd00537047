/* per_head_muon through its vtable: per-head update equals a loop of Muon over the blocks,
 * head isolation (per-head) against coupling (plain Muon), the AdamW group in closed form,
 * routing and describe(), state save/restore, options and bad input. */
#include "muon_testkit.h"

/* ---- per-head equals a loop over the blocks ------------------------------------------------ */

enum { H = 4, E = 3 };

/* Block b of a stacked parameter into a separate [rows, cols] matrix (and back). */
static void take_block(const double *w, int axis, int64_t rows, int64_t cols, int64_t b,
                       double *out, int64_t parts)
{
    int64_t br = axis == 0 ? rows / parts : rows, bc = axis == 0 ? cols : cols / parts;
    for (int64_t r = 0; r < br; r++)
        for (int64_t c = 0; c < bc; c++)
            out[r * bc + c] = axis == 0 ? w[(b * br + r) * cols + c] : w[r * cols + b * bc + c];
}

/* Stacked: q [H*8, 20] axis 0, o [20, H*6] axis 1, experts [E, 10, 14]. Looped: each block as
 * its own matrix. Three steps from the same weights and gradients, 2 threads each. */
START_TEST(per_head_equals_loop_over_blocks)
{
    mt_spec stacked[3] = {
        {"q", K3RT_ROLE_HEAD_MATRIX, 2, {H * 8, 20, 0}, H, 0, 0, 0, 0},
        {"o", K3RT_ROLE_HEAD_MATRIX, 2, {20, H * 6, 0}, H, 1, 0, 0, 0},
        {"e", K3RT_ROLE_EXPERT_MATRIX, 3, {E, 10, 14}, 0, 0, E, 0, 0},
    };
    mt_spec loop[2 * H + E];
    static char names[2 * H + E][16];
    for (int b = 0; b < H; b++) {
        snprintf(names[b], 16, "q%d", b);
        snprintf(names[H + b], 16, "o%d", b);
        loop[b] = (mt_spec){names[b], K3RT_ROLE_MATRIX, 2, {8, 20, 0}, 0, 0, 0, 0, 0};
        loop[H + b] = (mt_spec){names[H + b], K3RT_ROLE_MATRIX, 2, {20, 6, 0}, 0, 0, 0, 0, 0};
    }
    for (int x = 0; x < E; x++) {
        snprintf(names[2 * H + x], 16, "e%d", x);
        loop[2 * H + x] = (mt_spec){names[2 * H + x], K3RT_ROLE_MATRIX, 2, {10, 14, 0}, 0, 0, 0,
                                    0, 0};
    }
    mt_harness a, l;
    mt_init(&a, K3RT_F64, "{}", stacked, 3, 2);
    mt_init(&l, K3RT_F64, "{}", loop, 2 * H + E, 2);
    const int64_t rows[3] = {H * 8, 20, E * 10}, cols[3] = {20, H * 6, 14};
    const int axis[3] = {0, 1, 0}, parts[3] = {H, H, E}, first[3] = {0, H, 2 * H};
    double *w[3], *blk = mt_alloc(200);
    for (int t = 0; t <= 3; t++) {
        for (int i = 0; i < 3; i++) {
            w[i] = mt_alloc(rows[i] * cols[i]);
            tu_randn(w[i], rows[i] * cols[i], t ? 1.0 : 0.5, 10 * (uint64_t)t + (uint64_t)i);
            t ? mt_set_grad(&a, i, w[i]) : mt_set_param(&a, i, w[i]);
            for (int b = 0; b < parts[i]; b++) {
                take_block(w[i], axis[i], rows[i], cols[i], b, blk, parts[i]);
                t ? mt_set_grad(&l, first[i] + b, blk) : mt_set_param(&l, first[i] + b, blk);
            }
            free(w[i]);
        }
        if (t)
            mt_step(&a, 0.02, t), mt_step(&l, 0.02, t);
    }
    double worst = 0, *got = mt_alloc(200), *want = mt_alloc(200), *all = mt_alloc(1000);
    for (int i = 0; i < 3; i++) {
        mt_get_param(&a, i, all);
        for (int b = 0; b < parts[i]; b++) {
            take_block(all, axis[i], rows[i], cols[i], b, got, parts[i]);
            mt_get_param(&l, first[i] + b, want);
            worst = fmax(worst, mt_max_abs_diff(got, want, rows[i] * cols[i] / parts[i]));
        }
    }
    printf("per-head (q axis 0, o axis 1) and per-expert after 3 steps vs a loop of Muon over "
           "the blocks: max |diff| %.3e\n", worst);
    ck_assert_msg(worst < 1e-14, "max diff %.3e", worst);
    free(blk), free(got), free(want), free(all);
    mt_free(&a), mt_free(&l);
}
END_TEST

/* One thread, two and three: the blocks are dealt differently (the 160 x 96 matrix costs more
 * than a thread's share with 2 or 3 threads and runs alone with a threaded BLAS) but each
 * block's arithmetic is its own, so the results agree. */
START_TEST(thread_count_does_not_change_the_result)
{
    mt_spec sp[3] = {
        {"big", K3RT_ROLE_MATRIX, 2, {160, 96, 0}, 0, 0, 0, 0, 0},
        {"q", K3RT_ROLE_HEAD_MATRIX, 2, {H * 8, 20, 0}, H, 0, 0, 0, 0},
        {"e", K3RT_ROLE_EXPERT_MATRIX, 3, {E, 10, 14}, 0, 0, E, 0, 0},
    };
    double *ref[3] = {NULL}, worst = 0;
    for (int threads = 1; threads <= 3; threads++) {
        mt_harness h;
        mt_init(&h, K3RT_F64, "{}", sp, 3, threads);
        for (int t = 0; t <= 2; t++) {
            for (int i = 0; i < 3; i++) {
                double *x = mt_alloc(mt_numel(&h, i));
                tu_randn(x, mt_numel(&h, i), 1.0, 500 + 10 * (uint64_t)t + (uint64_t)i);
                t ? mt_set_grad(&h, i, x) : mt_set_param(&h, i, x);
                free(x);
            }
            if (t)
                mt_step(&h, 0.02, t);
        }
        for (int i = 0; i < 3; i++) {
            double *got = mt_alloc(mt_numel(&h, i));
            mt_get_param(&h, i, got);
            if (threads == 1)
                ref[i] = got;
            else
                worst = fmax(worst, mt_max_abs_diff(got, ref[i], mt_numel(&h, i))), free(got);
        }
        mt_free(&h);
    }
    printf("2 and 3 threads against 1 thread after 2 steps: max |diff| %.3e\n", worst);
    ck_assert_msg(worst < 1e-13, "max diff %.3e", worst);
    for (int i = 0; i < 3; i++)
        free(ref[i]);
}
END_TEST

/* ---- isolation ------------------------------------------------------------------------------- */

/* One step of a head matrix from W0 with gradient G, then with head 1's gradient x100: the
 * largest change of the other heads' updates, relative to their size. */
static double isolation(int per_head, int axis)
{
    const int64_t rows = axis == 0 ? H * 16 : 48, cols = axis == 0 ? 48 : H * 16;
    const int64_t n = rows * cols;
    mt_spec sp = {"w", K3RT_ROLE_HEAD_MATRIX, 2, {rows, cols, 0}, H, axis, 0, 0, 0};
    char cfg[64];
    snprintf(cfg, sizeof cfg, "{\"per_head\": %s}", per_head ? "true" : "false");
    double *w0 = mt_alloc(n), *g = mt_alloc(n), *d[2];
    tu_randn(w0, n, 0.5, 5);
    tu_randn(g, n, 1.0, 6);
    for (int v = 0; v < 2; v++) {
        mt_harness h;
        mt_init(&h, K3RT_F64, cfg, &sp, 1, 2);
        mt_set_param(&h, 0, w0);
        if (v == 1)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++)
                    if ((axis == 0 ? r / 16 : c / 16) == 1)
                        g[r * cols + c] *= 100;
        mt_set_grad(&h, 0, g);
        mt_step(&h, 0.02, 1);
        d[v] = mt_alloc(n);
        mt_get_param(&h, 0, d[v]);
        for (int64_t i = 0; i < n; i++)
            d[v][i] -= w0[i];
        mt_free(&h);
    }
    double diff = 0, size = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            if ((axis == 0 ? r / 16 : c / 16) == 1)
                continue;
            int64_t i = r * cols + c;
            diff = fmax(diff, fabs(d[1][i] - d[0][i]));
            size = fmax(size, fabs(d[0][i]));
        }
    free(w0), free(g), free(d[0]), free(d[1]);
    return diff / size;
}

START_TEST(heads_are_isolated_per_head_and_coupled_in_plain_muon)
{
    for (int axis = 0; axis < 2; axis++) {
        double ph = isolation(1, axis), plain = isolation(0, axis);
        printf("head 1 gradient x100 (axis %d): other heads' update changes by %.3e (per-head) "
               "and %.3e (plain Muon), relative to the largest update element\n", axis, ph,
               plain);
        ck_assert_msg(ph == 0, "per-head: other heads changed by %.3e", ph);
        ck_assert_msg(plain > 0.1, "plain Muon: other heads changed by only %.3e", plain);
    }
}
END_TEST

/* ---- AdamW group ----------------------------------------------------------------------------- */

enum { NA = 8 };
static const mt_spec ADAM[NA] = {
    {"embed.weight", K3RT_ROLE_EMBEDDING, 2, {6, 4, 0}, 0, 0, 0, 0, 0},
    {"norm.weight", K3RT_ROLE_NORM_GAIN, 1, {4, 0, 0}, 0, 0, 0, 0, 0},
    {"router", K3RT_ROLE_ROUTER, 2, {3, 4, 0}, 0, 0, 0, 0, 0},
    {"head.weight", K3RT_ROLE_OUTPUT_HEAD, 2, {6, 4, 0}, 0, 0, 0, 0, 0},
    {"A_log", K3RT_ROLE_VECTOR, 1, {5, 0, 0}, 0, 0, 0, 0, 0},
    {"conv", K3RT_ROLE_CONV, 2, {4, 3, 0}, 0, 0, 0, 0, 0},
    {"tied", K3RT_ROLE_EMBEDDING, 2, {2, 4, 0}, 0, 0, 0, 0, K3RT_PARAM_NO_DECAY},
    {"w", K3RT_ROLE_MATRIX, 2, {4, 4, 0}, 0, 0, 0, 0, 0},
};
static const int ADAM_DECAYED[NA - 1] = {1, 0, 1, 1, 0, 0, 0};
static const double ADAM_LR[3] = {1e-2, 2e-2, 5e-3};

static void adamw_closed_form(int dtype, const char *cfg, double b1, double b2, double eps,
                              double wd, double tol)
{
    mt_harness h;
    mt_init(&h, dtype, cfg, ADAM, NA, 2);
    double *p[NA], *g = mt_alloc(64), *got = mt_alloc(64);
    for (int i = 0; i < NA; i++) {
        p[i] = mt_alloc(mt_numel(&h, i));
        tu_randn(p[i], mt_numel(&h, i), 1.0, 1 + (uint64_t)i);
        mt_set_param(&h, i, p[i]);
    }
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < NA; i++) {
            tu_randn(g, mt_numel(&h, i), 0.5, 100 * (uint64_t)t + (uint64_t)i);
            mt_set_grad(&h, i, g);
        }
        mt_step(&h, ADAM_LR[t - 1], t);
    }
    double worst = 0;
    for (int i = 0; i < NA - 1; i++) {  /* textbook AdamW with decoupled decay, in double */
        int64_t n = mt_numel(&h, i);
        double *m = mt_alloc(n), *v = mt_alloc(n);
        for (int t = 1; t <= 3; t++) {
            tu_randn(g, n, 0.5, 100 * (uint64_t)t + (uint64_t)i);
            double lr = ADAM_LR[t - 1];
            for (int64_t j = 0; j < n; j++) {
                m[j] = b1 * m[j] + (1 - b1) * g[j];
                v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j];
                double mh = m[j] / (1 - pow(b1, t)), vh = v[j] / (1 - pow(b2, t));
                p[i][j] = p[i][j] - (ADAM_DECAYED[i] ? lr * wd * p[i][j] : 0.0) -
                          lr * mh / (sqrt(vh) + eps);
            }
        }
        mt_get_param(&h, i, got);
        for (int64_t j = 0; j < n; j++)
            worst = fmax(worst, fabs(got[j] - p[i][j]) / fmax(1.0, fabs(p[i][j])));
        free(m), free(v);
    }
    printf("AdamW group %s %s: worst relative error %.2e over 3 steps\n", k3rt_dtype_name(dtype),
           cfg, worst);
    ck_assert_msg(worst < tol, "error %.3e", worst);
    for (int i = 0; i < NA; i++)
        free(p[i]);
    free(g), free(got);
    mt_free(&h);
}

START_TEST(adamw_group_closed_form)
{
    adamw_closed_form(K3RT_F64, "{}", 0.9, 0.95, 1e-8, 0.1, 1e-14);
    adamw_closed_form(K3RT_F64, "{\"adamw_beta1\": 0.8, \"adamw_beta2\": 0.9, \"adamw_eps\": "
                      "1e-3, \"adamw_weight_decay\": 0.3, \"weight_decay\": 0.7}", 0.8, 0.9,
                      1e-3, 0.3, 1e-14);
    adamw_closed_form(K3RT_F32, "{}", 0.9, 0.95, 1e-8, 0.1, 1e-6);
}
END_TEST

/* ---- routing and describe() ------------------------------------------------------------------ */

START_TEST(describe_by_role)
{
    mt_spec sp[7] = {
        {"q", K3RT_ROLE_HEAD_MATRIX, 2, {H * 8, 20, 0}, H, 0, 0, K3RT_QK_SQRT, 0},
        {"qs", K3RT_ROLE_HEAD_MATRIX, 2, {H * 2, 20, 0}, H, 0, 0, K3RT_QK_FULL, 0},
        {"o", K3RT_ROLE_HEAD_MATRIX, 2, {20, H * 6, 0}, H, 1, 0, 0, 0},
        {"e", K3RT_ROLE_EXPERT_MATRIX, 3, {16, 4, 6}, 0, 0, 16, 0, 0},
        {"w", K3RT_ROLE_MATRIX, 2, {4, 4, 0}, 0, 0, 0, 0, 0},
        {"w_nd", K3RT_ROLE_MATRIX, 2, {4, 4, 0}, 0, 0, 0, 0, K3RT_PARAM_NO_DECAY},
        {"g", K3RT_ROLE_NORM_GAIN, 1, {4, 0, 0}, 0, 0, 0, 0, 0},
    };
    const char *want[2][7] = {
        {"muon per-head x4 (axis 0), qk-clip sqrt", "muon per-head x4 (axis 0), qk-clip full",
         "muon per-head x4 (axis 1)", "muon per-expert x16", "muon", "muon (no decay)",
         "adamw (no decay)"},
        {"muon", "muon", "muon", "muon per-expert x16", "muon", "muon (no decay)",
         "adamw (no decay)"},
    };
    const char *cfg[2] = {"{}", "{\"per_head\": false, \"qk_clip\": false}"};
    for (int v = 0; v < 2; v++) {
        mt_harness h;
        mt_init(&h, K3RT_F64, cfg[v], sp, 7, 1);
        char buf[96];
        for (int i = 0; i < 7; i++) {
            ck_assert_int_eq(rig_describe(&h.m, i, buf, sizeof buf),
                             0);
            ck_assert_str_eq(buf, want[v][i]);
        }
        ck_assert_int_ne(rig_describe(&h.m, 7, buf, sizeof buf), 0);
        k3rt_memory mem;
        k3rt_error err = {0};
        TU_OK(rig_memory(&h.m, 1, 1, &mem, &err), err);
        /* momentum for the 6 Muon params, m and v for the gain */
        int64_t muon = H * 8 * 20 + H * 2 * 20 + 20 * H * 6 + 16 * 24 + 16 + 16;
        ck_assert_int_eq(mem.state_bytes, (muon + 2 * 4) * 8);
        mt_free(&h);
    }
}
END_TEST

/* ---- state ------------------------------------------------------------------------------------- */

static const mt_spec MIX[5] = {
    {"q", K3RT_ROLE_HEAD_MATRIX, 2, {H * 6, 10, 0}, H, 0, 0, 0, 0},
    {"e", K3RT_ROLE_EXPERT_MATRIX, 3, {E, 5, 7}, 0, 0, E, 0, 0},
    {"w", K3RT_ROLE_MATRIX, 2, {9, 5, 0}, 0, 0, 0, 0, 0},
    {"embed", K3RT_ROLE_EMBEDDING, 2, {6, 4, 0}, 0, 0, 0, 0, 0},
    {"gain", K3RT_ROLE_NORM_GAIN, 1, {5, 0, 0}, 0, 0, 0, 0, 0},
};

static void mix_step(mt_harness *h, int t, int64_t number)
{
    for (int i = 0; i < 5; i++) {
        double *g = mt_alloc(mt_numel(h, i));
        tu_randn(g, mt_numel(h, i), 1.0, 300 + 10 * (uint64_t)t + (uint64_t)i);
        mt_set_grad(h, i, g);
        free(g);
    }
    mt_step(h, 0.01 * t, number);
}

static void mix_init(mt_harness *h, int dtype)
{
    mt_init(h, dtype, "{}", MIX, 5, 2);
    for (int i = 0; i < 5; i++) {
        double *w = mt_alloc(mt_numel(h, i));
        tu_randn(w, mt_numel(h, i), 0.5, 200 + (uint64_t)i);
        mt_set_param(h, i, w);
        free(w);
    }
}

typedef struct snapshot {
    int n;
    char names[16][128];
    void *data[16];
    size_t bytes[16];
} snapshot;

static void save_state(mt_harness *h, snapshot *s)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&h->m, &sink, &err), err);
    ck_assert_int_le(sink.n, 16);
    s->n = sink.n;
    for (int i = 0; i < sink.n; i++) {
        snprintf(s->names[i], sizeof s->names[i], "%s", sink.items[i].name);
        s->bytes[i] = k3rt_tensor_bytes(&sink.items[i].t);
        s->data[i] = malloc(s->bytes[i]);
        memcpy(s->data[i], sink.items[i].t.data, s->bytes[i]);
    }
    tensor_sink_free(&sink);
}

static void load_state(mt_harness *h, const snapshot *s)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_state(&h->m, &sink, &err), err);
    ck_assert_int_eq(sink.n, s->n);
    for (int i = 0; i < s->n; i++) {
        ck_assert_str_eq(sink.items[i].name, s->names[i]);
        ck_assert_int_eq(k3rt_tensor_bytes(&sink.items[i].t), s->bytes[i]);
        memcpy(sink.items[i].t.data, s->data[i], s->bytes[i]);
    }
    tensor_sink_free(&sink);
    TU_OK(rig_state_loaded(&h->m, &err), err);
}

static int same_params(const mt_harness *a, const mt_harness *b)
{
    for (int i = 0; i < a->n; i++)
        if (memcmp(a->refs[i].param.data, b->refs[i].param.data,
                   k3rt_tensor_bytes(&a->refs[i].param)))
            return 0;
    return 1;
}

static void copy_params(mt_harness *dst, const mt_harness *src)
{
    for (int i = 0; i < src->n; i++)
        memcpy(dst->refs[i].param.data, src->refs[i].param.data,
               k3rt_tensor_bytes(&src->refs[i].param));
}

static void round_trip(int dtype)
{
    mt_harness a, b, fresh;
    mix_init(&a, dtype);
    mix_step(&a, 1, 1);
    mix_step(&a, 2, 2);
    snapshot snap;
    save_state(&a, &snap);
    const char *names[] = {"q.momentum", "e.momentum", "w.momentum", "embed.m", "embed.v",
                           "gain.m", "gain.v", "step"};
    ck_assert_int_eq(snap.n, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_str_eq(snap.names[i], names[i]);
    ck_assert_int_eq(*(int64_t *)snap.data[7], 2);
    mix_init(&b, dtype), mix_init(&fresh, dtype);
    copy_params(&b, &a), copy_params(&fresh, &a);
    load_state(&b, &snap);
    mix_step(&a, 3, 3);
    mix_step(&b, 3, 3);
    ck_assert_msg(same_params(&a, &b), "restored state: step 3 differs");
    /* a fresh instance (zero state) lands elsewhere: the state carried */
    mix_step(&fresh, 3, 3);
    ck_assert(!same_params(&a, &fresh));
    printf("state round trip %s: step 3 after restore is bitwise equal\n",
           k3rt_dtype_name(dtype));
    for (int i = 0; i < snap.n; i++)
        free(snap.data[i]);
    mt_free(&a), mt_free(&b), mt_free(&fresh);
}

START_TEST(state_round_trip_is_bitwise)
{
    round_trip(K3RT_F64);
    round_trip(K3RT_F32);
}
END_TEST

/* ---- options and layouts refused ------------------------------------------------------------------- */

static void expect_refused(const char *cfg, const mt_spec *sp, int n, int code, const char *msg)
{
    mt_harness h;
    k3rt_error err = {0};
    int rc = mt_try(&h, K3RT_F64, cfg, sp, n, 1, &err);
    ck_assert_msg(rc == code, "%s: status %d (%s)", cfg, rc, err.msg);
    ck_assert_msg(strstr(err.msg, msg) != NULL, "message '%s' lacks '%s'", err.msg, msg);
    mt_free(&h);
}

START_TEST(options_and_layouts_refused)
{
    mt_spec ok = {"w", K3RT_ROLE_MATRIX, 2, {4, 4, 0}, 0, 0, 0, 0, 0};
    expect_refused("{\"momentun\": 0.9}", &ok, 1, K3RT_ERR_INVALID,
                   "unknown key 'momentun'; did you mean 'momentum'?");
    expect_refused("{\"momentum\": 1}", &ok, 1, K3RT_ERR_INVALID, "key 'momentum' must be < 1");
    expect_refused("{\"adamw_beta2\": 1}", &ok, 1, K3RT_ERR_INVALID,
                   "key 'adamw_beta2' must be < 1");
    expect_refused("{\"qk_tau\": 0}", &ok, 1, K3RT_ERR_INVALID, "key 'qk_tau' must be > 0");
    expect_refused("{\"ns_steps\": 0}", &ok, 1, K3RT_ERR_INVALID, "ns_steps");
    mt_spec bad_heads = {"q", K3RT_ROLE_HEAD_MATRIX, 2, {10, 4, 0}, 3, 0, 0, 0, 0};
    expect_refused("{}", &bad_heads, 1, K3RT_ERR_INVALID,
                   "parameter q (head_matrix): 3 heads do not divide its rows (10)");
    mt_spec bad_axis = {"q", K3RT_ROLE_HEAD_MATRIX, 2, {12, 4, 0}, 3, 2, 0, 0, 0};
    expect_refused("{}", &bad_axis, 1, K3RT_ERR_INVALID, "head_axis must be 0 (rows) or 1");
    mt_spec flat = {"w", K3RT_ROLE_MATRIX, 1, {16, 0, 0}, 0, 0, 0, 0, 0};
    expect_refused("{}", &flat, 1, K3RT_ERR_INVALID,
                   "parameter w (role matrix) has 1 dimensions; Muon expects [out, in]");
    mt_spec experts = {"e", K3RT_ROLE_EXPERT_MATRIX, 3, {4, 2, 2}, 0, 0, 5, 0, 0};
    expect_refused("{}", &experts, 1, K3RT_ERR_INVALID,
                   "parameter e declares 5 experts but its shape starts with 4");
    mt_spec clip = {"k", K3RT_ROLE_MATRIX, 2, {8, 4, 0}, 0, 0, 0, K3RT_QK_SQRT, 0};
    expect_refused("{}", &clip, 1, K3RT_ERR_INVALID, "parameter k (qk_clip): 0 heads");
    mt_spec role = {"x", 42, 2, {8, 4, 0}, 0, 0, 0, 0, 0};
    expect_refused("{}", &role, 1, K3RT_ERR_INVALID, "parameter x has unknown role 42");
    /* defaults are filled in */
    mt_harness h;
    mt_init(&h, K3RT_F64, "{}", &ok, 1, 1);
    const char *keys[] = {"momentum", "scale", "weight_decay", "adamw_beta2", "qk_tau"};
    const double vals[] = {0.95, 0.2, 0.1, 0.95, 100};
    for (int i = 0; i < 5; i++)
        ck_assert(json_number_value(json_object_get(h.m.config, keys[i])) == vals[i]);
    ck_assert(json_is_true(json_object_get(h.m.config, "nesterov")));
    ck_assert(json_is_true(json_object_get(h.m.config, "per_head")));
    ck_assert_int_eq(json_integer_value(json_object_get(h.m.config, "ns_steps")), 5);
    mt_free(&h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("per_head_muon");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, per_head_equals_loop_over_blocks);
    tcase_add_test(tc, thread_count_does_not_change_the_result);
    tcase_add_test(tc, heads_are_isolated_per_head_and_coupled_in_plain_muon);
    tcase_add_test(tc, adamw_group_closed_form);
    tcase_add_test(tc, describe_by_role);
    tcase_add_test(tc, state_round_trip_is_bitwise);
    tcase_add_test(tc, options_and_layouts_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
