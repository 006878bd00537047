/* The KDA layer (spec §2.1), forward and backward side by side. x [B, T, d], N = B*T tokens,
 * Dk = H*dim_k, Dv = HV*dim_v, Dg = HV*dim_k.
 *
 *   qp, kp, vp = x Wq^T, x Wk^T, x Wv^T                      [N, Dk | Dk | Dv]
 *   qc, kc, vc = causal depthwise conv (width W) of each       (halo rows: kda_io.x_halo)
 *   qn, kn     = per-head L2 norm of silu(qc), silu(kc);  v = silu(vc)
 *   z          = (x Wfa^T) Wfb^T + dt_bias  (or x Wf^T + dt_bias)                 [N, Dg]
 *   g          = lb sigmoid(e^A_log z)  (or -e^A_log softplus(z))
 *   beta       = sigmoid(x Wb^T)                                                  [N, HV]
 *   o, S_T     = recurrence(qn, kn, v, g, beta; S_0)                              [N, Dv]
 *   on         = RMSNorm_dv(o) * w_norm  (one gain for every head)
 *   G          = x Wg^T  (or (x Wga^T) Wgb^T);   yg = on ⊙ sigmoid(G)
 *   y          = yg Wo^T
 *
 * Saved (kda_layout): every intermediate above except on, which the backward recomputes, and
 * the recurrence's state at every chunk start. */

/* Linear layer helpers on the layer's dtype. */
static int SUF(lin)(k3rt_stream *s, const REAL *x, const void *w, REAL *y, int64_t n,
                    int64_t in, int64_t out, k3rt_error *err)
{
    return k3rt_linear_fwd(s, KDA_DTYPE, x, w, NULL, y, n, in, out, err);
}

static int SUF(lin_bwd)(k3rt_stream *s, const REAL *x, const void *w, const REAL *dy, REAL *dx,
                        void *dw, int64_t n, int64_t in, int64_t out, int acc, k3rt_error *err)
{
    return k3rt_linear_bwd(s, KDA_DTYPE, x, w, dy, dx, dw, NULL, n, in, out, acc, err);
}

static kda_dims SUF(dims_of)(const kda *m, int64_t B, int64_t T)
{
    kda_dims d = {B, T, m->H, m->HV, m->dim_k, m->dim_v, m->C, 1.0 / sqrt((double)m->dim_k)};
    return d;
}

/* Projections of the conv halo rows: [B*(W-1), Dk | Dk | Dv] at ws + l->halo. */
static int SUF(halo_proj)(const kda *m, k3rt_stream *s, const kda_io *io, const kda_layout *l,
                          REAL *ws, const REAL **hq, const REAL **hk, const REAL **hv,
                          k3rt_error *err)
{
    *hq = *hk = *hv = NULL;
    if (!io->x_halo || m->W < 2)
        return K3RT_OK;
    int64_t nh = io->B * (m->W - 1), Dk = m->H * m->dim_k, Dv = m->HV * m->dim_v;
    REAL *h = ws + l->halo;
    const REAL *xh = io->x_halo;
    K3RT_TRY(SUF(lin)(s, xh, io->params[KDA_Q], h, nh, m->d, Dk, err));
    K3RT_TRY(SUF(lin)(s, xh, io->params[KDA_K], h + nh * Dk, nh, m->d, Dk, err));
    K3RT_TRY(SUF(lin)(s, xh, io->params[KDA_V], h + 2 * nh * Dk, nh, m->d, Dv, err));
    *hq = h, *hk = h + nh * Dk, *hv = h + 2 * nh * Dk;
    return K3RT_OK;
}

