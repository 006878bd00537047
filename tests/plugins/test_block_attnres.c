/* block_attnres gradients and values: finite differences through the protocol and of one
 * op, the model's inputs against K3's control flow and Full AttnRes written directly, zero
 * queries, the layer-0 rule, and the partial sum recovered in the backward. */
#include "plugins/attnres_testkit.h"

/* ---- direct computations of what the model's inputs must be -------------------------------- */

/* K3's control flow as spec §7 prints it (blocks of bl decoder layers), sublayers the toy. */
static void k3_direct(harness *h, int bl, const double *emb, double *xs, double *out)
{
    int64_t n = h->n, d = h->d;
    double *store = malloc((size_t)(h->S + 2) * (size_t)n * sizeof *store);
    double *P = malloc((size_t)n * sizeof *P), *y = malloc((size_t)n * sizeof *y);
    const double *src[MAX_S + 2];
    int nblocks = 0, have_p = 1;
    memcpy(P, emb, (size_t)n * sizeof *P);
    for (int L = 0; L < h->L; L++) {
        for (int half = 0; half < 2; half++) {
            int s = 2 * L + half;
            double *x = xs + (int64_t)s * n;
            if (half == 0 && nblocks == 0) {
                memcpy(x, P, (size_t)n * sizeof *x);
            } else {
                for (int j = 0; j < nblocks; j++)
                    src[j] = store + (int64_t)j * n;
                src[nblocks] = P;
                attnres_ref(nblocks + 1, src, param64(h, 2 * s), param64(h, 2 * s + 1), EPS,
                            h->B * h->T, d, x, NULL);
            }
            if (half == 0 && L % bl == 0) {
                memcpy(store + (int64_t)nblocks++ * n, P, (size_t)n * sizeof *P);
                have_p = 0;
            }
            toy(s, x, y, n, d);
            for (int64_t i = 0; i < n; i++)
                P[i] = have_p ? P[i] + y[i] : y[i];
            have_p = 1;
        }
    }
    for (int j = 0; j < nblocks; j++)
        src[j] = store + (int64_t)j * n;
    src[nblocks] = P;
    attnres_ref(nblocks + 1, src, param64(h, 2 * h->S), param64(h, 2 * h->S + 1), EPS,
                h->B * h->T, d, out, NULL);
    free(store), free(P), free(y);
}

/* Full AttnRes (spec §7): sources v_0 = embedding, v_{i+1} = output of sublayer i; sublayer l
 * reads v_0..v_l (layer 0's attention the embedding alone), the output reads all. */
static void full_direct(harness *h, const double *emb, double *xs, double *out)
{
    int64_t n = h->n;
    double *v = malloc((size_t)(h->S + 1) * (size_t)n * sizeof *v);
    const double *src[MAX_S + 1];
    memcpy(v, emb, (size_t)n * sizeof *v);
    for (int s = 0; s <= h->S; s++) {
        double *x = s < h->S ? xs + (int64_t)s * n : out;
        for (int i = 0; i <= s; i++)
            src[i] = v + (int64_t)i * n;
        if (s == 0)
            memcpy(x, emb, (size_t)n * sizeof *x);
        else
            attnres_ref(s + 1, src, param64(h, 2 * s), param64(h, 2 * s + 1), EPS, h->B * h->T,
                        h->d, x, NULL);
        if (s < h->S)
            toy(s, x, v + (int64_t)(s + 1) * n, n, h->d);
    }
    free(v);
}

static double mean_square(const double *g, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += g[i] * g[i];
    return s / (double)n;
}


/* ---- tests ------------------------------------------------------------------------------------ */

typedef struct fd_case {
    int layers;
    const char *config;
} fd_case;

static const fd_case fd_cases[] = {
    {1, "{\"block_layers\": 1}"},   /* one layer: embedding + a partial block */
    {2, "{\"block_layers\": 1}"},   /* two complete blocks */
    {3, "{\"block_layers\": 2}"},   /* a partial last block */
    {5, "{\"block_layers\": 2}"},   /* spec §8's K3 loop toy: 5 layers, blocks of 2 */
    {4, "{\"block_layers\": 4}"},   /* one block: the embedding isolated */
    {2, "{\"full\": true}"},
    {3, "{\"full\": true}"},
};

