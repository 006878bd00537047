/* Context parallelism of KDA: a sequence split into 2, 3 and 7 spans (ragged, some shorter than
 * a chunk or than the conv), each span summarised as S_out = M S_in + B, the summaries composed
 * and folded as ranks would, must reproduce the unsplit outputs, final state and gradients.
 * Levels: the recurrence (internal), the layer through the vtable (conv_width 1: the vtable has
 * no conv halo), and the layer with a conv halo of W-1 input rows (internal). */
#include "kda_testkit.h"

/* span boundaries: {count, t_0 = 0, ..., t_count = T} for T = 45 */
static const int64_t SPLITS[3][9] = {{2, 0, 20, 45},
                                     {3, 0, 13, 31, 45},
                                     {7, 0, 1, 10, 13, 21, 34, 39, 45}};
#define T_ALL 45

/* rows [t0, t1) of every sequence of x [B, T, w] into a new [B, t1 - t0, w] */
static double *slice(const double *x, int64_t B, int64_t T, int64_t w, int64_t t0, int64_t t1)
{
    double *y = kt_alloc(B * (t1 - t0) * w);
    for (int64_t b = 0; b < B; b++)
        memcpy(y + b * (t1 - t0) * w, x + (b * T + t0) * w, (size_t)((t1 - t0) * w) * 8);
    return y;
}

/* y[b, t0:t1] += x[b, :] */
static void unslice_add(double *y, const double *x, int64_t B, int64_t T, int64_t w, int64_t t0,
                        int64_t t1)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < (t1 - t0) * w; i++)
            y[(b * T + t0) * w + i] += x[b * (t1 - t0) * w + i];
}

/* out[n] = M[n]^T x[n] + add[n] for n heads (the backward fold: dS_in = M^T dS_out + dB) */
static void mt_apply(const double *M, const double *x, const double *add, double *out, int64_t n,
                     int64_t dim_k, int64_t dim_v)
{
    for (int64_t h = 0; h < n; h++)
        for (int64_t i = 0; i < dim_k; i++)
            for (int64_t c = 0; c < dim_v; c++) {
                double s = add[(h * dim_k + i) * dim_v + c];
                for (int64_t j = 0; j < dim_k; j++)
                    s += M[(h * dim_k + j) * dim_k + i] * x[(h * dim_k + j) * dim_v + c];
                out[(h * dim_k + i) * dim_v + c] = s;
            }
}

/* ---- the recurrence ------------------------------------------------------------------------- */