/* Everything before the recurrence: fills qp .. beta of the saved buffer. */
static int SUF(layer_prep)(const kda *m, k3rt_stream *s, const kda_io *io, const kda_layout *l,
                           k3rt_error *err)
{
    int64_t N = io->B * io->T, d = m->d, H = m->H, HV = m->HV;
    int64_t Dk = H * m->dim_k, Dv = HV * m->dim_v, Dg = HV * m->dim_k;
    REAL *ws = io->ws;
    const REAL *x = io->x;
    const void *const *P = io->params;
    K3RT_TRY(SUF(lin)(s, x, P[KDA_Q], KDA_SV(l, l->qp), N, d, Dk, err));
    K3RT_TRY(SUF(lin)(s, x, P[KDA_K], KDA_SV(l, l->kp), N, d, Dk, err));
    K3RT_TRY(SUF(lin)(s, x, P[KDA_V], KDA_SV(l, l->vp), N, d, Dv, err));
    const REAL *hq, *hk, *hv;
    K3RT_TRY(SUF(halo_proj)(m, s, io, l, ws, &hq, &hk, &hv, err));
    SUF(conv_fwd)(s, io, Dk, m->W, KDA_SV(l, l->qp), hq, P[KDA_QCONV], KDA_SV(l, l->qc));
    SUF(conv_fwd)(s, io, Dk, m->W, KDA_SV(l, l->kp), hk, P[KDA_KCONV], KDA_SV(l, l->kc));
    SUF(conv_fwd)(s, io, Dv, m->W, KDA_SV(l, l->vp), hv, P[KDA_VCONV], KDA_SV(l, l->vc));
    SUF(l2_job) lq = {H, m->dim_k, KDA_SV(l, l->qc), NULL, NULL, KDA_SV(l, l->qn), KDA_SV(l, l->rq), NULL};
    SUF(l2_job) lk = {H, m->dim_k, KDA_SV(l, l->kc), NULL, NULL, KDA_SV(l, l->kn), KDA_SV(l, l->rk), NULL};
    K3RT_TRY(SUF(l2_fwd)(s, &lq, N, err));
    K3RT_TRY(SUF(l2_fwd)(s, &lk, N, err));
    K3RT_TRY(k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SILU, KDA_SV(l, l->vc), KDA_SV(l, l->v), N * Dv, err));
    if (m->rf) {
        K3RT_TRY(SUF(lin)(s, x, P[KDA_FA], KDA_SV(l, l->fa), N, d, m->rf, err));
        K3RT_TRY(SUF(lin)(s, KDA_SV(l, l->fa), P[KDA_FB], KDA_SV(l, l->z), N, m->rf, Dg, err));
    } else {
        K3RT_TRY(SUF(lin)(s, x, P[KDA_F], KDA_SV(l, l->z), N, d, Dg, err));
    }
    SUF(gate_job) gj = {m, N, P[KDA_ALOG], P[KDA_DTB], NULL, KDA_SV(l, l->z), KDA_SV(l, l->g), NULL, NULL,
                        NULL};
    SUF(par)(s, N, SUF(gate_fwd_rows), &gj);
    K3RT_TRY(SUF(lin)(s, x, P[KDA_B], KDA_SV(l, l->beta), N, d, HV, err));
    return k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SIGMOID, KDA_SV(l, l->beta), KDA_SV(l, l->beta), N * HV, err);
}

/* The recurrence over the sequences of a call: the B rows, or with documents each document
 * as a sequence of its own (B = 1 at its first token), whose chunk-start states follow the
 * previous document's in `states`. A row's first document starts from that row's state, its
 * last one ends in it; the others start from zero and their final state is dropped. */
typedef struct SUF(core_seq) {
    kda_dims d;                /* B = 1 and the document's length, or the whole call */
    int64_t t0, row, states;   /* first token (flattened), its row, offset into states */
    int first, last;           /* starts / ends its row */
} SUF(core_seq);

/* How many core calls: the documents, or one call over the B rows. */
static int64_t SUF(core_seqs)(const kda_io *io)
{
    return io->docs ? io->n_docs : 1;
}

