/* The elementwise pieces around the recurrence, forward and backward side by side (spec §2.1,
 * §3.2): the causal depthwise short conv, SiLU + per-head L2 norm of q and k, the forget gate,
 * and the sigmoid output gate. Each is row-parallel over tokens, except the parameter
 * gradients, which are parallel over channels so every sum has one owner (deterministic). */

/* ---- causal depthwise conv ---------------------------------------------------------------- */
/* z[b,t,c] = sum_j w[c,j] u[b, t-W+1+j, c] over the tokens of t's document; rows before the
 * span come from halo [B, W-1, C] (or are zero) for the first document of each row, later
 * documents start from zeros (docs: kda_io.docs on the host, or NULL). u, z: [B, T, C];
 * w: [C, W]. */
typedef struct SUF(conv_job) {
    int64_t B, T, C, W;
    const REAL *u, *halo, *w, *dz;
    REAL *z, *du, *dhalo, *dw;
    const int32_t *docs;
    int64_t n_docs;
} SUF(conv_job);

/* Row-local input token tau as seen by an output token whose document starts at s. */
static const REAL *SUF(conv_src)(const SUF(conv_job) *j, int64_t b, int64_t tau, int64_t s)
{
    if (tau >= s)
        return j->u + (b * j->T + tau) * j->C;
    return j->halo && s == 0 ? j->halo + (b * (j->W - 1) + j->W - 1 + tau) * j->C : NULL;
}

static void SUF(conv_fwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(conv_job) *j = ctx;
    int64_t C = j->C, W = j->W;
    for (int64_t row = begin; row < end; row++) {
        int64_t b = row / j->T, t = row % j->T, s, e;
        kda_doc_span(j->docs, j->n_docs, j->T, b, t, &s, &e);
        REAL *z = j->z + row * C;
        memset(z, 0, (size_t)C * sizeof(REAL));
        for (int64_t k = 0; k < W; k++) {
            const REAL *src = SUF(conv_src)(j, b, t - W + 1 + k, s);
            if (src)
                for (int64_t c = 0; c < C; c++)
                    z[c] += j->w[c * W + k] * src[c];
        }
    }
}

/* du[tau] = sum_k w[., k] dz[tau + W-1-k] over the outputs of tau's document; rows tau < 0
 * go to dhalo (outputs of the row's first document). */
static void SUF(conv_bwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(conv_job) *j = ctx;
    int64_t C = j->C, W = j->W, T = j->T, Th = T + W - 1;
    for (int64_t row = begin; row < end; row++) { /* row = b*(T+W-1) + (tau + W-1) */
        int64_t b = row / Th, tau = row % Th - (W - 1), s, e;
        REAL *du = tau >= 0 ? j->du + (b * T + tau) * C
                            : j->dhalo ? j->dhalo + (b * (W - 1) + W - 1 + tau) * C : NULL;
        if (!du)
            continue;
        kda_doc_span(j->docs, j->n_docs, T, b, tau > 0 ? tau : 0, &s, &e);
        memset(du, 0, (size_t)C * sizeof(REAL));
        for (int64_t k = 0; k < W; k++) {
            int64_t t = tau + W - 1 - k;
            if (t < 0 || t >= e)
                continue;
            const REAL *dz = j->dz + (b * T + t) * C;
            for (int64_t c = 0; c < C; c++)
                du[c] += j->w[c * W + k] * dz[c];
        }
    }
}

static void SUF(conv_dw_channels)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(conv_job) *j = ctx;
    int64_t C = j->C, W = j->W;
    for (int64_t b = 0; b < j->B; b++)
        for (int64_t t = 0; t < j->T; t++) {
            int64_t s, e;
            kda_doc_span(j->docs, j->n_docs, j->T, b, t, &s, &e);
            const REAL *dz = j->dz + (b * j->T + t) * C;
            for (int64_t k = 0; k < W; k++) {
                const REAL *src = SUF(conv_src)(j, b, t - W + 1 + k, s);
                if (src)
                    for (int64_t c = begin; c < end; c++)
                        j->dw[c * W + k] += src[c] * dz[c];
            }
        }
}