START_TEST(test_core_spans)
{
    kda_dims d = {2, T_ALL, 2, 4, 6, 5, 8, 1.0 / sqrt(6.0)};
    kt_core full;
    kt_core_make(&full, d, 77, 0.05, 1.5);
    kt_core_fwd(&full, KDA_CHUNKED);
    kt_core_bwd(&full, KDA_CHUNKED);
    int64_t heads = d.B * d.HV, ns = full.ns, nm = heads * d.dim_k * d.dim_k;
    for (int sp = 0; sp < 3; sp++) {
        int P = (int)SPLITS[sp][0];
        const int64_t *t = SPLITS[sp] + 1;
        kt_core span[7];
        double *M[7], *Bs[7], *s_in[8], *dS_end[8];
        double *o = kt_alloc(full.nv), *dq = kt_alloc(full.nq), *dk = kt_alloc(full.nq);
        double *dv = kt_alloc(full.nv), *dg = kt_alloc(full.ng), *db = kt_alloc(full.nb);
        k3rt_error err;
        for (int i = 0; i < P; i++) {
            kda_dims di = d;
            di.T = t[i + 1] - t[i];
            kt_core *c = &span[i];
            kt_core_make(c, di, 1, 0.1, 0.2);
            int64_t T = d.T, a = t[i], b = t[i + 1];
            free(c->q), free(c->k), free(c->v), free(c->g), free(c->beta), free(c->dO);
            c->q = slice(full.q, d.B, T, d.H * d.dim_k, a, b);
            c->k = slice(full.k, d.B, T, d.H * d.dim_k, a, b);
            c->v = slice(full.v, d.B, T, d.HV * d.dim_v, a, b);
            c->g = slice(full.g, d.B, T, d.HV * d.dim_k, a, b);
            c->beta = slice(full.beta, d.B, T, d.HV, a, b);
            c->dO = slice(full.dO, d.B, T, d.HV * d.dim_v, a, b);
            M[i] = kt_alloc(nm), Bs[i] = kt_alloc(ns);
            TU_OK(kda_core_summary_f64(kt_stream(), &di, c->q, c->k, c->v, c->g, c->beta, M[i],
                                       Bs[i], c->ws, c->ws_n, &err),
                  err);
        }
        /* all summaries composed into one: S_T = M S_0 + B */
        double *Mt = kt_alloc(nm), *Bt = kt_alloc(ns), *sT = kt_alloc(ns), *junk = kt_alloc(nm);
        memcpy(Mt, M[0], (size_t)nm * 8), memcpy(Bt, Bs[0], (size_t)ns * 8);
        for (int i = 1; i < P; i++)
            TU_OK(kda_compose_f64(kt_stream(), heads, d.dim_k, d.dim_v, Mt, Bt, M[i], Bs[i], Mt, Bt,
                                  &err), err);
        TU_OK(kda_compose_f64(kt_stream(), heads, d.dim_k, d.dim_v, Mt, full.s0, Mt, Bt, junk, sT,
                              &err),
              err);
        double e_compose = kt_maxrel(full.sT, sT, ns);
        /* forward protocol: S_in(i+1) = M_i S_in(i) + B_i, then each span from its true state
         * (recurrent form, against the unsplit chunked run) */
        s_in[0] = kt_alloc(ns);
        memcpy(s_in[0], full.s0, (size_t)ns * 8);
        double e_state = 0;
        for (int i = 0; i < P; i++) {
            s_in[i + 1] = kt_alloc(ns);
            TU_OK(kda_compose_f64(kt_stream(), heads, d.dim_k, d.dim_v, M[i], s_in[i], M[i], Bs[i],
                                  junk, s_in[i + 1], &err), err);
            memcpy(span[i].s0, s_in[i], (size_t)ns * 8);
            kt_core_fwd(&span[i], KDA_RECURRENT);
            e_state = fmax(e_state, kt_maxrel(span[i].sT, s_in[i + 1], ns));
            unslice_add(o, span[i].o, d.B, d.T, d.HV * d.dim_v, t[i], t[i + 1]);
        }
        double e_out = kt_maxrel(full.o, o, full.nv);
        double e_final = kt_maxrel(full.sT, span[P - 1].sT, ns);
        /* backward: local dS_0 with no incoming state gradient (dB_i), folded with M_i^T */
        dS_end[P] = kt_alloc(ns);
        memcpy(dS_end[P], full.dsT, (size_t)ns * 8);
        double e_fold = 0;
        for (int i = P - 1; i >= 0; i--) {
            kt_core *c = &span[i];
            k3rt_error e2;
            double *dB = kt_alloc(ns);
            TU_OK(kda_core_bwd_f64(kt_stream(), KDA_CHUNKED, &c->d, c->q, c->k, c->v, c->g,
                                   c->beta, c->states, c->dO, NULL, c->dq, c->dk, c->dv, c->dg,
                                   c->dbeta, dB, c->ws, c->ws_n, &e2), e2);
            dS_end[i] = kt_alloc(ns);
            mt_apply(M[i], dS_end[i + 1], dB, dS_end[i], heads, d.dim_k, d.dim_v);
            /* the span's own backward from the true state gradient */
            memcpy(c->dsT, dS_end[i + 1], (size_t)ns * 8);
            kt_core_bwd(c, KDA_CHUNKED);
            e_fold = fmax(e_fold, kt_maxrel(c->ds0, dS_end[i], ns));
            unslice_add(dq, c->dq, d.B, d.T, d.H * d.dim_k, t[i], t[i + 1]);
            unslice_add(dk, c->dk, d.B, d.T, d.H * d.dim_k, t[i], t[i + 1]);
            unslice_add(dv, c->dv, d.B, d.T, d.HV * d.dim_v, t[i], t[i + 1]);
            unslice_add(dg, c->dg, d.B, d.T, d.HV * d.dim_k, t[i], t[i + 1]);
            unslice_add(db, c->dbeta, d.B, d.T, d.HV, t[i], t[i + 1]);
            free(dB);
        }
        double e_grad = fmax(fmax(kt_maxrel(full.dq, dq, full.nq), kt_maxrel(full.dk, dk, full.nq)),
                             fmax(kt_maxrel(full.dv, dv, full.nv), kt_maxrel(full.dg, dg, full.ng)));
        e_grad = fmax(e_grad, fmax(kt_maxrel(full.dbeta, db, full.nb),
                                   kt_maxrel(full.ds0, dS_end[0], ns)));
        printf("  recurrence, %d spans: composed S_T %.1e, span states %.1e, outputs %.1e, "
               "final state %.1e, dS fold %.1e, gradients %.1e\n", P, e_compose, e_state, e_out,
               e_final, e_fold, e_grad);
        ck_assert_double_lt(e_compose, 1e-12);
        ck_assert_double_lt(e_state, 1e-12);
        ck_assert_double_lt(e_out, 1e-12);
        ck_assert_double_lt(e_final, 1e-12);
        ck_assert_double_lt(e_fold, 1e-12);
        ck_assert_double_lt(e_grad, 1e-12);
        for (int i = 0; i < P; i++) {
            kt_core_free(&span[i]);
            free(M[i]), free(Bs[i]);
        }
        for (int i = 0; i <= P; i++)
            free(s_in[i]), free(dS_end[i]);
        free(o), free(dq), free(dk), free(dv), free(dg), free(db);
        free(Mt), free(Bt), free(sT), free(junk);
    }
    kt_core_free(&full);
}
END_TEST

