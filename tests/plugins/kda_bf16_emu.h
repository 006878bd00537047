/* The kda plugin's CUDA path under bf16 (plugins/attention/kda/cuda.c and its cuda folder's
 * kernels), emulated on the CPU: the same dataflow in float64 with every value the CUDA path
 * stores or feeds to the tensor cores in bf16 rounded to bf16 (round to nearest even, as
 * __float2bfloat16_rn) at the same place, and nothing else rounded. What this leaves out is
 * fp32 arithmetic itself (the f32 path shows it: ~1e-6 relative), so emu_layer's error
 * against the float64 reference is the error a correct bf16 implementation of this dataflow
 * has, case by case. Test-only.
 *
 * The rounding points, each a bit of `rnd` (EMU_ALL = the CUDA path as it is):
 *   layer, between kernels (cuda.c): projections (q/k/v, halo rows, the gates' projections and
 *   low-rank hiddens, beta logits), conv outputs (q, k after L2, v), the log decay g, beta,
 *   the recurrence's o, the normed o, the o_proj input yg, the layer outputs; in the backward
 *   the activation gradients between kernels (dyg, dG, dlow, dO, dzf, dbeta logits, conv
 *   inputs' and halo rows' gradients, dx and d_x_prefix after each accumulation), d(normed o),
 *   the recurrence's dq, dk, dv, dg, dbeta.
 *   recurrence (cuda/chunk.cu, cuda/state.cu), per 64-token chunk and value head, gates and
 *   the inverse in fp32: the sides q 2^Hr, k 2^Hr, k 2^(Md - Hr) (midpoint references of the
 *   16-token sub-chunks), Aqk, Lk, T, beta Γ k, beta v, W, U, s q Γ, k Γ̄; in the state pass
 *   the state and Δ as operands (the state itself stays fp32); in the backward the gradient of
 *   the state and dΔ as operands, dW, dAqk, dT, T^T dT, dLk, Γ k.
 * Parameter gradients and states are float (not rounded here). */
#ifndef K3RT_TEST_KDA_BF16_EMU_H
#define K3RT_TEST_KDA_BF16_EMU_H

#include "kda_testkit.h"
#include "kda_layer_kit.h"

enum {
    EMU_PROJ = 1 << 0,   /* projection outputs and low-rank hiddens */
    EMU_QKV = 1 << 1,    /* the conv outputs: q, k (L2-normed), v */
    EMU_G = 1 << 2,      /* the log decay g (after the gate activation) */
    EMU_BETA = 1 << 3,   /* beta (after the sigmoid) */
    EMU_O = 1 << 4,      /* the recurrence's output o */
    EMU_ON = 1 << 5,     /* RMSNorm(o) w_norm */
    EMU_YG = 1 << 6,     /* the o_proj input, normed o ⊙ sigmoid(gate) */
    EMU_OUT = 1 << 7,    /* the layer's outputs y, dx, d_x_prefix (their final values) */
    EMU_DACT = 1 << 8,   /* activation gradients between kernels; dx after each accumulation */
    EMU_DON = 1 << 9,    /* d(normed o) */
    EMU_DQKV = 1 << 10,  /* the recurrence's dq, dk, dv */
    EMU_DG = 1 << 11,    /* the recurrence's dg */
    EMU_DBETA = 1 << 12, /* the recurrence's dbeta */
    EMU_CORE = 1 << 13,  /* inside the recurrence kernels */
    EMU_ALL = (1 << 14) - 1,
    /* defects, to measure which of them the CUDA checks catch (test_kda_bf16) */
    EMU_BAD_TRUNC = 1 << 14,  /* every rounding toward zero instead of to nearest */
    EMU_BAD_STATE = 1 << 15,  /* the state stored in bf16 after every chunk */
    EMU_BAD_GCUM = 1 << 16,   /* the chunk's cumulative gate rounded to bf16 */
    EMU_BAD_BETA = 1 << 17    /* beta 1 % too large inside the recurrence */
};

/* x as bf16 holds it: to float (as the kernels' fp32 values), then round to nearest even. */
static inline double emu_bf16(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0x7fffu + ((u >> 16) & 1u);
        u &= 0xffff0000u;
        memcpy(&f, &u, 4);
    }
    return f;
}