static void SUF(conv_fwd)(k3rt_stream *s, const kda_io *io, int64_t C, int64_t W, const REAL *u,
                          const REAL *halo, const REAL *w, REAL *z)
{
    SUF(conv_job) j = {io->B, io->T, C, W, u, halo, w, NULL, z, NULL, NULL, NULL,
                       io->docs, io->n_docs};
    SUF(par)(s, io->B * io->T, SUF(conv_fwd_rows), &j);
}

/* du overwritten, dhalo overwritten when given, dw accumulated. */
static void SUF(conv_bwd)(k3rt_stream *s, const kda_io *io, int64_t C, int64_t W, const REAL *u,
                          const REAL *halo, const REAL *w, const REAL *dz, REAL *du, REAL *dhalo,
                          REAL *dw)
{
    SUF(conv_job) j = {io->B, io->T, C, W, u, halo, w, dz, NULL, du, halo ? dhalo : NULL, dw,
                       io->docs, io->n_docs};
    SUF(par)(s, io->B * (io->T + W - 1), SUF(conv_bwd_rows), &j);
    k3rt_parallel_for(s, C, 8, SUF(conv_dw_channels), &j);
}

/* ---- SiLU then L2 norm per head ----------------------------------------------------------- */
/* y = x / sqrt(sum x^2 + 1e-6), x = silu(z), per head of width dh; r = that 1/sqrt. */
typedef struct SUF(l2_job) {
    int64_t heads, dh;
    const REAL *z, *y, *r;
    REAL *yo, *ro, *dyz; /* forward outputs; backward: dy in, dz out (in place) */
} SUF(l2_job);

#define KDA_L2_EPS 1e-6

/* yo holds silu(z) already; each head of each row scaled to unit norm */
static void SUF(l2_fwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(l2_job) *j = ctx;
    int64_t D = j->heads * j->dh;
    for (int64_t row = begin; row < end; row++)
        for (int64_t h = 0; h < j->heads; h++) {
            REAL *y = j->yo + row * D + h * j->dh, ss = 0;
            for (int64_t c = 0; c < j->dh; c++)
                ss += y[c] * y[c];
            REAL r = (REAL)1 / SQRT(ss + (REAL)KDA_L2_EPS);
            for (int64_t c = 0; c < j->dh; c++)
                y[c] *= r;
            j->ro[row * j->heads + h] = r;
        }
}

/* The SiLU through the runtime's activation over the whole tensor (vectorised for float), then
 * the norms row by row. */
static int SUF(l2_fwd)(k3rt_stream *s, const SUF(l2_job) *j, int64_t rows, k3rt_error *err)
{
    K3RT_TRY(k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SILU, j->z, j->yo, rows * j->heads * j->dh,
                          err));
    SUF(par)(s, rows, SUF(l2_fwd_rows), (void *)j);
    return K3RT_OK;
}

/* dx = r (dy - (dy . y) y), in place */
static void SUF(l2_bwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(l2_job) *j = ctx;
    int64_t D = j->heads * j->dh;
    for (int64_t row = begin; row < end; row++)
        for (int64_t h = 0; h < j->heads; h++) {
            int64_t o = row * D + h * j->dh;
            const REAL *y = j->y + o;
            REAL *d = j->dyz + o, r = j->r[row * j->heads + h];
            REAL dot = SUF(dot)(d, y, j->dh);
            for (int64_t c = 0; c < j->dh; c++)
                d[c] = r * (d[c] - dot * y[c]);
        }
}

/* dx row by row, then dz = dx silu'(z) = dx sigmoid(z) (1 + z (1 - sigmoid(z))) through the
 * runtime's activation, in place */
static int SUF(l2_bwd)(k3rt_stream *s, const SUF(l2_job) *j, int64_t rows, k3rt_error *err)
{
    SUF(par)(s, rows, SUF(l2_bwd_rows), (void *)j);
    return k3rt_act_bwd(s, KDA_DTYPE, K3RT_ACT_SILU, j->z, j->dyz, j->dyz,
                        rows * j->heads * j->dh, 0, err);
}

/* ---- forget gate (spec §3.2) -------------------------------------------------------------- */
/* z <- z + dt_bias (in place), then per channel of value head h:
 *   lower bound lb: g = lb * sigmoid(e^A_log[h] z)      in (lb, 0): retention >= e^lb
 *   none:           g = -e^A_log[h] * softplus(z)       (Kimi-Linear)                    */