/* ---- the layer ------------------------------------------------------------------------------ */

static const char *CFG = "{\"heads\": 2, \"value_heads\": 4, \"head_dk\": 6, "
                         "\"head_dv\": 5, \"forget_rank\": 3, \"chunk_size\": 4, "
                         "\"init_std\": 0.3, \"conv_width\": %d}";

/* Through the host's rig: cp_summary + cp_compose, then each span's forward from its state. */
START_TEST(test_vtable_spans)
{
    char cfg[256];
    snprintf(cfg, sizeof cfg, CFG, 1);
    int64_t B = 2, T = T_ALL, d = 16, n = B * T * d;
    kt_layer L;
    kt_layer_make(&L, cfg, B, T, d, 8);
    const kda *m = L.m.self;
    k3rt_state_layout lay = L.m.state;  /* state_layout() at B, as the rig read it */
    k3rt_error err;
    int64_t ns = k3rt_tensor_numel(&lay.state), nm = k3rt_tensor_numel(&lay.summary_m);
    ck_assert_int_eq(ns, B * m->HV * m->dim_k * m->dim_v);
    ck_assert_int_eq(nm, B * m->HV * m->dim_k * m->dim_k);
    ck_assert_int_eq(k3rt_tensor_numel(&lay.summary_b), ns);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 8, 2);
    double *x = kt_alloc(n), *y = kt_alloc(n), *yc = kt_alloc(n), *s0 = kt_alloc(ns);
    double *sT = kt_alloc(ns);
    kt_randn(x, n, 1, &rng);
    kt_randn(s0, ns, 0.5, &rng);
    kt_layer_fwd(&L, x, y, s0, sT);
    for (int sp = 0; sp < 3; sp++) {
        int P = (int)SPLITS[sp][0];
        const int64_t *t = SPLITS[sp] + 1;
        double *Mt = kt_alloc(nm), *Bt = kt_alloc(ns), *Mi = kt_alloc(nm), *Bi = kt_alloc(ns);
        double *s = kt_alloc(ns), *s_next = kt_alloc(ns);
        memcpy(s, s0, (size_t)ns * 8);
        memset(yc, 0, (size_t)n * 8);
        k3rt_tensor tm = lay.summary_m, tb = lay.summary_b;
        double e_chain = 0;
        for (int i = 0; i < P; i++) {
            int64_t Ts = t[i + 1] - t[i];
            double *xs = slice(x, B, T, d, t[i], t[i + 1]), *ys = kt_alloc(B * Ts * d);
            TU_OK(rig_alloc_shape(&L.m, B, Ts, 0, &err), err);  /* this span's buffers */
            k3rt_fwd_args a = kt_fwd_args(&L, xs, ys);
            a.x.shape[1] = a.y.shape[1] = Ts;
            tm.data = Mi, tb.data = Bi;
            TU_OK(rig_cp_summary(&L.m, &a, tm, tb, &err), err);
            k3rt_tensor m1 = tm, b1 = tb, m2 = tm, b2 = tb;
            if (i == 0) {
                memcpy(Mt, Mi, (size_t)nm * 8), memcpy(Bt, Bi, (size_t)ns * 8);
            } else {
                m1.data = Mt, b1.data = Bt, m2.data = Mi, b2.data = Bi;
                k3rt_tensor mo = tm, bo = tb;
                mo.data = Mt, bo.data = Bt;
                TU_OK(rig_cp_compose(&L.m, m1, b1, m2, b2, mo, bo, &err), err);
            }
            /* this span from its true initial state; its final state is M_i s + B_i */
            a.state_in = kt_state(&L, s);
            a.state_out = kt_state(&L, s_next);
            TU_OK(rig_forward(&L.m, &a, &err), err);
            k3rt_tensor sin = tb, snx = tb, mo = tm;
            double *pred = kt_alloc(ns), *junk = kt_alloc(nm);
            sin.data = s, snx.data = pred, mo.data = junk;
            m1.data = Mi, m2.data = Mi, b2.data = Bi;
            TU_OK(rig_cp_compose(&L.m, m1, sin, m2, b2, mo, snx, &err), err);
            e_chain = fmax(e_chain, kt_maxrel(s_next, pred, ns));
            memcpy(s, s_next, (size_t)ns * 8);
            unslice_add(yc, ys, B, T, d, t[i], t[i + 1]);
            free(xs), free(ys), free(pred), free(junk);
        }
        /* S_T = M_total S_0 + B_total */
        double *pred = kt_alloc(ns);
        for (int64_t h = 0; h < B * m->HV; h++)
            for (int64_t i = 0; i < m->dim_k; i++)
                for (int64_t c = 0; c < m->dim_v; c++) {
                    double acc = Bt[(h * m->dim_k + i) * m->dim_v + c];
                    for (int64_t j = 0; j < m->dim_k; j++)
                        acc += Mt[(h * m->dim_k + i) * m->dim_k + j] *
                               s0[(h * m->dim_k + j) * m->dim_v + c];
                    pred[(h * m->dim_k + i) * m->dim_v + c] = acc;
                }
        double e_y = kt_maxrel(y, yc, n), e_s = kt_maxrel(sT, s, ns), e_c = kt_maxrel(sT, pred, ns);
        printf("  vtable, %d spans: outputs %.1e, final state %.1e, composed summary %.1e, "
               "per-span summaries %.1e\n", P, e_y, e_s, e_c, e_chain);
        ck_assert_double_lt(e_y, 1e-12);
        ck_assert_double_lt(e_s, 1e-12);
        ck_assert_double_lt(e_c, 1e-12);
        ck_assert_double_lt(e_chain, 1e-12);
        free(Mt), free(Bt), free(Mi), free(Bi), free(s), free(s_next), free(pred);
    }
    free(x), free(y), free(yc), free(s0), free(sT);
    kt_layer_free(&L);
}
END_TEST