START_TEST(fd_through_the_protocol)
{
    const fd_case *c = &fd_cases[_i];
    k3rt_error err = {0};
    json_t *cfg = json_loads(c->config, 0, NULL);
    for (int round = 0; round < 2; round++) {
        fd_options o;
        memset(&o, 0, sizeof o);
        o.batch = 2, o.seq = 3, o.d_model = 8, o.n_layers = c->layers, o.seed = 11 + _i;
        o.samples = 8;
        o.eps = 1e-3;
        /* The five-point stencil: central differences leave ~1e-11 of rounding noise, 1e-6 of
         * the smallest query gradients here (~1e-5). */
        o.stencil = 4;
        /* round 0: near-uniform weights (queries ~ N(0, 0.1^2)); round 1: peaked ones */
        o.jitter = round ? 1.0 : 0.1;
        fd_result r;
        TU_OK(fd_check_residual(plugin(), cfg, &o, &r, &err), err);
        printf("block_attnres fd layers=%d %s jitter=%.1f: %d entries, worst %.2e (%s)\n",
               c->layers, c->config, o.jitter, r.n_checked, r.worst, r.worst_what);
        /* 8 entries of the embedding and all 8 of each query and gain (sublayers, output) */
        ck_assert_int_eq(r.n_checked, 8 * (1 + 2 * (2 * c->layers + 1)));
        ck_assert_msg(r.worst < 1e-6, "%s", r.worst_what);
    }
    json_decref(cfg);
}
END_TEST

/* One op: every entry of every source and the partial, the query and the key-norm gain, by
 * central differences of L = sum(y * dy). */
START_TEST(fd_of_one_op)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h, K3RT_F64, 3, 2, 3, 8, "{\"block_layers\": 1}", 1);
    random_params(&h, 0.8, 3);
    enum { NS = 3, SUB = 5 };  /* three sources and a partial: sublayer 5's op */
    int64_t n = h.n;
    double *buf = calloc((size_t)(2 * (NS + 1) + 2) * (size_t)n, sizeof *buf);
    double *y = buf + 2 * (NS + 1) * n, *dy = y + n;
    k3rt_tensor src[NS], dsrc[NS];
    for (int j = 0; j < NS + 1; j++) {
        tu_randn(buf + j * n, n, 1.0 + 0.5 * j, 50 + (uint64_t)j);
        if (j < NS) {
            src[j] = k3rt_tensor_view(buf + j * n, K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
            dsrc[j] = k3rt_tensor_view(buf + (NS + 1 + j) * n, K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
        }
    }
    tu_randn(dy, n, 1.0, 60);
    k3rt_residual_args a = args(&h, SUB, y);
    a.sources = src, a.n_sources = NS;
    a.partial = k3rt_tensor_view(buf + NS * n, K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
    k3rt_residual_args b = a;
    b.t.data = dy;
    b.d_sources = dsrc;
    b.d_partial = k3rt_tensor_view(buf + (2 * NS + 1) * n, K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
    TU_OK(rig_residual(&h.m, RIG_OP_BACKWARD, &b, &err), err);
    /* perturbed: each source / the partial (gradient right after it in buf), w, gamma */
    double worst = 0, fd_eps = 1e-4;
    int checked = 0;
    for (int target = 0; target < NS + 1 + 2; target++) {
        double *val = target <= NS ? buf + target * n : param64(&h, 2 * SUB + target - NS - 1);
        const double *g = target <= NS ? buf + (NS + 1 + target) * n
                                       : grad64(&h, 2 * SUB + target - NS - 1);
        int64_t cnt = target <= NS ? n : h.d;
        /* entries far below the tensor's typical gradient are judged on an absolute floor */
        double floor = 1e-3 * sqrt(mean_square(g, cnt)) + 1e-12;
        for (int64_t i = 0; i < cnt; i++) {
            double keep = val[i], lp = 0, lm = 0;
            val[i] = keep + fd_eps;
            TU_OK(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), err);
            for (int64_t k = 0; k < n; k++)
                lp += y[k] * dy[k];
            val[i] = keep - fd_eps;
            TU_OK(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), err);
            for (int64_t k = 0; k < n; k++)
                lm += y[k] * dy[k];
            val[i] = keep;
            double num = (lp - lm) / (2 * fd_eps);
            worst = fmax(worst, fabs(num - g[i]) / fmax(fmax(fabs(num), fabs(g[i])), floor));
            checked++;
        }
    }
    printf("block_attnres op fd: %d entries (3 sources, partial, query, gain), worst %.2e\n",
           checked, worst);
    ck_assert_int_eq(checked, (NS + 1) * (int)n + 2 * (int)h.d);
    ck_assert_msg(worst < 1e-6, "worst relative error %.3e", worst);
    free(buf);
    harness_free(&h);
}
END_TEST

START_TEST(zero_queries_give_the_mean)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h, K3RT_F64, 3, 2, 3, 8, "{\"block_layers\": 1}", 1);
    random_params(&h, 0.0, 4);  /* queries 0, gains random: the gains must not matter */
    int64_t n = h.n;
    double src[3][2 * 3 * 8], p[2 * 3 * 8], y[2 * 3 * 8];
    k3rt_tensor st[3];
    for (int j = 0; j < 3; j++) {
        tu_randn(src[j], n, 3.0 * (j + 1), 70 + (uint64_t)j);
        st[j] = k3rt_tensor_view(src[j], K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
    }
    tu_randn(p, n, 0.01, 80);  /* a small partial still gets a quarter */
    k3rt_residual_args a = args(&h, 5, y);
    a.sources = st, a.n_sources = 3;
    a.partial = k3rt_tensor_view(p, K3RT_F64, -1, 3, h.B, h.T, h.d, 0);
    TU_OK(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), err);
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(y[i] - (src[0][i] + src[1][i] + src[2][i] + p[i]) / 4));
    printf("block_attnres zero queries: max |y - mean| = %.2e\n", worst);
    ck_assert(worst < 1e-12);
    harness_free(&h);
}
END_TEST