typedef struct SUF(gate_job) {
    const kda *m;
    int64_t n;             /* rows */
    const REAL *a_log, *bias, *dgate;
    REAL *z, *g, *dz, *dbias, *dac;
} SUF(gate_job);

static void SUF(gate_fwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(gate_job) *j = ctx;
    int64_t dim_k = j->m->dim_k, HV = j->m->HV, D = HV * dim_k;
    REAL lb = (REAL)j->m->lb;
    for (int64_t row = begin; row < end; row++)
        for (int64_t h = 0; h < HV; h++) {
            REAL ea = EXP(j->a_log[h]);
            REAL *z = j->z + row * D + h * dim_k, *g = j->g + row * D + h * dim_k;
            const REAL *bias = j->bias ? j->bias + h * dim_k : NULL;
            for (int64_t c = 0; c < dim_k; c++) {
                if (bias)
                    z[c] += bias[c];
                g[c] = j->m->has_lb ? lb * SUF(sigmoid)(ea * z[c]) : -ea * SUF(softplus)(z[c]);
            }
        }
}

/* dz = dg dg/dz (written over dg), dt_bias[c] += sum dz, dac[c] = sum dg dg/dA_log. Parallel
 * over channels, rows in order, so each sum has one owner and one order. */
static void SUF(gate_bwd_channels)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(gate_job) *j = ctx;
    int64_t dim_k = j->m->dim_k, D = j->m->HV * dim_k;
    REAL lb = (REAL)j->m->lb;
    for (int64_t c = begin; c < end; c++)
        j->dac[c] = 0;
    for (int64_t row = 0; row < j->n; row++) {
        int64_t h = -1;
        REAL ea = 0;
        for (int64_t c = begin; c < end; c++) {
            if (c / dim_k != h)
                h = c / dim_k, ea = EXP(j->a_log[h]);
            REAL z = j->z[row * D + c], dg = j->dgate[row * D + c], dz, dA;
            if (j->m->has_lb) {
                REAL y = ea * z, sg = SUF(sigmoid)(y), ds = lb * sg * (1 - sg);
                dz = dg * ds * ea;
                dA = dg * ds * y;
            } else {
                dz = -dg * ea * SUF(sigmoid)(z);
                dA = dg * -ea * SUF(softplus)(z);
            }
            j->dz[row * D + c] = dz;
            j->dbias[c] += dz;
            j->dac[c] += dA;
        }
    }
}

/* ---- output gate -------------------------------------------------------------------------- */
/* yg = on ⊙ sigmoid(G);  d(on) = dyg ⊙ sigmoid(G),  dG = dyg ⊙ on ⊙ sigmoid'(G) */
typedef struct SUF(ogate_job) {
    int64_t D;
    const REAL *on, *G, *dyg;
    REAL *yg, *don, *dG;
} SUF(ogate_job);

/* yg holds sigmoid(G) already */
static void SUF(ogate_fwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(ogate_job) *j = ctx;
    for (int64_t i = begin * j->D; i < end * j->D; i++)
        j->yg[i] *= j->on[i];
}

/* don holds sigmoid(G) already */
static void SUF(ogate_bwd_rows)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(ogate_job) *j = ctx;
    for (int64_t i = begin * j->D; i < end * j->D; i++) {
        REAL sg = j->don[i];
        j->dG[i] = j->dyg[i] * j->on[i] * sg * (1 - sg);
        j->don[i] = j->dyg[i] * sg;
    }
}

/* The sigmoids through the runtime's activation over the whole tensor (vectorised for float),
 * into the output, then the products row by row. */
static int SUF(ogate_fwd)(k3rt_stream *s, const SUF(ogate_job) *j, int64_t rows, k3rt_error *err)
{
    K3RT_TRY(k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SIGMOID, j->G, j->yg, rows * j->D, err));
    SUF(par)(s, rows, SUF(ogate_fwd_rows), (void *)j);
    return K3RT_OK;
}

static int SUF(ogate_bwd)(k3rt_stream *s, const SUF(ogate_job) *j, int64_t rows, k3rt_error *err)
{
    K3RT_TRY(k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SIGMOID, j->G, j->don, rows * j->D, err));
    SUF(par)(s, rows, SUF(ogate_bwd_rows), (void *)j);
    return K3RT_OK;
}
