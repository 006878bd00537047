/* One Muon block update and the QK-clip rescale, written once over REAL (see ns.inc.c).
 *
 * For block B (rows x cols) of a Muon parameter W with gradient G and momentum M:
 *   M = beta M + (1 - beta) G                       EMA momentum, beta = momentum
 *   U = (1 - beta) G + beta M   (nesterov)  or  U = M
 *   O = NewtonSchulz(U)                             the block alone (per-head / per-expert)
 *   W = W (1 - lr wd) - lr * scale * sqrt(max(rows, cols)) * O
 * The factor makes the update RMS about scale (0.17-0.2 for scale 0.2, since O's singular
 * values are in [0.68, 1.2] rather than 1), the size of an AdamW update, so one learning rate
 * serves both groups. */

/* Scratch: U / O (rows x cols), the Newton-Schulz ping-pong buffer (rows x cols), S and P. */
int SUF(muon_block)(k3rt_stream *s, const muon_block_args *a, REAL *scratch, k3rt_error *err)
{
    const muon *o = a->o;
    const muon_view *v = &a->p->view;
    const int64_t R = v->rows, C = v->cols, m = R <= C ? R : C, off = a->block * v->stride;
    REAL *w = (REAL *)a->param + off, *mom = (REAL *)a->p->state + off;
    const REAL *g = (const REAL *)a->grad + off;
    REAL *u = scratch, *y = u + R * C, *sq = y + R * C, *p = sq + m * m;
    const REAL beta = (REAL)o->momentum, one_beta = (REAL)(1.0 - o->momentum);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            int64_t i = r * v->ld + c;
            mom[i] = beta * mom[i] + one_beta * g[i];
            u[r * C + c] = o->nesterov ? one_beta * g[i] + beta * mom[i] : mom[i];
        }
    K3RT_TRY(SUF(muon_newton_schulz)(s, u, y, sq, p, R, C, o->ns_steps, o->ns_bf16, err));
    const REAL rate = (REAL)(a->lr * o->scale * sqrt((double)(R > C ? R : C)));
    const REAL keep = (REAL)(1.0 - (a->p->decayed ? a->lr * o->weight_decay : 0.0));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            int64_t i = r * v->ld + c;
            w[i] = w[i] * keep - rate * u[r * C + c];
        }
    return K3RT_OK;
}

/* w[block] *= factor for one block of a view (a head's rows or columns). */
void SUF(muon_scale_block)(REAL *w, const muon_view *v, int64_t block, double factor)
{
    REAL f = (REAL)factor, *b = w + block * v->stride;
    for (int64_t r = 0; r < v->rows; r++)
        for (int64_t c = 0; c < v->cols; c++)
            b[r * v->ld + c] *= f;
}