typedef struct direct_case {
    int layers, block_layers, full;
} direct_case;

static const direct_case direct_cases[] = {
    {5, 2, 0}, {4, 1, 0}, {3, 3, 0}, {3, 0, 1}, {5, 0, 1},
};

/* The plugin's sublayer inputs and output against K3's loop / Full AttnRes written out. */
START_TEST(matches_direct_computation)
{
    const direct_case *c = &direct_cases[_i];
    char cfg[96];
    if (c->full)
        snprintf(cfg, sizeof cfg, "{\"full\": true}");
    else
        snprintf(cfg, sizeof cfg, "{\"block_layers\": %d}", c->block_layers);
    harness h;
    harness_init(&h, K3RT_F64, c->layers, 2, 3, 8, cfg, 1);
    random_params(&h, 1.0, 5 + (uint64_t)_i);
    int64_t n = h.n;
    double *emb = malloc((size_t)n * sizeof *emb), *out = malloc((size_t)n * sizeof *out);
    double *ref_out = malloc((size_t)n * sizeof *ref_out);
    double *xs = malloc((size_t)h.S * (size_t)n * sizeof *xs);
    double *ref_xs = malloc((size_t)h.S * (size_t)n * sizeof *ref_xs);
    tu_randn(emb, n, 1.0, 90);
    run_model(&h, emb, xs, out, NULL, NULL);
    if (c->full)
        full_direct(&h, emb, ref_xs, ref_out);
    else
        k3_direct(&h, c->block_layers, emb, ref_xs, ref_out);
    double dx = max_diff(xs, ref_xs, h.S * n), dout = max_diff(out, ref_out, n);
    printf("block_attnres vs direct %s (%d layers): inputs %.2e, output %.2e\n", cfg, c->layers,
           dx, dout);
    ck_assert(dx < 1e-12 && dout < 1e-12);
    /* Not a trivial agreement: the output differs from the plain sum of the sources. */
    ck_assert(max_diff(out, xs + (h.S - 1) * n, n) > 1e-3);
    free(emb), free(out), free(ref_out), free(xs), free(ref_xs);
    harness_free(&h);
}
END_TEST

/* K3's layer-0 rule: the first attention input is the embedding alone, whatever its (declared,
 * unused) query says, and that query gets no gradient: 2(S+1) parameter sets, S mixing ops. */