/* x toward zero to bf16 (EMU_BAD_TRUNC) */
static inline double emu_bf16_rz(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline double emu_r(unsigned rnd, unsigned bit, double x)
{
    if (!(rnd & bit))
        return x;
    return rnd & EMU_BAD_TRUNC ? emu_bf16_rz(x) : emu_bf16(x);
}

static inline void emu_ra(unsigned rnd, unsigned bit, double *x, int64_t n)
{
    for (int64_t i = 0; i < n && (rnd & bit); i++)
        x[i] = emu_r(rnd, bit, x[i]);
}

/* The limit the CUDA checks hold a bf16 error to, from the emulated error of the same case and
 * quantity: twice it (the CUDA path's realisation of the same roundings differs only where
 * fp32 arithmetic tips a rounding), and never below 1e-3 (quantities the emulation gets nearly
 * exactly, where fp32 arithmetic may be all the CUDA error there is: the f32 path's is 1e-6). */
static inline double emu_limit(double emulated) { return fmax(2 * emulated, 1e-3); }

/* ---- the recurrence (cuda/chunk.cu, cuda/state.cu) ------------------------------------------ */

/* out = x as a product operand of the recurrence's kernels (the state, its gradient) */
static inline void emu_operand(unsigned rnd, const double *x, double *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = emu_r(rnd, EMU_CORE, x[i]);
}

enum { EC = 64, ESUB = 16, ENB = EC / ESUB };

/* One 64-token chunk of one value head: the prep's outputs and what the state passes keep. */
typedef struct emu_chunk {
    int n;                        /* valid rows */
    int64_t t0;                   /* first token (index into the N tokens) */
    double *G;                    /* [EC, D] cumulative log decay (rows past n: g = 0) */
    double *Qt, *Kt, *KC[ENB];    /* [EC, D] sides: q, k 2^Hr; k 2^(Md(I) - Hr) */
    double *A, *Lk, *T, *TE;      /* [EC, EC] Aqk, Lk (stored), T (fp32), T as an operand */
    double *W, *U, *Qg, *Kb, *gam;  /* [EC, D] x4, [D] */
    double *St, *Dt, *dSt, *dDt;  /* [D, D] S as used, [EC, D] Δ, [D, D] dS' as used, dΔ */
    double *slab;
} emu_chunk;

typedef struct emu_core {
    unsigned rnd;
    int64_t H, HV, D, N;
    double s;                                  /* D^-1/2 */
    const double *q, *k, *v, *g, *beta;        /* [N, H, D] x2, [N, HV, D] x2, [N, HV] */
} emu_core;

static inline void emu_chunk_alloc(emu_chunk *c, int64_t D)
{
    const int64_t T = EC * D, A = EC * EC;
    c->slab = kt_alloc(13 * T + 4 * A + D + 4 * D * D);
    double *p = c->slab;
    double **td[] = {&c->G, &c->Qt, &c->Kt, &c->KC[0], &c->KC[1], &c->KC[2], &c->KC[3], &c->W,
                     &c->U, &c->Qg, &c->Kb, &c->Dt, &c->dDt};
    for (size_t i = 0; i < sizeof td / sizeof td[0]; i++)
        *td[i] = p, p += T;
    c->A = p, p += A, c->Lk = p, p += A, c->T = p, p += A, c->TE = p, p += A;
    c->gam = p, p += D;
    c->St = p, p += D * D, c->dSt = p, p += D * D;
}

/* The prep kernel of chunk (t0, n) of value head hv. */
static inline void emu_prep(const emu_core *e, int hv, int64_t t0, int n, emu_chunk *c)
{
    const int64_t D = e->D, HV = e->HV, hq = hv / (HV / e->H);
    const unsigned R = e->rnd;
    c->n = n, c->t0 = t0;
    memset(c->slab, 0, sizeof(double) * (size_t)(13 * EC * D + 4 * EC * EC));
    for (int r = 0; r < EC; r++)
        for (int64_t j = 0; j < D; j++)
            c->G[r * D + j] = (r ? c->G[(r - 1) * D + j] : 0) +
                              (r < n ? e->g[((t0 + r) * HV + hv) * D + j] : 0);
    if (R & EMU_BAD_GCUM)
        for (int64_t i = 0; i < EC * D; i++)
            c->G[i] = emu_bf16(c->G[i]);
    const int last = n - 1;
    for (int r = 0; r < n; r++) {
        const double *q = e->q + ((t0 + r) * e->H + hq) * D, *k = e->k + ((t0 + r) * e->H + hq) * D;
        const int I = r / ESUB;
        for (int64_t j = 0; j < D; j++) {
            const double Gr = c->G[r * D + j], h = exp(Gr - c->G[(I * ESUB + 8) * D + j]);
            c->Qt[r * D + j] = emu_r(R, EMU_CORE, q[j] * h);
            c->Kt[r * D + j] = emu_r(R, EMU_CORE, k[j] * h);
            for (int I2 = I; I2 < ENB; I2++)
                c->KC[I2][r * D + j] =
                    emu_r(R, EMU_CORE, k[j] * exp(c->G[(I2 * ESUB + 8) * D + j] - Gr));
            c->Qg[r * D + j] = emu_r(R, EMU_CORE, e->s * q[j] * exp(Gr));
            c->Kb[r * D + j] = emu_r(R, EMU_CORE, k[j] * exp(c->G[last * D + j] - Gr));
        }
    }
    for (int64_t j = 0; j < D; j++)
        c->gam[j] = exp(c->G[last * D + j]);
    double Lf[EC * EC];
    memset(Lf, 0, sizeof Lf);
    for (int r = 0; r < n; r++) {
        const double br = e->beta[(t0 + r) * HV + hv];
        const double *KCr = c->KC[r / ESUB];
        for (int i = 0; i <= r; i++) {
            double a = 0, l = 0;
            for (int64_t j = 0; j < D; j++) {
                a += c->Qt[r * D + j] * KCr[i * D + j];
                l += c->Kt[r * D + j] * KCr[i * D + j];
            }
            c->A[r * EC + i] = emu_r(R, EMU_CORE, e->s * a);
            if (i < r) {
                c->Lk[r * EC + i] = emu_r(R, EMU_CORE, l);
                Lf[r * EC + i] = br * l;
            }
        }
    }
    /* T = (I + Lf)^-1, unit lower triangular */
    for (int col = 0; col < n; col++)
        for (int r = col; r < n; r++) {
            double t = r == col ? 1 : 0;
            for (int i = col; i < r; i++)
                t -= Lf[r * EC + i] * c->T[i * EC + col];
            c->T[r * EC + col] = t;
            c->TE[r * EC + col] = emu_r(R, EMU_CORE, t);
        }
    double *KgB = kt_alloc(EC * D), *bV = kt_alloc(EC * D);
    for (int r = 0; r < n; r++) {
        const double br = e->beta[(t0 + r) * HV + hv];
        const double *k = e->k + ((t0 + r) * e->H + hq) * D, *v = e->v + ((t0 + r) * HV + hv) * D;
        for (int64_t j = 0; j < D; j++) {
            KgB[r * D + j] = emu_r(R, EMU_CORE, br * k[j] * exp(c->G[r * D + j]));
            bV[r * D + j] = emu_r(R, EMU_CORE, br * v[j]);
        }
    }
    for (int r = 0; r < n; r++)
        for (int64_t j = 0; j < D; j++) {
            double w = 0, u = 0;
            for (int i = 0; i <= r; i++) {
                w += c->TE[r * EC + i] * KgB[i * D + j];
                u += c->TE[r * EC + i] * bV[i * D + j];
            }
            c->W[r * D + j] = emu_r(R, EMU_CORE, w);
            c->U[r * D + j] = emu_r(R, EMU_CORE, u);
        }
    free(KgB), free(bV);
}

/* The forward state pass over one chunk: S [D, D] ([key][value]) in, S' out; o rows. */
static inline void emu_state_fwd(const emu_core *e, int hv, emu_chunk *c, double *S, double *o)
{
    const int64_t D = e->D, HV = e->HV;
    const int n = c->n;
    const unsigned R = e->rnd;
    emu_operand(R, S, c->St, D * D);
    for (int r = 0; r < n; r++)
        for (int64_t v = 0; v < D; v++) {
            double x = c->U[r * D + v];
            for (int64_t j = 0; j < D; j++)
                x -= c->W[r * D + j] * c->St[j * D + v];
            c->Dt[r * D + v] = emu_r(R, EMU_CORE, x);
        }
    for (int r = 0; r < n; r++)
        for (int64_t v = 0; v < D; v++) {
            double x = 0;
            for (int64_t j = 0; j < D; j++)
                x += c->Qg[r * D + j] * c->St[j * D + v];
            for (int i = 0; i <= r; i++)
                x += c->A[r * EC + i] * c->Dt[i * D + v];
            o[((c->t0 + r) * HV + hv) * D + v] = emu_r(R, EMU_O, x);
        }
    for (int64_t j = 0; j < D; j++)
        for (int64_t v = 0; v < D; v++) {
            double x = S[j * D + v] * c->gam[j];
            for (int r = 0; r < n; r++)
                x += c->Kb[r * D + j] * c->Dt[r * D + v];
            S[j * D + v] = R & EMU_BAD_STATE ? emu_bf16(x) : x;
        }
}

/* The reverse state pass over one chunk: dS (gradient at the chunk's end) in, at its start out. */
static inline void emu_state_bwd(const emu_core *e, int hv, emu_chunk *c, const double *dO,
                                 double *dS)
{
    const int64_t D = e->D, HV = e->HV;
    const int n = c->n;
    emu_operand(e->rnd, dS, c->dSt, D * D);
    for (int r = 0; r < n; r++)
        for (int64_t v = 0; v < D; v++) {
            double x = 0;
            for (int t = r; t < n; t++)
                x += c->A[t * EC + r] * dO[((c->t0 + t) * HV + hv) * D + v];
            for (int64_t j = 0; j < D; j++)
                x += c->Kb[r * D + j] * c->dSt[j * D + v];
            c->dDt[r * D + v] = emu_r(e->rnd, EMU_CORE, x);
        }
    for (int64_t j = 0; j < D; j++)
        for (int64_t v = 0; v < D; v++) {
            double x = dS[j * D + v] * c->gam[j];
            for (int r = 0; r < n; r++)
                x += c->Qg[r * D + j] * dO[((c->t0 + r) * HV + hv) * D + v] -
                     c->W[r * D + j] * c->dDt[r * D + v];
            dS[j * D + v] = x;
        }
}

/* The backward's chunk kernels (bwd_a, bwd_b) on one chunk: adds this chunk's dq, dk of value
 * head hv (dqv, dkv [N, HV, D]) and writes dv, dg, dbeta. */
static inline void emu_chunk_bwd(const emu_core *e, int hv, const emu_chunk *c, const double *dO,
                                 double *dqv, double *dkv, double *dv, double *dg, double *dbeta)
{
    const int64_t D = e->D, HV = e->HV, hq = hv / (HV / e->H), t0 = c->t0;
    const int n = c->n;
    const unsigned R = e->rnd;
    const double s = e->s;
    double *dq = kt_alloc(EC * D), *dk = kt_alloc(EC * D), *dG = kt_alloc(EC * D);
    double *dW = kt_alloc(EC * D), *Kg = kt_alloc(EC * D), *acc = kt_alloc(EC * D);
    double *dAs = kt_alloc(EC * EC), *dLk = kt_alloc(EC * EC), *dT = kt_alloc(EC * EC);
    double *X = kt_alloc(EC * EC), *dd = kt_alloc(EC), *db = kt_alloc(EC), *dGl = kt_alloc(D);
#define DOV(r, v) dO[((t0 + (r)) * HV + hv) * D + (v)]
#define GAM(r, j) exp(c->G[(r) * D + (j)])
#define BETA(r) e->beta[(t0 + (r)) * HV + hv]
    const double *kk = e->k + (t0 * e->H + hq) * D, *vv = e->v + (t0 * HV + hv) * D;
    const int64_t ldq = e->H * D, ldv = HV * D;
    /* dQg = dO S^T; dW = -dΔ S^T; dAqk = s dO Δ^T */
    for (int r = 0; r < n; r++)
        for (int64_t j = 0; j < D; j++) {
            double a = 0, w = 0;
            for (int64_t v = 0; v < D; v++) {
                a += DOV(r, v) * c->St[j * D + v];
                w += c->dDt[r * D + v] * c->St[j * D + v];
            }
            dq[r * D + j] = s * GAM(r, j) * a;
            dG[r * D + j] = c->Qg[r * D + j] * a;
            dW[r * D + j] = emu_r(R, EMU_CORE, -w);
        }
    for (int r = 0; r < n; r++)
        for (int i = 0; i <= r; i++) {
            double a = 0;
            for (int64_t v = 0; v < D; v++)
                a += DOV(r, v) * c->Dt[i * D + v];
            if (i < r)
                dAs[r * EC + i] = emu_r(R, EMU_CORE, s * a);
            else
                dd[r] = s * a;
        }
    /* dγ, the last row's gate gradient */
    for (int64_t j = 0; j < D; j++) {
        double x = 0;
        for (int64_t v = 0; v < D; v++)
            x += c->St[j * D + v] * c->dSt[j * D + v];
        dGl[j] = x * c->gam[j];
    }
    /* dKb = Δ dS'^T */
    for (int r = 0; r < n; r++)
        for (int64_t j = 0; j < D; j++) {
            double a = 0;
            for (int64_t v = 0; v < D; v++)
                a += c->Dt[r * D + v] * c->dSt[j * D + v];
            dk[r * D + j] += exp(c->G[(n - 1) * D + j] - c->G[r * D + j]) * a;
            if (r < n - 1) {
                double x = c->Kb[r * D + j] * a;
                dG[r * D + j] -= x;
                dGl[j] += x;
            }
        }
    for (int r = 0; r < n; r++)
        for (int64_t j = 0; j < D; j++)
            Kg[r * D + j] = emu_r(R, EMU_CORE, kk[r * ldq + j] * GAM(r, j));
    /* T^T dW -> k, g, beta through W = T (beta Γ k); T^T dΔ -> v, beta through U = T (beta v) */
    for (int r = 0; r < n; r++) {
        const double br = BETA(r);
        for (int64_t j = 0; j < D; j++) {
            double a = 0, b = 0;
            for (int t = r; t < n; t++) {
                a += c->TE[t * EC + r] * dW[t * D + j];
                b += c->TE[t * EC + r] * c->dDt[t * D + j];
            }
            dk[r * D + j] += br * GAM(r, j) * a;
            dG[r * D + j] += br * Kg[r * D + j] * a;
            db[r] += Kg[r * D + j] * a + vv[r * ldv + j] * b;
            dv[((t0 + r) * HV + hv) * D + j] = emu_r(R, EMU_DQKV, br * b);
        }
    }
    /* dT = (dW (Γ k)^T + dΔ v^T) Diag(beta), strictly lower; X = T^T dT; dL = -X T^T */
    for (int r = 0; r < n; r++)
        for (int i = 0; i < r; i++) {
            double a = 0;
            for (int64_t j = 0; j < D; j++)
                a += dW[r * D + j] * Kg[i * D + j] + c->dDt[r * D + j] * vv[i * ldv + j];
            dT[r * EC + i] = emu_r(R, EMU_CORE, BETA(i) * a);
        }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < ESUB * (r / ESUB + 1) && i < n; i++) {
            double a = 0;
            for (int t = r; t < n; t++)
                a += c->TE[t * EC + r] * dT[t * EC + i];
            X[r * EC + i] = emu_r(R, EMU_CORE, a);
        }
    for (int r = 0; r < n; r++)
        for (int i = 0; i < r; i++) {
            double a = 0;
            for (int t = 0; t <= i; t++)
                a += X[r * EC + t] * c->TE[i * EC + t];
            const double dl = -a;
            dLk[r * EC + i] = emu_r(R, EMU_CORE, BETA(r) * dl);
            db[r] += dl * c->Lk[r * EC + i];
        }
    for (int r = 0; r < n; r++)
        dbeta[(t0 + r) * HV + hv] = emu_r(R, EMU_DBETA, db[r]);
    /* bwd_b: the pairwise terms through the sides */
    for (int r = 0; r < n; r++) {
        const int Rb = r / ESUB;
        const double *KCR = c->KC[Rb];
        for (int64_t j = 0; j < D; j++) {
            const double hr = c->G[r * D + j] - c->G[(Rb * ESUB + 8) * D + j];
            const double qv = c->Qt[r * D + j] * exp(-hr), kv = KCR[r * D + j] * exp(hr);
            dq[r * D + j] += dd[r] * kv;
            dk[r * D + j] += dd[r] * qv;
            double aq = 0, ak = 0;
            for (int i = 0; i < r; i++) {
                aq += dAs[r * EC + i] * KCR[i * D + j];
                ak += dLk[r * EC + i] * KCR[i * D + j];
            }
            dq[r * D + j] += exp(hr) * aq;
            dG[r * D + j] += c->Qt[r * D + j] * aq;
            dk[r * D + j] += exp(hr) * ak;
            dG[r * D + j] += c->Kt[r * D + j] * ak;
            for (int I = Rb; I < ENB; I++) {
                double a = 0;
                for (int t = I * ESUB; t < (I + 1) * ESUB && t < n; t++)
                    a += dAs[t * EC + r] * c->Qt[t * D + j] + dLk[t * EC + r] * c->Kt[t * D + j];
                dk[r * D + j] += exp(c->G[(I * ESUB + 8) * D + j] - c->G[r * D + j]) * a;
                dG[r * D + j] -= c->KC[I][r * D + j] * a;
            }
        }
    }
    for (int r = 0; r < n; r++)
        for (int64_t j = 0; j < D; j++) {
            dqv[((t0 + r) * HV + hv) * D + j] += dq[r * D + j];
            dkv[((t0 + r) * HV + hv) * D + j] += dk[r * D + j];
        }
    for (int64_t j = 0; j < D; j++) {
        double run = dGl[j];
        for (int r = n - 1; r >= 0; r--) {
            run += dG[r * D + j];
            dg[((t0 + r) * HV + hv) * D + j] = emu_r(R, EMU_DG, run);
        }
    }
#undef DOV
#undef GAM
#undef BETA
    double *fr[] = {dq, dk, dG, dW, Kg, acc, dAs, dLk, dT, X, dd, db, dGl};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        free(fr[i]);
}