/* The layer with a conv halo (internal entry points): summaries, outputs, final state, and the
 * backward with each span's halo gradient added to the rows before it. */
START_TEST(test_layer_halo_spans)
{
    char cfg[256];
    snprintf(cfg, sizeof cfg, CFG, 4);
    int64_t B = 2, T = T_ALL, d = 16, n = B * T * d, W = 4;
    kt_layer L;
    kt_layer_make(&L, cfg, B, T, d, 9);
    const kda *m = L.m.self;
    int64_t ns = B * m->HV * m->dim_k * m->dim_v, nm = B * m->HV * m->dim_k * m->dim_k,
        heads = B * m->HV;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 9, 3);
    double *x = kt_alloc(n), *y = kt_alloc(n), *dy = kt_alloc(n), *dx = kt_alloc(n);
    double *s0 = kt_alloc(ns), *sT = kt_alloc(ns), *dsT = kt_alloc(ns), *ds0 = kt_alloc(ns);
    kt_randn(x, n, 1, &rng);
    kt_randn(dy, n, 1, &rng);
    kt_randn(s0, ns, 0.5, &rng);
    kt_randn(dsT, ns, 1, &rng);
    k3rt_error err;
    kda_io io = kt_io(&L, B, T);
    io.x = x, io.y = y, io.s_in = s0, io.s_out = sT;
    TU_OK(kda_layer_fwd_f64(m, kt_stream(), &io, &err), err);
    io.dy = dy, io.dx = dx, io.ds_out = dsT, io.ds_in = ds0;
    TU_OK(kda_layer_bwd_f64(m, kt_stream(), &io, &err), err);
    double *gfull[KDA_N_SLOTS] = {0};
    for (int s = 0; s < KDA_N_SLOTS; s++)
        if (m->slot[s] >= 0) {
            int64_t ng = k3rt_tensor_numel(&L.gr[m->slot[s]]);
            gfull[s] = kt_alloc(ng);
            memcpy(gfull[s], io.grads[s], (size_t)ng * 8);
        }
    for (int sp = 0; sp < 3; sp++) {
        int P = (int)SPLITS[sp][0];
        const int64_t *t = SPLITS[sp] + 1;
        double *xs[7], *halo[7], *s_in[8], *yc = kt_alloc(n), *dxc = kt_alloc(n);
        double *Mt = kt_alloc(nm), *Bt = kt_alloc(ns), *Mi = kt_alloc(nm), *Bi = kt_alloc(ns);
        double *junk = kt_alloc(nm), *pred = kt_alloc(ns);
        s_in[0] = kt_alloc(ns);
        memcpy(s_in[0], s0, (size_t)ns * 8);
        for (int i = 0; i < P; i++) {
            int64_t Ts = t[i + 1] - t[i];
            xs[i] = slice(x, B, T, d, t[i], t[i + 1]);
            halo[i] = kt_alloc(B * (W - 1) * d); /* rows t_i - 3 .. t_i - 1, zero before 0 */
            for (int64_t b = 0; b < B; b++)
                for (int64_t r = 0; r < W - 1; r++) {
                    int64_t src = t[i] - (W - 1) + r;
                    if (src >= 0)
                        memcpy(halo[i] + (b * (W - 1) + r) * d, x + (b * T + src) * d,
                               (size_t)d * 8);
                }
            kda_io si = kt_io(&L, B, Ts);
            si.x = xs[i], si.x_halo = i ? halo[i] : NULL;
            TU_OK(kda_layer_summary_f64(m, kt_stream(), &si, Mi, Bi, &err), err);
            if (i == 0)
                memcpy(Mt, Mi, (size_t)nm * 8), memcpy(Bt, Bi, (size_t)ns * 8);
            else
                TU_OK(kda_compose_f64(kt_stream(), heads, m->dim_k, m->dim_v, Mt, Bt, Mi, Bi, Mt,
                                      Bt,
                                      &err), err);
            s_in[i + 1] = kt_alloc(ns);
            TU_OK(kda_compose_f64(kt_stream(), heads, m->dim_k, m->dim_v, Mi, s_in[i], Mi, Bi, junk,
                                  s_in[i + 1], &err), err);
        }
        TU_OK(kda_compose_f64(kt_stream(), heads, m->dim_k, m->dim_v, Mt, s0, Mt, Bt, junk, pred,
                              &err),
              err);
        double e_sum = kt_maxrel(sT, pred, ns), e_state = kt_maxrel(sT, s_in[P], ns);
        /* backward, last span first: forward again for its saved buffer, then its backward
         * from the state gradient of the span after it */
        for (int s = 0; s < KDA_N_SLOTS; s++)
            if (m->slot[s] >= 0)
                memset(L.gr[m->slot[s]].data, 0, k3rt_tensor_bytes(&L.gr[m->slot[s]]));
        double *dS = kt_alloc(ns), *dS_prev = kt_alloc(ns);
        memcpy(dS, dsT, (size_t)ns * 8);
        for (int i = P - 1; i >= 0; i--) {
            int64_t Ts = t[i + 1] - t[i];
            double *ys = kt_alloc(B * Ts * d), *dys = slice(dy, B, T, d, t[i], t[i + 1]);
            double *dxs = kt_alloc(B * Ts * d), *dh = kt_alloc(B * (W - 1) * d);
            kda_io si = kt_io(&L, B, Ts);
            si.x = xs[i], si.x_halo = i ? halo[i] : NULL, si.y = ys, si.s_in = s_in[i];
            TU_OK(kda_layer_fwd_f64(m, kt_stream(), &si, &err), err);
            unslice_add(yc, ys, B, T, d, t[i], t[i + 1]);
            si.dy = dys, si.dx = dxs, si.dx_halo = i ? dh : NULL, si.ds_out = dS,
            si.ds_in = dS_prev;
            TU_OK(kda_layer_bwd_f64(m, kt_stream(), &si, &err), err);
            unslice_add(dxc, dxs, B, T, d, t[i], t[i + 1]);
            for (int64_t b = 0; b < B && i; b++)
                for (int64_t r = 0; r < W - 1; r++) {
                    int64_t dst = t[i] - (W - 1) + r;
                    for (int64_t j = 0; j < d && dst >= 0; j++)
                        dxc[(b * T + dst) * d + j] += dh[(b * (W - 1) + r) * d + j];
                }
            memcpy(dS, dS_prev, (size_t)ns * 8);
            free(ys), free(dys), free(dxs), free(dh);
        }
        double e_g = 0;
        for (int s = 0; s < KDA_N_SLOTS; s++)
            if (m->slot[s] >= 0)
                e_g = fmax(e_g, kt_maxrel(gfull[s], L.gr[m->slot[s]].data,
                                          k3rt_tensor_numel(&L.gr[m->slot[s]])));
        double e_y = kt_maxrel(y, yc, n), e_dx = kt_maxrel(dx, dxc, n);
        double e_ds = kt_maxrel(ds0, dS, ns);
        printf("  layer with halo, %d spans: composed S_T %.1e, span states %.1e, outputs %.1e, "
               "dx %.1e, parameter gradients %.1e, dS_0 %.1e\n", P, e_sum, e_state, e_y, e_dx,
               e_g, e_ds);
        ck_assert_double_lt(e_sum, 1e-12);
        ck_assert_double_lt(e_state, 1e-12);
        ck_assert_double_lt(e_y, 1e-12);
        ck_assert_double_lt(e_dx, 1e-12);
        ck_assert_double_lt(e_g, 1e-12);
        ck_assert_double_lt(e_ds, 1e-12);
        for (int i = 0; i < P; i++)
            free(xs[i]), free(halo[i]);
        for (int i = 0; i <= P; i++)
            free(s_in[i]);
        free(yc), free(dxc), free(Mt), free(Bt), free(Mi), free(Bi), free(junk), free(pred);
        free(dS), free(dS_prev);
    }
    for (int s = 0; s < KDA_N_SLOTS; s++)
        free(gfull[s]);
    free(x), free(y), free(dy), free(dx), free(s0), free(sT), free(dsT), free(ds0);
    kt_layer_free(&L);
}
END_TEST