START_TEST(layer0_reads_the_embedding)
{
    for (int full = 0; full < 2; full++) {
        harness h;
        harness_init(&h, K3RT_F64, 3, 2, 3, 8, full ? "{\"full\": true}" : NULL, 1);
        random_params(&h, 2.0, 6);
        int64_t n = h.n;
        double *emb = malloc((size_t)n * sizeof *emb), *out = malloc((size_t)n * sizeof *out);
        double *xs = malloc((size_t)h.S * (size_t)n * sizeof *xs);
        double *dout = malloc((size_t)n * sizeof *dout), *demb = malloc((size_t)n * sizeof *demb);
        tu_randn(emb, n, 1.0, 91);
        tu_randn(dout, n, 1.0, 92);
        run_model(&h, emb, xs, out, dout, demb);
        ck_assert(memcmp(xs, emb, (size_t)n * sizeof *emb) == 0);
        ck_assert_int_eq(h.np, 2 * (h.S + 1));
        ck_assert_str_eq(rig_param(&h.m, 0)->name, "attn.query");
        ck_assert_int_eq(rig_param(&h.m, 0)->layer, 0);
        ck_assert_str_eq(rig_param(&h.m, h.np - 1)->name, "out.key_norm");
        ck_assert_int_eq(rig_param(&h.m, h.np - 1)->layer, -1);
        for (int i = 0; i < h.np; i++) {
            double g = 0;
            for (int64_t k = 0; k < h.d; k++)
                g += fabs(grad64(&h, i)[k]);
            if (i < 2)
                ck_assert_msg(g == 0, "layer 0 attention parameter %d has gradient %g", i, g);
            else
                ck_assert_msg(g > 1e-6, "parameter %d has no gradient", i);
        }
        free(emb), free(out), free(xs), free(dout), free(demb);
        harness_free(&h);
    }
}
END_TEST


/* The gradients of one op by op_backward (sources given explicitly): dv [n][n_el] and the op's
 * parameter gradients added into h's grads. */
static void op_grads(harness *h, int s, int n, double *const *v, const double *dh, double *dv)
{
    k3rt_error err = {0};
    k3rt_tensor src[8], dsrc[8];
    for (int j = 0; j < n; j++) {
        src[j] = k3rt_tensor_view(v[j], K3RT_F64, -1, 3, h->B, h->T, h->d, 0);
        dsrc[j] = k3rt_tensor_view(dv + j * h->n, K3RT_F64, -1, 3, h->B, h->T, h->d, 0);
    }
    k3rt_residual_args a = args(h, s, (void *)dh);
    a.sources = src, a.d_sources = dsrc, a.n_sources = n;
    TU_OK(rig_residual(&h->m, RIG_OP_BACKWARD, &a, &err), err);
}

/* One layer in blocks of one layer: sublayer 1 reads [embedding, y0] inside the block, so its
 * backward recovers y0 from its input. With y0 = -embedding and queries lambda * 1, the weight
 * of y0 is about e^(-2 lambda d): 1 (lambda 0), 1e-7 (1), 1e-21 (3, below double epsilon,
 * where the recovery gives up and the partial's terms vanish with their factor alpha). The
 * model's gradients must equal the ops' exact gradients composed by hand. */