/* One sequence of the recurrence: tokens [t0, t0 + len), the state from s_in (or zeros), the
 * final state to s_out (or dropped); its gradients likewise. Pointers: [HV, D, D] or NULL. */
typedef struct emu_seq {
    int64_t t0, len;
    const double *s_in, *ds_out;
    double *s_out, *ds_in;
    double *m, *b;             /* the summary of the span (M = 0 unless m_from_identity) */
    int m_from_identity;
} emu_seq;

static inline int64_t emu_chunks_of(const emu_seq *q) { return (q->len + EC - 1) / EC; }

static inline emu_chunk *emu_seq_prep(const emu_core *e, int hv, const emu_seq *q)
{
    const int64_t nch = emu_chunks_of(q);
    emu_chunk *ch = calloc((size_t)(nch > 0 ? nch : 1), sizeof *ch);
    for (int64_t i = 0; i < nch; i++) {
        emu_chunk_alloc(&ch[i], e->D);
        emu_prep(e, hv, q->t0 + i * EC, (int)(q->len - i * EC < EC ? q->len - i * EC : EC), &ch[i]);
    }
    return ch;
}

static inline void emu_seq_free(emu_chunk *ch, int64_t nch)
{
    for (int64_t i = 0; i < nch; i++)
        free(ch[i].slab);
    free(ch);
}