static void SUF(core_seq_at)(const kda *m, const kda_io *io, int64_t i, int64_t *states_at,
                             SUF(core_seq) *q)
{
    q->d = SUF(dims_of)(m, io->B, io->T);
    q->t0 = 0, q->row = 0, q->states = 0, q->first = q->last = 1;
    if (!io->docs)
        return;
    int64_t t0 = io->docs[i], len = io->docs[i + 1] - t0;
    q->d.B = 1, q->d.T = len;
    q->t0 = t0, q->row = t0 / io->T;
    q->first = t0 % io->T == 0, q->last = (t0 + len) % io->T == 0;
    q->states = *states_at;
    *states_at += m->HV * kda_chunks(len, m->C) * m->dim_k * m->dim_v;
}

int SUF(kda_layer_fwd)(const kda *m, k3rt_stream *s, const kda_io *io, k3rt_error *err)
{
    int64_t B = io->B, T = io->T, N = B * T, d = m->d, HV = m->HV, Dv = HV * m->dim_v;
    kda_layout l;
    kda_layout_make(m, B, T, m->slots, &l);
    REAL *ws = io->ws;
    const REAL *x = io->x;
    const void *const *P = io->params;
    K3RT_TRY(SUF(layer_prep)(m, s, io, &l, err));
    const int64_t Dk = m->H * m->dim_k, Dg = HV * m->dim_k, ns = HV * m->dim_k * m->dim_v;
    const REAL *s_in = io->s_in;
    REAL *s_out = io->s_out;
    for (int64_t i = 0, at = 0, n = SUF(core_seqs)(io); i < n; i++) {
        SUF(core_seq) q;
        SUF(core_seq_at)(m, io, i, &at, &q);
        int64_t t = q.t0;
        K3RT_TRY(SUF(kda_core_fwd)(s, m->algorithm, &q.d, KDA_SV(&l, l.qn) + t * Dk, KDA_SV(&l, l.kn) + t * Dk,
                                   KDA_SV(&l, l.v) + t * Dv, KDA_SV(&l, l.g) + t * Dg, KDA_SV(&l, l.beta) + t * HV,
                                   q.first && s_in ? s_in + q.row * ns : NULL, KDA_SV(&l, l.o) + t * Dv,
                                   KDA_SV(&l, l.states) + q.states,
                                   q.last && s_out ? s_out + q.row * ns : NULL, ws + l.core,
                                   l.core_n, err));
    }
    K3RT_TRY(k3rt_rmsnorm_fwd(s, KDA_DTYPE, KDA_SV(&l, l.o), P[KDA_NORM], ws + l.on, KDA_SV(&l, l.rstd),
                              N * HV, m->dim_v, m->norm_eps, err));
    if (m->rg) {
        K3RT_TRY(SUF(lin)(s, x, P[KDA_GA], KDA_SV(&l, l.ga), N, d, m->rg, err));
        K3RT_TRY(SUF(lin)(s, KDA_SV(&l, l.ga), P[KDA_GB], KDA_SV(&l, l.G), N, m->rg, Dv, err));
    } else {
        K3RT_TRY(SUF(lin)(s, x, P[KDA_G], KDA_SV(&l, l.G), N, d, Dv, err));
    }
    SUF(ogate_job) og = {Dv, ws + l.on, KDA_SV(&l, l.G), NULL, KDA_SV(&l, l.yg), NULL, NULL};
    K3RT_TRY(SUF(ogate_fwd)(s, &og, N, err));
    return SUF(lin)(s, KDA_SV(&l, l.yg), P[KDA_O], io->y, N, Dv, d, err);
}

/* One of q, k, v from the gradient of its conv output: conv backward (+ halo), then the
 * projection's backward into dx (accumulated) and dx_halo (first = 1 overwrites it). */