START_TEST(recovered_partial_is_exact)
{
    static const double lambdas[] = {0, 1, 3};
    k3rt_error err = {0};
    for (int li = 0; li < 3; li++) {
        for (int dt = 0; dt < 2; dt++) {
            int dtype = dt ? K3RT_F32 : K3RT_F64;
            harness h, ref;
            harness_init(&h, dtype, 1, 2, 3, 8, "{\"block_layers\": 1}", 1);
            harness_init(&ref, K3RT_F64, 1, 2, 3, 8, "{\"block_layers\": 1}", 1);
            random_params(&ref, 0.0, 20);
            for (int64_t k = 0; k < 8; k++)
                param64(&ref, 2)[k] = lambdas[li] / param64(&ref, 3)[k];  /* q = lambda * 1 */
            for (int i = 0; i < h.np; i++)
                TU_OK(k3rt_convert(h.params[i].data, dtype, ref.params[i].data, K3RT_F64, 8,
                                   &err), err);
            enum { NE = 48 };
            double emb[NE], y0[NE], y1[NE], dout[NE], dh1[NE], dh0[NE], p2[NE], h1[NE];
            double got_dy1[NE], got_dy0[NE], got_demb[NE];
            char t[NE * 8], x0[NE * 8], x1[NE * 8];
            tu_randn(emb, NE, 0.3, 21);
            for (int i = 0; i < NE; i++) {
                emb[i] += 2.0;
                y0[i] = -emb[i];
            }
            tu_randn(y1, NE, 1.0, 22);
            tu_randn(dout, NE, 1.0, 23);
            tu_randn(dh1, NE, 1.0, 24);
            tu_randn(dh0, NE, 1.0, 25);
#define TO(dst, src) TU_OK(k3rt_convert(dst, dtype, src, K3RT_F64, NE, &err), err)
#define FROM(dst, src) TU_OK(k3rt_convert(dst, K3RT_F64, src, dtype, NE, &err), err)
            TO(t, emb);
            call(&h, RIG_BEGIN, 0, t);
            call(&h, RIG_MIX, 0, x0);
            TO(t, y0);
            call(&h, RIG_PUSH, 0, t);
            call(&h, RIG_MIX, 1, x1);
            TO(t, y1);
            call(&h, RIG_PUSH, 1, t);
            call(&h, RIG_FINISH, 2, t);
            TO(t, dout);
            call(&h, RIG_FINISH_BACKWARD, 2, t);
            call(&h, RIG_PUSH_BACKWARD, 1, t);
            FROM(got_dy1, t);
            TO(t, dh1);
            k3rt_residual_args a = args(&h, 1, t);
            a.sublayer_input = k3rt_tensor_view(x1, dtype, -1, 3, 2, 3, 8, 0);
            TU_OK(rig_residual(&h.m, RIG_MIX_BACKWARD, &a, &err), err);
            call(&h, RIG_PUSH_BACKWARD, 0, t);
            FROM(got_dy0, t);
            TO(t, dh0);
            a = args(&h, 0, t);
            a.sublayer_input = k3rt_tensor_view(x0, dtype, -1, 3, 2, 3, 8, 0);
            TU_OK(rig_residual(&h.m, RIG_MIX_BACKWARD, &a, &err), err);
            call(&h, RIG_BEGIN_BACKWARD, 0, t);
            FROM(got_demb, t);
#undef TO
#undef FROM
            /* by hand: the output op over [emb, y0 + y1], sublayer 1's over [emb, y0] */
            double dv_out[2 * NE], dv_1[2 * NE], want_dy0[NE], want_demb[NE];
            for (int i = 0; i < NE; i++)
                p2[i] = y0[i] + y1[i];
            double *out_src[2] = {emb, p2}, *s1_src[2] = {emb, y0};
            op_grads(&ref, 2, 2, out_src, dout, dv_out);
            op_grads(&ref, 1, 2, s1_src, dh1, dv_1);
            double alpha_p = 0, al[12];
            attnres_ref(2, (const double *const *)s1_src, param64(&ref, 2), param64(&ref, 3),
                        EPS, 6, 8, h1, al);
            for (int tk = 0; tk < 6; tk++)
                alpha_p = fmax(alpha_p, al[2 * tk + 1]);
            for (int i = 0; i < NE; i++) {
                want_dy0[i] = dv_out[NE + i] + dv_1[NE + i];
                want_demb[i] = dv_out[i] + dv_1[i] + dh0[i];
            }
            double e_dy1 = tu_rel_rms(dv_out + NE, got_dy1, NE);
            double e_dy0 = tu_rel_rms(want_dy0, got_dy0, NE);
            /* Parameter gradients against the scale of all of them: with two sources
             * dz_0 = -dz_1 = O(alpha of y0), so sublayer 1's query gradient is that small and,
             * with an exact y0 too, carries epsilon / alpha of relative rounding. */
            double g_ref[32], g_got[32];
            for (int i = 2; i < h.np; i++) {
                memcpy(g_ref + (i - 2) * 8, grad64(&ref, i), 8 * sizeof(double));
                TU_OK(k3rt_convert(g_got + (i - 2) * 8, K3RT_F64, h.grads[i].data, dtype, 8,
                                   &err), err);
            }
            double e_demb = tu_rel_rms(want_demb, got_demb, NE);
            double e_g = tu_rel_rms(g_ref, g_got, 8 * (h.np - 2));
            printf("block_attnres recovered partial, %s, lambda %g (alpha of y0 <= %.1e): "
                   "dy1 %.1e, dy0 %.1e, d emb %.1e, param grads %.1e\n", dt ? "f32" : "f64",
                   lambdas[li], alpha_p, e_dy1, e_dy0, e_demb, e_g);
            double tol = dt ? 1e-5 : 1e-12;
            ck_assert(e_dy1 < tol && e_dy0 < tol && e_demb < tol && e_g < tol);
            harness_free(&h);
            harness_free(&ref);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("block_attnres");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, fd_through_the_protocol, 0, sizeof fd_cases / sizeof fd_cases[0]);
    tcase_add_test(tc, fd_of_one_op);
    tcase_add_test(tc, zero_queries_give_the_mean);
    tcase_add_loop_test(tc, matches_direct_computation, 0,
                        sizeof direct_cases / sizeof direct_cases[0]);
    tcase_add_test(tc, layer0_reads_the_embedding);
    tcase_add_test(tc, recovered_partial_is_exact);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