/* Forward (o), and with dO the backward (dq, dk [N, H, D], dv, dg, dbeta), of the sequences. */
static inline void emu_core_run(const emu_core *e, const emu_seq *seqs, int64_t n_seq, double *o,
                                const double *dO, double *dq, double *dk, double *dv, double *dg,
                                double *dbeta)
{
    const int64_t D = e->D, HV = e->HV, DD = D * D, rep = HV / e->H;
    double *dqv = dO ? kt_alloc(e->N * HV * D) : NULL, *dkv = dO ? kt_alloc(e->N * HV * D) : NULL;
    double *S = kt_alloc(DD);
    double *o_tmp = kt_alloc(e->N * HV * D);
    for (int64_t si = 0; si < n_seq; si++) {
        const emu_seq *q = &seqs[si];
        const int64_t nch = emu_chunks_of(q);
        for (int hv = 0; hv < HV; hv++) {
            emu_chunk *ch = emu_seq_prep(e, hv, q);
            for (int64_t i = 0; i < DD; i++)
                S[i] = q->s_in ? q->s_in[hv * DD + i] : 0;
            for (int64_t i = 0; i < nch; i++)
                emu_state_fwd(e, hv, &ch[i], S, o ? o : o_tmp);
            if (q->s_out)
                memcpy(q->s_out + hv * DD, S, (size_t)DD * sizeof *S);
            if (dO) {
                for (int64_t i = 0; i < DD; i++)
                    S[i] = q->ds_out ? q->ds_out[hv * DD + i] : 0;
                for (int64_t i = nch - 1; i >= 0; i--)
                    emu_state_bwd(e, hv, &ch[i], dO, S);
                if (q->ds_in)
                    memcpy(q->ds_in + hv * DD, S, (size_t)DD * sizeof *S);
                for (int64_t i = 0; i < nch; i++)
                    emu_chunk_bwd(e, hv, &ch[i], dO, dqv, dkv, dv, dg, dbeta);
            }
            emu_seq_free(ch, nch);
        }
    }
    if (dO) /* the value heads of a qk head summed in fp32, then stored (gva_sum_kernel) */
        for (int64_t t = 0; t < e->N; t++)
            for (int64_t h = 0; h < e->H; h++)
                for (int64_t j = 0; j < D; j++) {
                    double a = 0, b = 0;
                    for (int64_t r = 0; r < rep; r++) {
                        a += dqv[((t * HV) + h * rep + r) * D + j];
                        b += dkv[((t * HV) + h * rep + r) * D + j];
                    }
                    dq[(t * e->H + h) * D + j] = emu_r(e->rnd, EMU_DQKV, a);
                    dk[(t * e->H + h) * D + j] = emu_r(e->rnd, EMU_DQKV, b);
                }
    free(dqv), free(dkv), free(S), free(o_tmp);
}