static int SUF(qkv_bwd)(const kda *m, k3rt_stream *s, const kda_io *io, const kda_layout *l,
                        const REAL *u, const REAL *halo, int wslot, int cslot, int64_t D,
                        const REAL *dz, int first, k3rt_error *err)
{
    int64_t N = io->B * io->T, nh = io->B * (m->W - 1);
    REAL *ws = io->ws, *dp = ws + l->dp, *dh = ws + l->dhalo;
    SUF(conv_bwd)(s, io, D, m->W, u, halo, io->params[cslot], dz, dp, halo ? dh : NULL,
                  io->grads[cslot]);
    K3RT_TRY(SUF(lin_bwd)(s, io->x, io->params[wslot], dp, io->dx, io->grads[wslot], N, m->d, D,
                          1, err));
    /* the halo rows' projection is this span's: its weight gradient too, asked for or not */
    if (halo)
        K3RT_TRY(SUF(lin_bwd)(s, io->x_halo, io->params[wslot], dh, io->dx_halo,
                              io->grads[wslot], nh, m->d, D, !first, err));
    return K3RT_OK;
}

int SUF(kda_layer_bwd)(const kda *m, k3rt_stream *s, const kda_io *io, k3rt_error *err)
{
    int64_t B = io->B, T = io->T, N = B * T, d = m->d, H = m->H, HV = m->HV;
    int64_t Dk = H * m->dim_k, Dv = HV * m->dim_v, Dg = HV * m->dim_k;
    kda_layout l;
    kda_layout_make(m, B, T, m->slots, &l);
    REAL *ws = io->ws;
    const REAL *x = io->x;
    const void *const *P = io->params;
    void *const *Gr = io->grads;
    if (io->dx_halo && (!io->x_halo || m->W < 2))
        memset(io->dx_halo, 0, (size_t)(B * (m->W - 1) * d) * sizeof(REAL));
    REAL *d1 = ws + l.d1, *d2 = ws + l.d2, *d3 = ws + l.d3, *dlow = ws + l.dlow;
    /* y = yg Wo^T */
    K3RT_TRY(SUF(lin_bwd)(s, KDA_SV(&l, l.yg), P[KDA_O], io->dy, d1, Gr[KDA_O], N, Dv, d, 0, err));
    /* yg = on ⊙ sigmoid(G): d1 = dyg -> d2 = d(on), d3 = dG */
    K3RT_TRY(k3rt_rmsnorm_fwd(s, KDA_DTYPE, KDA_SV(&l, l.o), P[KDA_NORM], ws + l.on, NULL, N * HV,
                              m->dim_v, m->norm_eps, err));
    SUF(ogate_job) og = {Dv, ws + l.on, KDA_SV(&l, l.G), d1, NULL, d2, d3};
    K3RT_TRY(SUF(ogate_bwd)(s, &og, N, err));
    if (m->rg) {
        K3RT_TRY(SUF(lin_bwd)(s, KDA_SV(&l, l.ga), P[KDA_GB], d3, dlow, Gr[KDA_GB], N, m->rg, Dv, 0,
                              err));
        K3RT_TRY(SUF(lin_bwd)(s, x, P[KDA_GA], dlow, io->dx, Gr[KDA_GA], N, d, m->rg, 0, err));
    } else {
        K3RT_TRY(SUF(lin_bwd)(s, x, P[KDA_G], d3, io->dx, Gr[KDA_G], N, d, Dv, 0, err));
    }
    /* on = RMSNorm(o) w_norm: d1 = do */
    K3RT_TRY(k3rt_rmsnorm_bwd(s, KDA_DTYPE, KDA_SV(&l, l.o), P[KDA_NORM], KDA_SV(&l, l.rstd), d2, d1,
                              Gr[KDA_NORM], N * HV, m->dim_v, 0, err));
    /* the recurrence */
    REAL *dq = ws + l.dq, *dk = ws + l.dk, *dv = ws + l.dv, *dg = ws + l.dg;
    REAL *dbeta = ws + l.dbeta;
    const int64_t ns = HV * m->dim_k * m->dim_v;
    const REAL *ds_out = io->ds_out;
    REAL *ds_in = io->ds_in;
    for (int64_t i = 0, at = 0, n = SUF(core_seqs)(io); i < n; i++) {
        SUF(core_seq) q;
        SUF(core_seq_at)(m, io, i, &at, &q);
        int64_t t = q.t0;
        K3RT_TRY(SUF(kda_core_bwd)(s, m->algorithm, &q.d, KDA_SV(&l, l.qn) + t * Dk, KDA_SV(&l, l.kn) + t * Dk,
                                   KDA_SV(&l, l.v) + t * Dv, KDA_SV(&l, l.g) + t * Dg, KDA_SV(&l, l.beta) + t * HV,
                                   KDA_SV(&l, l.states) + q.states, d1 + t * Dv,
                                   q.last && ds_out ? ds_out + q.row * ns : NULL, dq + t * Dk,
                                   dk + t * Dk, dv + t * Dv, dg + t * Dg, dbeta + t * HV,
                                   q.first && ds_in ? ds_in + q.row * ns : NULL, ws + l.core,
                                   l.core_n, err));
    }
    /* forget gate: dg -> dz (in place), dA_log, ddt_bias; then its projections */
    SUF(gate_job) gj = {m, N, P[KDA_ALOG], NULL, dg, KDA_SV(&l, l.z), NULL, dg, Gr[KDA_DTB],
                        ws + l.dac};
    k3rt_parallel_for(s, Dg, 8, SUF(gate_bwd_channels), &gj);
    REAL *dalog = Gr[KDA_ALOG];
    for (int64_t c = 0; c < Dg; c++)
        dalog[c / m->dim_k] += ws[l.dac + c];
    if (m->rf) {
        K3RT_TRY(SUF(lin_bwd)(s, KDA_SV(&l, l.fa), P[KDA_FB], dg, dlow, Gr[KDA_FB], N, m->rf, Dg, 0,
                              err));
        K3RT_TRY(SUF(lin_bwd)(s, x, P[KDA_FA], dlow, io->dx, Gr[KDA_FA], N, d, m->rf, 1, err));
    } else {
        K3RT_TRY(SUF(lin_bwd)(s, x, P[KDA_F], dg, io->dx, Gr[KDA_F], N, d, Dg, 1, err));
    }
    /* beta = sigmoid(x Wb^T) */
    const REAL *beta = KDA_SV(&l, l.beta);
    for (int64_t i = 0; i < N * HV; i++)
        dbeta[i] *= beta[i] * (1 - beta[i]);
    K3RT_TRY(SUF(lin_bwd)(s, x, P[KDA_B], dbeta, io->dx, Gr[KDA_B], N, d, HV, 1, err));
    /* q, k: L2 norm and SiLU (in place), v: SiLU; then conv and projections */
    SUF(l2_job) lq = {H, m->dim_k, KDA_SV(&l, l.qc), KDA_SV(&l, l.qn), KDA_SV(&l, l.rq), NULL, NULL, dq};
    SUF(l2_job) lk = {H, m->dim_k, KDA_SV(&l, l.kc), KDA_SV(&l, l.kn), KDA_SV(&l, l.rk), NULL, NULL, dk};
    K3RT_TRY(SUF(l2_bwd)(s, &lq, N, err));
    K3RT_TRY(SUF(l2_bwd)(s, &lk, N, err));
    K3RT_TRY(k3rt_act_bwd(s, KDA_DTYPE, K3RT_ACT_SILU, KDA_SV(&l, l.vc), dv, d2, N * Dv, 0, err));
    const REAL *hq, *hk, *hv;
    K3RT_TRY(SUF(halo_proj)(m, s, io, &l, ws, &hq, &hk, &hv, err));
    K3RT_TRY(SUF(qkv_bwd)(m, s, io, &l, KDA_SV(&l, l.qp), hq, KDA_Q, KDA_QCONV, Dk, dq, 1, err));
    K3RT_TRY(SUF(qkv_bwd)(m, s, io, &l, KDA_SV(&l, l.kp), hk, KDA_K, KDA_KCONV, Dk, dk, 0, err));
    return SUF(qkv_bwd)(m, s, io, &l, KDA_SV(&l, l.vp), hv, KDA_V, KDA_VCONV, Dv, d2, 0, err);
}
