/* per_head_muon, QK-clip on an MLA-shaped layer: the logits of a toy NoPE MLA are recomputed
 * from the weights, a head whose max logit exceeds tau comes out at tau, the other heads, the
 * shared key and the values are untouched; the clip composes with the step as a per-head
 * factor; head_axis 1 clips columns; -inf means "no tokens seen"; NaN is refused. */
#include "muon_testkit.h"

enum { H = 4, D = 16, DN = 8, DR = 4, DC = 12, DV = 6, T = 7 };
enum { P_QN, P_QS, P_KVA, P_KB, P_VB, P_N };

/* The MLA plugin's declarations: q_nope and k_b rows per head scaled by sqrt(gamma), the
 * per-head query against the shared key by gamma; kv_a (latent + shared key) and v_b never. */
static const mt_spec MLA[P_N] = {
    {"q_nope_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {H * DN, D, 0}, H, 0, 0, K3RT_QK_SQRT, 0},
    {"q_shared_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {H * DR, D, 0}, H, 0, 0, K3RT_QK_FULL,
     0},
    {"kv_a_proj_with_mqa.weight", K3RT_ROLE_MATRIX, 2, {DC + DR, D, 0}, 0, 0, 0, 0, 0},
    {"k_b_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {H * DN, DC, 0}, H, 0, 0, K3RT_QK_SQRT, 0},
    {"v_b_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {H * DV, DC, 0}, H, 0, 0, 0, 0},
};

static int64_t numel(int i) { return MLA[i].shape[0] * MLA[i].shape[1]; }

/* y = W[rows r0.., :] x for a [rows, in] block */
static double row_dot(const double *w, int64_t row, int64_t in, const double *x)
{
    double s = 0;
    for (int64_t j = 0; j < in; j++)
        s += w[row * in + j] * x[j];
    return s;
}

/* Max causal logit of each head: scale (q_nope . k_nope + q_shared . k_shared), the keys from
 * the latent c = kv_a[:DC] x and the shared key kv_a[DC:] x (no norm: the clip is linear). */
static void max_logits(double *const w[P_N], const double *x, double *out)
{
    const double scale = 1.0 / sqrt((double)(DN + DR));
    double c[T][DC], kr[T][DR];
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < DC; j++)
            c[t][j] = row_dot(w[P_KVA], j, D, x + t * D);
        for (int j = 0; j < DR; j++)
            kr[t][j] = row_dot(w[P_KVA], DC + j, D, x + t * D);
    }
    for (int h = 0; h < H; h++) {
        double best = -INFINITY;
        for (int i = 0; i < T; i++)
            for (int j = 0; j <= i; j++) {
                double s = 0;
                for (int e = 0; e < DN; e++)
                    s += row_dot(w[P_QN], h * DN + e, D, x + i * D) *
                         row_dot(w[P_KB], h * DN + e, DC, c[j]);
                for (int e = 0; e < DR; e++)
                    s += row_dot(w[P_QS], h * DR + e, D, x + i * D) * kr[j][e];
                best = fmax(best, scale * s);
            }
        out[h] = best;
    }
}

/* Weights whose head maxima are exactly `target` (scaling a head's query rows scales its
 * logits), tokens x. */
static void make_layer(double *w[P_N], double *x, const double target[H])
{
    for (int i = 0; i < P_N; i++) {
        w[i] = mt_alloc(numel(i));
        tu_randn(w[i], numel(i), 1.0, 50 + (uint64_t)i);
    }
    tu_randn(x, T * D, 1.0, 60);
    double s[H];
    max_logits(w, x, s);
    for (int h = 0; h < H; h++) {
        ck_assert_msg(s[h] > 0, "head %d has no positive logit", h);
        double f = target[h] / s[h];
        for (int64_t k = h * DN * D; k < (h + 1) * DN * D; k++)
            w[P_QN][k] *= f;
        for (int64_t k = h * DR * D; k < (h + 1) * DR * D; k++)
            w[P_QS][k] *= f;
    }
}

static void load(mt_harness *h, double *const w[P_N], const double logits[H])
{
    for (int i = 0; i < P_N; i++)
        mt_set_param(h, i, w[i]);
    for (int i = 0; i < P_N; i++) {
        double *g = mt_alloc(numel(i));
        tu_randn(g, numel(i), 1.0, 80 + (uint64_t)i);
        mt_set_grad(h, i, g);
        free(g);
        if (MLA[i].qk) {
            for (int k = 0; k < H; k++)
                h->max_logit[i][k] = (float)logits[k];
            mt_use_max_logit(h, i, H);
        }
    }
}

/* With lr = 0 the step changes nothing and only the clip acts: heads 1 and 3 (400, 150 > 100)
 * come out at tau, heads 0 and 2 (50, and 100 = tau) and the unclipped tensors are bitwise
 * unchanged. */
START_TEST(clipped_heads_land_on_tau)
{
    const double target[H] = {50, 400, 100, 150};
    double *w[P_N], x[T * D], before[H], after[H];
    make_layer(w, x, target);
    max_logits(w, x, before);
    mt_harness h;
    mt_init(&h, K3RT_F64, "{}", MLA, P_N, 2);
    load(&h, w, before);
    mt_step(&h, 0.0, 1);
    double *got[P_N];
    for (int i = 0; i < P_N; i++) {
        got[i] = mt_alloc(numel(i));
        mt_get_param(&h, i, got[i]);
    }
    max_logits(got, x, after);
    for (int k = 0; k < H; k++) {
        printf("qk-clip head %d: max logit %.6f -> %.12f (tau 100)\n", k, before[k], after[k]);
        if ((float)before[k] > 100) {  /* what the optimizer sees */
            ck_assert_msg(fabs(after[k] - 100) < 1e-10, "head %d: %.15g", k, after[k]);
        } else {
            ck_assert(after[k] == before[k]);
            /* the head's rows are bitwise what they were */
            for (int i = 0; i < P_N; i++)
                if (MLA[i].qk) {
                    int64_t rows = MLA[i].shape[0] / H, cols = MLA[i].shape[1];
                    ck_assert(!memcmp(got[i] + k * rows * cols, w[i] + k * rows * cols,
                                      (size_t)(rows * cols) * sizeof(double)));
                }
        }
    }
    ck_assert(!memcmp(got[P_KVA], w[P_KVA], (size_t)numel(P_KVA) * sizeof(double)));
    ck_assert(!memcmp(got[P_VB], w[P_VB], (size_t)numel(P_VB) * sizeof(double)));
    /* and how: q_nope and k_b of head 1 by sqrt(1/4), its shared query by 1/4 */
    ck_assert(fabs(got[P_QN][1 * DN * D] - 0.5 * w[P_QN][1 * DN * D]) < 1e-15);
    ck_assert(fabs(got[P_KB][1 * DN * DC] - 0.5 * w[P_KB][1 * DN * DC]) < 1e-15);
    ck_assert(fabs(got[P_QS][1 * DR * D] - 0.25 * w[P_QS][1 * DR * D]) < 1e-15);
    for (int i = 0; i < P_N; i++)
        free(w[i]), free(got[i]);
    mt_free(&h);
}
END_TEST

/* With a real step: the clipped instance equals the unclipped one times the head's factor
 * (applied after the update), bitwise elsewhere; qk_tau moves the threshold. */
START_TEST(clip_composes_with_the_step)
{
    const double logits[H] = {50, 400, 100, 150};
    const double target[H] = {1, 1, 1, 1};
    double *w[P_N], x[T * D];
    make_layer(w, x, target);
    mt_harness on, off, low;
    mt_init(&on, K3RT_F64, "{}", MLA, P_N, 2);
    mt_init(&off, K3RT_F64, "{\"qk_clip\": false}", MLA, P_N, 2);
    mt_init(&low, K3RT_F64, "{\"qk_tau\": 40}", MLA, P_N, 2);
    load(&on, w, logits), load(&off, w, logits), load(&low, w, logits);
    mt_step(&on, 0.02, 1), mt_step(&off, 0.02, 1), mt_step(&low, 0.02, 1);
    double worst = 0;
    for (int i = 0; i < P_N; i++) {
        double *a = mt_alloc(numel(i)), *b = mt_alloc(numel(i)), *c = mt_alloc(numel(i));
        mt_get_param(&on, i, a), mt_get_param(&off, i, b), mt_get_param(&low, i, c);
        int64_t per = numel(i) / (MLA[i].heads ? H : 1);
        for (int64_t k = 0; k < numel(i); k++) {
            int head = MLA[i].heads ? (int)(k / per) : -1;
            double f = 1, f_low = 1;
            if (MLA[i].qk) {
                double g = logits[head] > 100 ? 100 / logits[head] : 1;
                double gl = logits[head] > 40 ? 40 / logits[head] : 1;
                f = MLA[i].qk == K3RT_QK_SQRT ? sqrt(g) : g;
                f_low = MLA[i].qk == K3RT_QK_SQRT ? sqrt(gl) : gl;
            }
            if (f == 1)
                ck_assert(a[k] == b[k]);
            worst = fmax(worst, fabs(a[k] - f * b[k]));
            worst = fmax(worst, fabs(c[k] - f_low * b[k]));
        }
        free(a), free(b), free(c);
    }
    printf("qk-clip after a step: max |clipped - factor * unclipped| %.2e\n", worst);
    ck_assert(worst < 1e-15);
    for (int i = 0; i < P_N; i++)
        free(w[i]);
    mt_free(&on), mt_free(&off), mt_free(&low);
}
END_TEST

/* head_axis 1: the head's columns are scaled; -inf (no tokens) leaves it; NaN is refused. */
START_TEST(columns_unseen_heads_and_nan)
{
    mt_spec sp = {"wk", K3RT_ROLE_HEAD_MATRIX, 2, {5, H * 3, 0}, H, 1, 0, K3RT_QK_SQRT, 0};
    mt_harness h;
    mt_init(&h, K3RT_F64, "{}", &sp, 1, 1);
    double w[5 * H * 3], got[5 * H * 3];
    tu_randn(w, 5 * H * 3, 1.0, 90);
    mt_set_param(&h, 0, w);
    const float logits[H] = {-INFINITY, 400, 20, 10000};
    memcpy(h.max_logit[0], logits, sizeof logits);
    mt_use_max_logit(&h, 0, H);
    mt_step(&h, 0.0, 1);  /* zero gradient, lr 0: only the clip acts */
    mt_get_param(&h, 0, got);
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < H * 3; c++) {
            int head = c / 3;
            double f = head == 1 ? 0.5 : head == 3 ? 0.1 : 1.0;
            ck_assert_msg(fabs(got[r * H * 3 + c] - f * w[r * H * 3 + c]) < 1e-15,
                          "row %d col %d", r, c);
        }
    h.max_logit[0][2] = NAN;
    k3rt_error err = {0};
    ck_assert_int_eq(mt_step_rc(&h, 0.0, 2, &err), K3RT_ERR_NUMERIC);
    ck_assert_msg(strstr(err.msg, "parameter wk: head 2 reports max logit nan"), "%s", err.msg);
    /* a wrong count is refused before anything moves */
    mt_use_max_logit(&h, 0, H - 1);
    ck_assert_int_eq(mt_step_rc(&h, 0.0, 2, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "max logits of wk: expected f32 [4] on the CPU, got f32 [3]"),
                  "%s", err.msg);
    /* no max logits at all (an owner with its reporting off): refused, the weights unmoved,
     * unless QK-clip is off */
    memset(&h.refs[0].head_max_logit, 0, sizeof h.refs[0].head_max_logit);
    mt_get_param(&h, 0, w);
    ck_assert_int_eq(mt_step_rc(&h, 0.0, 2, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "parameter wk: QK-clip is on (qk_clip) but its owner "
                                  "reported no max logits"), "%s", err.msg);
    mt_get_param(&h, 0, got);
    ck_assert_int_eq(memcmp(w, got, sizeof w), 0);
    mt_free(&h);
    mt_init(&h, K3RT_F64, "{\"qk_clip\": false}", &sp, 1, 1);
    k3rt_error none = {0};
    ck_assert_int_eq(mt_step_rc(&h, 0.0, 1, &none), K3RT_OK);
    mt_free(&h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("per_head_muon_qkclip");
    TCase *tc = tcase_create("qkclip");
    tcase_add_test(tc, clipped_heads_land_on_tau);
    tcase_add_test(tc, clip_composes_with_the_step);
    tcase_add_test(tc, columns_unseen_heads_and_nan);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