/* The affine summary of each sequence (state_fwd_simt<SUMMARY>): fp32 from the prep's outputs. */
static inline void emu_core_summary(const emu_core *e, const emu_seq *seqs, int64_t n_seq)
{
    const int64_t D = e->D, HV = e->HV, DD = D * D;
    double *M = kt_alloc(DD), *Bm = kt_alloc(DD), *dM = kt_alloc(EC * D), *dB = kt_alloc(EC * D);
    for (int64_t si = 0; si < n_seq; si++) {
        const emu_seq *q = &seqs[si];
        if (!q->m)
            continue;
        const int64_t nch = emu_chunks_of(q);
        for (int hv = 0; hv < HV; hv++) {
            emu_chunk *ch = emu_seq_prep(e, hv, q);
            for (int64_t i = 0; i < DD; i++)
                M[i] = q->m_from_identity && i / D == i % D ? 1 : 0, Bm[i] = 0;
            for (int64_t c = 0; c < nch; c++) {
                const emu_chunk *k = &ch[c];
                for (int r = 0; r < EC; r++)
                    for (int64_t col = 0; col < D; col++) {
                        double a = 0, b = r < k->n ? k->U[r * D + col] : 0;
                        for (int64_t j = 0; j < D && r < k->n; j++) {
                            a -= k->W[r * D + j] * M[j * D + col];
                            b -= k->W[r * D + j] * Bm[j * D + col];
                        }
                        dM[r * D + col] = a, dB[r * D + col] = b;
                    }
                for (int64_t j = 0; j < D; j++)
                    for (int64_t col = 0; col < D; col++) {
                        double a = k->gam[j] * M[j * D + col], b = k->gam[j] * Bm[j * D + col];
                        for (int r = 0; r < k->n; r++) {
                            a += k->Kb[r * D + j] * dM[r * D + col];
                            b += k->Kb[r * D + j] * dB[r * D + col];
                        }
                        M[j * D + col] = a, Bm[j * D + col] = b;
                    }
            }
            memcpy(q->m + hv * DD, M, (size_t)DD * sizeof *M);
            memcpy(q->b + hv * DD, Bm, (size_t)DD * sizeof *M);
            emu_seq_free(ch, nch);
        }
    }
    free(M), free(Bm), free(dM), free(dB);
}