/* Without the halo a mid-sequence span computes something else (the halo matters). */
START_TEST(test_halo_matters)
{
    char cfg[256];
    snprintf(cfg, sizeof cfg, CFG, 4);
    int64_t B = 1, T = 12, d = 16, W = 4;
    kt_layer L;
    kt_layer_make(&L, cfg, B, T, d, 10);
    const kda *m = L.m.self;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 10, 1);
    double *x = kt_alloc(T * d), *y1 = kt_alloc(T * d), *y2 = kt_alloc(T * d);
    double *halo = kt_alloc((W - 1) * d);
    kt_randn(x, T * d, 1, &rng);
    kt_randn(halo, (W - 1) * d, 1, &rng);
    kda_io io = kt_io(&L, B, T);
    io.x = x, io.y = y1;
    k3rt_error err;
    TU_OK(kda_layer_fwd_f64(m, kt_stream(), &io, &err), err);
    io.x_halo = halo, io.y = y2;
    TU_OK(kda_layer_fwd_f64(m, kt_stream(), &io, &err), err);
    ck_assert_double_gt(kt_maxrel(y1, y2, T * d), 1e-3);
    free(x), free(y1), free(y2), free(halo);
    kt_layer_free(&L);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kda_cp");
    TCase *tc = tcase_create("cp");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_core_spans);
    tcase_add_test(tc, test_vtable_spans);
    tcase_add_test(tc, test_layer_halo_spans);
    tcase_add_test(tc, test_halo_matters);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
