/* The pieces of one decode step on the CPU (kda.h's kda_dec_kernels; decode.c runs the step),
 * made of the layer forward's own functions, so one token gives what the whole sequence gives
 * at its position: the short conv over the cached inputs as its halo, SiLU and the L2 norm,
 * the forget gate, one step of the recurrent form per head, the output gate. */

static int SUF(dec_conv)(const kda *m, k3rt_stream *s, int64_t B, int64_t heads, int64_t hd,
                         const void *p, void *hist, const void *w, int l2, void *out,
                         void *scratch, k3rt_error *err)
{
    int64_t C = heads * hd, W = m->W;
    REAL *z = scratch, *r = z + B * C, *h = hist;
    kda_io io;
    memset(&io, 0, sizeof io);
    io.B = B, io.T = 1;
    /* the token is a span of one whose halo rows are the W-1 tokens before it */
    SUF(conv_fwd)(s, &io, C, W, p, W > 1 ? h : NULL, w, z);
    if (l2) {
        SUF(l2_job) j = {heads, hd, z, NULL, NULL, out, r, NULL};
        K3RT_TRY(SUF(l2_fwd)(s, &j, B, err));
    } else {
        K3RT_TRY(k3rt_act_fwd(s, KDA_DTYPE, K3RT_ACT_SILU, z, out, B * C, err));
    }
    for (int64_t b = 0; W > 1 && b < B; b++) {
        REAL *hb = h + b * (W - 1) * C;
        memmove(hb, hb + C, (size_t)((W - 2) * C) * sizeof(REAL));
        memcpy(hb + (W - 2) * C, (const REAL *)p + b * C, (size_t)C * sizeof(REAL));
    }
    return K3RT_OK;
}

static int SUF(dec_gate)(const kda *m, k3rt_stream *s, int64_t B, void *z, const void *a_log,
                         const void *dt_bias, void *g, k3rt_error *err)
{
    (void)err;
    SUF(gate_job) j = {m, B, a_log, dt_bias, NULL, z, g, NULL, NULL, NULL};
    SUF(par)(s, B, SUF(gate_fwd_rows), &j);
    return K3RT_OK;
}

typedef struct SUF(dec_recur_job) {
    const kda *m;
    REAL *S, *o, *scratch;
    const REAL *q, *k, *v, *g, *beta;
} SUF(dec_recur_job);

/* Items b * HV + value head; each has dim_k + 2 dim_v of scratch (decay, e, u). */
static void SUF(dec_recur_items)(void *ctx, int64_t begin, int64_t end)
{
    const SUF(dec_recur_job) *j = ctx;
    const kda *m = j->m;
    int64_t dk = m->dim_k, dv = m->dim_v, H = m->H, HV = m->HV;
    REAL scale = (REAL)(1.0 / sqrt((double)dk));
    for (int64_t it = begin; it < end; it++) {
        int64_t b = it / HV, hv = it % HV, qk = b * H + hv / (HV / H);
        REAL *a = j->scratch + it * (dk + 2 * dv), *e = a + dk, *u = e + dv;
        SUF(decay)(dk, j->g + it * dk, a);
        SUF(rec_step)(dk, dv, j->S + it * dk * dv, a, j->k + qk * dk, j->v + it * dv,
                      j->beta[it], j->q + qk * dk, scale, j->o + it * dv, e, u);
    }
}

static int SUF(dec_recur)(const kda *m, k3rt_stream *s, int64_t B, void *S, const void *q,
                          const void *k, const void *v, const void *g, const void *beta,
                          void *o, void *scratch, k3rt_error *err)
{
    (void)err;
    SUF(dec_recur_job) j = {m, S, o, scratch, q, k, v, g, beta};
    k3rt_parallel_for(s, B * m->HV, 1, SUF(dec_recur_items), &j);
    return K3RT_OK;
}

static int SUF(dec_ogate)(const kda *m, k3rt_stream *s, int64_t n, const void *on,
                          const void *G, void *yg, k3rt_error *err)
{
    (void)m;
    SUF(ogate_job) j = {n, on, G, NULL, yg, NULL, NULL};
    return SUF(ogate_fwd)(s, &j, 1, err);
}

const kda_dec_kernels SUF(kda_dec_cpu) = {SUF(dec_conv), SUF(dec_gate), SUF(dec_recur),
                                          SUF(dec_ogate)};