/* ---- the layer (cuda.c) ---------------------------------------------------------------------- */

/* y = R(x W^T) over n rows */
static inline void emu_lin(unsigned rnd, unsigned bit, const double *x, const double *w, double *y,
                           int64_t n, int64_t in, int64_t out)
{
    k3rt_error err = {0};
    TU_OK(k3rt_linear_fwd(C, K3RT_F64, x, w, NULL, y, n, in, out, &err), err);
    emu_ra(rnd, bit, y, n * out);
}

/* dx (= | += then R) dy W, dw += dy^T x */
static inline void emu_lin_bwd(unsigned rnd, unsigned bit, const double *x, const double *w,
                               const double *dy, double *dx, double *dw, int64_t n, int64_t in,
                               int64_t out, int acc)
{
    k3rt_error err = {0};
    TU_OK(k3rt_linear_bwd(C, K3RT_F64, x, w, dy, dx, dw, NULL, n, in, out, acc, &err), err);
    if (dx)
        emu_ra(rnd, bit, dx, n * in);
}

static inline double emu_sigm(double x) { return 1 / (1 + exp(-x)); }

/* The recurrence's sequences of a call, as cuda.c / cpu_layer.inc.c cut them: the B rows, or
 * each document with its row's state when it starts / ends the row. */
static inline int64_t emu_seqs_of(const lcase *c, const linputs *in, double *s_out, double *ds_in,
                                  double *sm, double *sb, emu_seq *q)
{
    const int64_t ns = c->HV * c->D * c->D;
    const int64_t n = c->n_docs ? c->n_docs : c->B;
    for (int64_t i = 0; i < n; i++) {
        int64_t t0 = c->n_docs ? in->docs[i] : i * c->T;
        int64_t len = c->n_docs ? in->docs[i + 1] - t0 : c->T, row = t0 / c->T;
        int first = t0 % c->T == 0, last = (t0 + len) % c->T == 0;
        emu_seq *s = &q[i];
        memset(s, 0, sizeof *s);
        s->t0 = t0, s->len = len;
        if (first && in->s_in)
            s->s_in = in->s_in + row * ns, s->ds_in = ds_in ? ds_in + row * ns : NULL;
        if (last) {
            s->s_out = s_out + row * ns;
            s->ds_out = in->ds_out ? in->ds_out + row * ns : NULL;
            if (sm)
                s->m = sm + row * ns, s->b = sb + row * ns, s->m_from_identity = first;
        }
    }
    return n;
}

/* Forward, backward and (c->summary) cp_summary of case c on inputs in, as the CUDA path
 * computes them in bf16 with the rounding points rnd; outputs as run_case gives them (the
 * gradients are the increments). */
