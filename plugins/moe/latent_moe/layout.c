/* Where each saved tensor and scratch buffer lives (latent_moe.h), computed once for memory()
 * and for every call, so the byte counts the engine plans with are the ones the code uses. */
#include "latent_moe.h"

/* Every buffer starts on a 64-byte boundary. */
static int64_t take(int64_t *at, int64_t bytes)
{
    int64_t off = *at;
    *at += (bytes + 63) / 64 * 64;
    return off;
}

void lmoe_layout_make(const latent_moe *f, int64_t N, lmoe_layout *L)
{
    int64_t es = (int64_t)k3rt_dtype_size(f->dtype), R = N * f->k, E = f->E, at = 0;
    int64_t sh = f->Hs > 0 ? N * f->Hs * es : 0, nb = f->latent_norm ? N * f->l * es : 0;
    L->s = take(&at, N * E * es);
    L->s32 = take(&at, f->dtype == K3RT_F32 ? 0 : N * E * 4);
    if (f->dtype == K3RT_F32)
        L->s32 = L->s;
    L->sel = take(&at, R * 4);
    L->pos = take(&at, R * 4);
    L->p = take(&at, R * es);
    L->counts = take(&at, E * 8);
    L->offsets = take(&at, (E + 1) * 8);
    L->bias = take(&at, E * 4);
    L->part_end[LMOE_SAVED_ROUTING] = at;
    L->c = take(&at, N * f->l * es);
    L->part_end[LMOE_SAVED_LATENT_IN] = at;
    L->g = take(&at, R * f->m * es);
    L->u = take(&at, R * f->m * es);
    L->part_end[LMOE_SAVED_EXPERT_GU] = at;
    L->a = take(&at, R * f->m * es);
    L->part_end[LMOE_SAVED_EXPERT_ACT] = at;
    L->ye = take(&at, R * f->l * es);
    L->part_end[LMOE_SAVED_EXPERT_OUT] = at;
    L->U = take(&at, N * f->l * es);
    L->rstd = take(&at, f->latent_norm ? N * es : 0);
    L->nrm = take(&at, nb);
    L->part_end[LMOE_SAVED_LATENT_OUT] = at;
    L->sg = take(&at, sh);
    L->su = take(&at, sh);
    L->part_end[LMOE_SAVED_SHARED_GU] = at;
    L->sa = take(&at, sh);
    L->part_end[LMOE_SAVED_SHARED_ACT] = at;
    L->saved = at;

    at = 0;
    L->f_xe = take(&at, R * f->l * es);
    L->fwd = at;

    at = 0;
    L->b_dn = take(&at, N * f->l * es);
    L->b_dU = take(&at, nb);
    if (!f->latent_norm)
        L->b_dU = L->b_dn;
    L->b_dp = take(&at, R * es);
    L->b_dye = take(&at, R * f->l * es);
    L->b_da = take(&at, R * f->m * es);
    L->b_dg = take(&at, R * f->m * es);
    L->b_du = take(&at, R * f->m * es);
    L->b_xe = take(&at, R * f->l * es);
    L->b_dc = take(&at, N * f->l * es);
    L->b_dz = take(&at, N * E * es);
    L->b_dsa = take(&at, sh);
    L->b_dsg = take(&at, sh);
    L->b_dsu = take(&at, sh);
    L->bwd = at;
    L->workspace = L->bwd > L->fwd ? L->bwd : L->fwd;
}