static inline void emu_layer(const lcase *c, const linputs *in, unsigned rnd, lout *o)
{
    k3rt_error err = {0};
    rig r;
    make_rig(&r, c, K3RT_DEVICE_CPU, K3RT_F64);
    const kda *m = r.self;
    const double *P[KDA_N_SLOTS];
    double *Gr[KDA_N_SLOTS];
    memset(o, 0, sizeof *o);
    o->dg = calloc((size_t)in->np, sizeof *o->dg);
    for (int i = 0; i < in->np; i++)
        o->dg[i] = kt_alloc(in->pn[i]);
    for (int sl = 0; sl < KDA_N_SLOTS; sl++) {
        P[sl] = m->slot[sl] >= 0 ? in->p[m->slot[sl]] : NULL;
        Gr[sl] = m->slot[sl] >= 0 ? o->dg[m->slot[sl]] : NULL;
    }
    const int64_t B = c->B, T = c->T, N = B * T, d = c->d, H = c->H, HV = c->HV, D = c->D;
    const int64_t Dk = H * D, Dv = HV * D, Dg = HV * D, W = c->W, nh = B * (W - 1);
    const int64_t rf = m->rf, rg = m->rg, Dm = Dk > Dv ? Dk : Dv;
    const double *x = in->x, *xh = c->prefix && W > 1 ? in->xp : NULL;
    kda_io io;
    memset(&io, 0, sizeof io);
    io.B = B, io.T = T, io.docs = in->docs, io.n_docs = c->n_docs;
    /* ---- forward ---- */
    double *pr[3], *hl[3] = {NULL, NULL, NULL}, *cv[3], *ex[3], *nr[3], *rr[2];
    const int64_t wid[3] = {Dk, Dk, Dv};
    const int ws[3] = {KDA_Q, KDA_K, KDA_V}, cs[3] = {KDA_QCONV, KDA_KCONV, KDA_VCONV};
    for (int a = 0; a < 3; a++) {
        pr[a] = kt_alloc(N * wid[a]), cv[a] = kt_alloc(N * wid[a]);
        ex[a] = kt_alloc(N * wid[a]), nr[a] = kt_alloc(N * wid[a]);
        emu_lin(rnd, EMU_PROJ, x, P[ws[a]], pr[a], N, d, wid[a]);
        if (xh) {
            hl[a] = kt_alloc(nh * wid[a]);
            emu_lin(rnd, EMU_PROJ, xh, P[ws[a]], hl[a], nh, d, wid[a]);
        }
        conv_fwd_f64(C, &io, wid[a], W, pr[a], hl[a], P[cs[a]], cv[a]);
        if (a < 2) { /* SiLU then the L2 norm (ex: as the backward recomputes it, unrounded) */
            rr[a] = kt_alloc(N * H);
            l2_job_f64 j = {H, D, cv[a], NULL, NULL, ex[a], rr[a], NULL};
            TU_OK(l2_fwd_f64(C, &j, N, &err), err);
        } else {
            TU_OK(k3rt_act_fwd(C, K3RT_F64, K3RT_ACT_SILU, cv[a], ex[a], N * Dv, &err), err);
        }
        memcpy(nr[a], ex[a], (size_t)(N * wid[a]) * sizeof(double));
        emu_ra(rnd, EMU_QKV, nr[a], N * wid[a]);
    }
    double *fa = rf ? kt_alloc(N * rf) : NULL, *zf = kt_alloc(N * Dg), *z = kt_alloc(N * Dg);
    double *g = kt_alloc(N * Dg), *bl = kt_alloc(N * HV), *beta = kt_alloc(N * HV);
    if (rf) {
        emu_lin(rnd, EMU_PROJ, x, P[KDA_FA], fa, N, d, rf);
        emu_lin(rnd, EMU_PROJ, fa, P[KDA_FB], zf, N, rf, Dg);
    } else {
        emu_lin(rnd, EMU_PROJ, x, P[KDA_F], zf, N, d, Dg);
    }
    memcpy(z, zf, (size_t)(N * Dg) * sizeof *z);
    gate_job_f64 gj = {m, N, P[KDA_ALOG], P[KDA_DTB], NULL, z, g, NULL, NULL, NULL};
    par_f64(C, N, gate_fwd_rows_f64, &gj); /* z = zf + dt_bias */
    emu_ra(rnd, EMU_G, g, N * Dg);
    emu_lin(rnd, EMU_PROJ, x, P[KDA_B], bl, N, d, HV);
    for (int64_t i = 0; i < N * HV; i++)
        beta[i] = emu_r(rnd, EMU_BETA, emu_sigm(bl[i]));
    const int64_t ns = HV * D * D, nseq = c->n_docs ? c->n_docs : B;
    emu_seq *sq = calloc((size_t)nseq, sizeof *sq);
    o->s_out = kt_alloc(B * ns);
    o->ds_in = c->state ? kt_alloc(B * ns) : NULL;
    emu_seqs_of(c, in, o->s_out, o->ds_in, NULL, NULL, sq);
    double *beta_core = kt_alloc(N * HV);
    for (int64_t i = 0; i < N * HV; i++)
        beta_core[i] = rnd & EMU_BAD_BETA ? 1.01 * beta[i] : beta[i];
    emu_core ec = {rnd, H, HV, D, N, 1.0 / sqrt((double)D), nr[0], nr[1], nr[2], g, beta_core};
    double *co = kt_alloc(N * Dv), *on = kt_alloc(N * Dv), *rstd = kt_alloc(N * HV);
    double *ga = rg ? kt_alloc(N * rg) : NULL, *G = kt_alloc(N * Dv), *yg = kt_alloc(N * Dv);
    double *dO = kt_alloc(N * Dv), *dq = kt_alloc(N * Dk), *dk = kt_alloc(N * Dk);
    double *dv = kt_alloc(N * Dv), *dgt = kt_alloc(N * Dg), *dbeta = kt_alloc(N * HV);
    /* the forward's o; the backward runs the core once more from the same inputs (as the
     * CUDA backward reads the forward's saved parts: the same values) */
    emu_core_run(&ec, sq, nseq, co, NULL, NULL, NULL, NULL, NULL, NULL);
    TU_OK(k3rt_rmsnorm_fwd(C, K3RT_F64, co, P[KDA_NORM], on, rstd, N * HV, D, m->norm_eps, &err),
          err);
    emu_ra(rnd, EMU_ON, on, N * Dv);
    if (rg) {
        emu_lin(rnd, EMU_PROJ, x, P[KDA_GA], ga, N, d, rg);
        emu_lin(rnd, EMU_PROJ, ga, P[KDA_GB], G, N, rg, Dv);
    } else {
        emu_lin(rnd, EMU_PROJ, x, P[KDA_G], G, N, d, Dv);
    }
    for (int64_t i = 0; i < N * Dv; i++)
        yg[i] = emu_r(rnd, EMU_YG, on[i] * emu_sigm(G[i]));
    o->y = kt_alloc(N * d);
    emu_lin(rnd, EMU_OUT, yg, P[KDA_O], o->y, N, Dv, d);
    /* ---- backward ---- */
    const unsigned DA = EMU_DACT;
    double *dyg = kt_alloc(N * Dv), *don = kt_alloc(N * Dv), *dG = kt_alloc(N * Dv);
    double *dlow = kt_alloc(N * (rf > rg ? rf : rg) + 1), *dx = kt_alloc(N * d);
    emu_lin_bwd(rnd, DA, yg, P[KDA_O], in->dy, dyg, Gr[KDA_O], N, Dv, d, 0);
    for (int64_t i = 0; i < N * Dv; i++) {
        double sg = emu_sigm(G[i]);
        don[i] = emu_r(rnd, EMU_DON, dyg[i] * sg);
        dG[i] = emu_r(rnd, DA, dyg[i] * on[i] * sg * (1 - sg));
    }
    if (rg) {
        emu_lin_bwd(rnd, DA, ga, P[KDA_GB], dG, dlow, Gr[KDA_GB], N, rg, Dv, 0);
        emu_lin_bwd(rnd, DA, x, P[KDA_GA], dlow, dx, Gr[KDA_GA], N, d, rg, 0);
    } else {
        emu_lin_bwd(rnd, DA, x, P[KDA_G], dG, dx, Gr[KDA_G], N, d, Dv, 0);
    }
    TU_OK(k3rt_rmsnorm_bwd(C, K3RT_F64, co, P[KDA_NORM], rstd, don, dO, Gr[KDA_NORM], N * HV, D,
                           0, &err), err);
    emu_ra(rnd, DA, dO, N * Dv);
    emu_core_run(&ec, sq, nseq, NULL, dO, dq, dk, dv, dgt, dbeta);
    double *dzf = kt_alloc(N * Dg), *dac = kt_alloc(Dg);
    gate_job_f64 gb = {m, N, P[KDA_ALOG], NULL, dgt, z, NULL, dzf, Gr[KDA_DTB], dac};
    k3rt_parallel_for(C, Dg, 8, gate_bwd_channels_f64, &gb);
    for (int64_t ch = 0; ch < Dg; ch++)
        Gr[KDA_ALOG][ch / D] += dac[ch];
    emu_ra(rnd, DA, dzf, N * Dg);
    if (rf) {
        emu_lin_bwd(rnd, DA, fa, P[KDA_FB], dzf, dlow, Gr[KDA_FB], N, rf, Dg, 0);
        emu_lin_bwd(rnd, DA, x, P[KDA_FA], dlow, dx, Gr[KDA_FA], N, d, rf, 1);
    } else {
        emu_lin_bwd(rnd, DA, x, P[KDA_F], dzf, dx, Gr[KDA_F], N, d, Dg, 1);
    }
    double *dbl = kt_alloc(N * HV);
    for (int64_t i = 0; i < N * HV; i++) {
        double sg = emu_sigm(bl[i]);
        dbl[i] = emu_r(rnd, DA, dbeta[i] * sg * (1 - sg));
    }
    emu_lin_bwd(rnd, DA, x, P[KDA_B], dbl, dx, Gr[KDA_B], N, d, HV, 1);
    /* q, k, v: activation and conv backward, then the projections (halo rows included) */
    double *dz = kt_alloc(N * Dm), *dp = kt_alloc(N * Dm), *dh = kt_alloc(nh * Dm + 1);
    o->dxp = c->prefix ? kt_alloc(nh * d) : NULL;
    double *dact[3] = {dq, dk, dv};
    for (int a = 0; a < 3; a++) {
        memcpy(dz, dact[a], (size_t)(N * wid[a]) * sizeof *dz);
        if (a < 2) {
            l2_job_f64 j = {H, D, cv[a], ex[a], rr[a], NULL, NULL, dz};
            TU_OK(l2_bwd_f64(C, &j, N, &err), err);
        } else {
            TU_OK(k3rt_act_bwd(C, K3RT_F64, K3RT_ACT_SILU, cv[a], dact[a], dz, N * Dv, 0, &err),
                  err);
        }
        conv_bwd_f64(C, &io, wid[a], W, pr[a], hl[a], P[cs[a]], dz, dp, hl[a] ? dh : NULL,
                     Gr[cs[a]]);
        emu_ra(rnd, DA, dp, N * wid[a]);
        emu_lin_bwd(rnd, DA, x, P[ws[a]], dp, dx, Gr[ws[a]], N, d, wid[a], 1);
        if (hl[a]) {
            emu_ra(rnd, DA, dh, nh * wid[a]);
            emu_lin_bwd(rnd, DA, xh, P[ws[a]], dh, o->dxp, Gr[ws[a]], nh, d, wid[a], a > 0);
        }
    }
    if (c->prefix && !xh)
        memset(o->dxp, 0, (size_t)(nh * d) * sizeof(double));
    emu_ra(rnd, EMU_OUT, dx, N * d);
    if (o->dxp)
        emu_ra(rnd, EMU_OUT, o->dxp, nh * d);
    o->dx = dx;
    if (c->summary) {
        o->sm = kt_alloc(B * HV * D * D), o->sb = kt_alloc(B * ns);
        emu_seqs_of(c, in, o->s_out, NULL, o->sm, o->sb, sq);
        emu_core_summary(&ec, sq, nseq);
    }
    double *fr[] = {fa, zf, z, g, bl, beta, beta_core, co, on, rstd, ga, G, yg, dO, dq, dk,
                    dv, dgt, dbeta, dyg, don, dG, dlow, dzf, dac, dbl, dz, dp, dh, rr[0], rr[1]};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        free(fr[i]);
    for (int a = 0; a < 3; a++)
        free(pr[a]), free(hl[a]), free(cv[a]), free(ex[a]), free(nr[a]);
    free(sq);
    rig_destroy(&r);
}

#endif
