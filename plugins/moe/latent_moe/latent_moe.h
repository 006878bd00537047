/* Stable LatentMoE (K3): the instance, its parameter slots, the layout of the saved and
 * workspace buffers and the per-dtype token kernels, shared by plugin.c (descriptor side),
 * moe.c (forward/backward over core ops) and cpu_tokens.inc.c (the loops over tokens). */
#ifndef K3RT_PLUGIN_LATENT_MOE_H
#define K3RT_PLUGIN_LATENT_MOE_H

#include <k3rt/k3rt.h>

/* Parameter slots in declaration order; a slot absent from a configuration has index -1. */
enum {
    LMOE_ROUTER,    /* router.weight                 [E, d]        role router */
    LMOE_DOWN,      /* routed_down_proj.weight       [l, d]        d -> latent, once per token */
    LMOE_EX_GATE,   /* experts.gate_proj.weight      [E, m, l]     (K3 w1) */
    LMOE_EX_UP,     /* experts.up_proj.weight        [E, m, l]     (K3 w3) */
    LMOE_EX_DOWN,   /* experts.down_proj.weight      [E, l, m]     (K3 w2) */
    LMOE_NORM,      /* routed_norm.weight            [l]           (latent_norm) */
    LMOE_UP,        /* routed_up_proj.weight         [d, l]        latent -> d */
    LMOE_SH_GATE,   /* shared_experts.gate_proj.weight [Hs, d]     Hs = shared * shared_hidden */
    LMOE_SH_UP,     /* shared_experts.up_proj.weight   [Hs, d] */
    LMOE_SH_DOWN,   /* shared_experts.down_proj.weight [d, Hs] */
    LMOE_N_SLOTS
};

typedef struct latent_moe {
    int dtype;            /* K3RT_F32 or K3RT_F64 on the CPU; K3RT_F32 or K3RT_BF16 on CUDA */
    int device;           /* K3RT_DEVICE_CPU or a CUDA device */
    int64_t d;            /* d_model */
    int64_t E, k;         /* routed experts, experts per token */
    int64_t l;            /* latent width */
    int64_t m;            /* routed expert hidden width */
    int64_t Hs;           /* fused width of the shared experts (0: none) */
    int glu;              /* k3rt_glu */
    double beta1, beta2;
    int latent_norm;      /* RMSNorm over the combined latent output (K3); 0 = NVIDIA's LatentMoE */
    double norm_eps;
    int renormalize;      /* gates = scores renormalised over the chosen k */
    double rscale;        /* routed_scaling_factor */
    double init_std, out_std;
    double latent_std;    /* init of the routed path before the norm; 0 = 1/sqrt(fan_in) */
    int slot[LMOE_N_SLOTS]; /* parameter index of each slot, or -1 */
    int n_params;
    /* CUDA with shared experts and overlap_shared: the stream the shared experts run on beside
     * the routed ones, and the events that order it with the call's stream (cuda.c) */
    k3rt_stream *side;
    struct k3rt_event *fork, *join;
    int64_t *host_offsets; /* [E + 1] CUDA: the expert offsets, when a call reads them (cuda.c) */
} latent_moe;

/* The saved parts, in declaration order: routing (scores, selection, gate weights, counts),
 * latent_in (c), expert_gu (g, u), expert_act (glu(g, u)), expert_out (ye), latent_out (U and
 * its norm), shared_gu (sg, su), shared_act (sa). */
enum {
    LMOE_SAVED_ROUTING, LMOE_SAVED_LATENT_IN, LMOE_SAVED_EXPERT_GU, LMOE_SAVED_EXPERT_ACT,
    LMOE_SAVED_EXPERT_OUT, LMOE_SAVED_LATENT_OUT, LMOE_SAVED_SHARED_GU, LMOE_SAVED_SHARED_ACT,
    LMOE_SAVED_N
};

/* Byte offsets into the saved buffer (forward -> backward) and the workspace. N = B*T tokens,
 * R = N*k routed rows in expert-grouped order. `real` is the compute dtype. */
typedef struct lmoe_layout {
    /* saved */
    int64_t s;          /* real [N, E]   router scores sigmoid(x Wr^T), before the bias */
    int64_t s32;        /* f32  [N, E]   the scores as reported to the balancer (f64 runs) */
    int64_t sel;        /* i32  [N, k]   chosen experts, by descending biased score */
    int64_t pos;        /* i32  [N, k]   row of (token, slot) in the grouped order */
    int64_t p;          /* real [N, k]   gate weights */
    int64_t counts;     /* i64  [E]      rows per expert (host) */
    int64_t offsets;    /* i64  [E + 1]  first row of each expert (host) */
    int64_t bias;       /* f32  [E]      the selection bias used */
    int64_t c;          /* real [N, l]   latent input c = x Wdown^T */
    int64_t g, u, a;    /* real [R, m]   expert gate/up pre-activations and glu(g, u) */
    int64_t ye;         /* real [R, l]   expert outputs */
    int64_t U;          /* real [N, l]   combined latent output */
    int64_t rstd;       /* real [N]      latent norm 1/rms                (latent_norm) */
    int64_t nrm;        /* real [N, l]   RMSNorm(U)                       (latent_norm) */
    int64_t sg, su, sa; /* real [N, Hs]  shared experts' gate/up and glu   (shared) */
    int64_t saved;
    /* the saved run as parts (plugin.c lmoe_saved): where each ends, cumulative bytes */
    int64_t part_end[LMOE_SAVED_N];
    /* forward scratch */
    int64_t f_xe;       /* real [R, l]   c gathered into grouped order */
    int64_t fwd;
    /* backward scratch */
    int64_t b_dn;       /* real [N, l]   d RMSNorm(U) */
    int64_t b_dU;       /* real [N, l] */
    int64_t b_dp;       /* real [N, k] */
    int64_t b_dye;      /* real [R, l]   d ye, then d xe */
    int64_t b_da, b_dg, b_du; /* real [R, m] */
    int64_t b_xe;       /* real [R, l]   c gathered again */
    int64_t b_dc;       /* real [N, l] */
    int64_t b_dz;       /* real [N, E]   d router logits */
    int64_t b_dsa, b_dsg, b_dsu; /* real [N, Hs] */
    int64_t bwd;
    int64_t workspace;  /* max(bwd, fwd) */
} lmoe_layout;

void lmoe_layout_make(const latent_moe *f, int64_t tokens, lmoe_layout *l);

/* Loops over tokens, one instance per dtype (cpu.c); pointers are of the
 * compute dtype unless typed. Every reduction runs in a fixed order per token, so results do
 * not depend on the thread count. */
typedef struct lmoe_kernels {
    /* sel = top-k of s + bias (ties -> lower expert id; bias may be NULL = 0), in descending
     * order; p = rscale * s_sel / (sum s_sel + 1e-20) (renormalize) or rscale * s_sel. */
    void (*route)(k3rt_stream *st, const void *s, const float *bias, int64_t N, int64_t E,
                  int64_t k, int renormalize, double rscale, int32_t *sel, void *p);
    /* xe[pos[t, j]] = c[t] */
    void (*gather)(k3rt_stream *st, const void *c, const int32_t *pos, int64_t N, int64_t k,
                   int64_t l, void *xe);
    /* U[t] = sum_j p[t, j] ye[pos[t, j]], in slot order */
    void (*combine)(k3rt_stream *st, const void *ye, const int32_t *pos, const void *p,
                    int64_t N, int64_t k, int64_t l, void *U);
    /* dp[t, j] = dU[t] . ye[pos[t, j]] ;  dye[pos[t, j]] = p[t, j] dU[t] */
    void (*combine_bwd)(k3rt_stream *st, const void *dU, const void *ye, const int32_t *pos,
                        const void *p, int64_t N, int64_t k, int64_t l, void *dp, void *dye);
    /* dc[t] = sum_j dxe[pos[t, j]], in slot order */
    void (*scatter)(k3rt_stream *st, const void *dxe, const int32_t *pos, int64_t N, int64_t k,
                    int64_t l, void *dc);
    /* dz = s (1 - s) (ds + d_scores): ds from dp through the gates (zero off the chosen k);
     * d_scores [N, E] f32 may be NULL. */
    void (*router_bwd)(k3rt_stream *st, const void *s, const int32_t *sel, const void *dp,
                       const float *d_scores, int64_t N, int64_t E, int64_t k, int renormalize,
                       double rscale, void *dz);
} lmoe_kernels;

extern const lmoe_kernels lmoe_kernels_f32, lmoe_kernels_f64;

int lmoe_cpu_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err);
int lmoe_cpu_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err);

/* What follows the combine, written once over core ops for every device and dtype (moe.c):
 * the latent norm, W-up and the shared experts, and their backward (which initialises a->dx;
 * dU may alias dn without the latent norm). The pieces they are made of come after them: the
 * CUDA path runs the shared ones on a second stream. */
int lmoe_out_forward(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, const void *U,
                   void *nrm, void *rstd, void *sg, void *su, void *sa, k3rt_error *err);
int lmoe_out_backward(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a, const void *U,
                    const void *nrm, const void *rstd, const void *sg, const void *su,
                    const void *sa, void *dsa, void *dsg, void *dsu, void *dn, void *dU,
                    k3rt_error *err);
int lmoe_routed_out(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, const void *U,
                    void *nrm, void *rstd, k3rt_error *err);
int lmoe_shared_in(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, void *sg,
                   void *su, void *sa, k3rt_error *err);
int lmoe_shared_out(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a,
                    const void *sa, k3rt_error *err);
int lmoe_shared_bwd_w(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                      const void *sg, const void *su, const void *sa, void *dsa, void *dsg,
                      void *dsu, k3rt_error *err);
int lmoe_shared_bwd_dx(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                       const void *dsg, const void *dsu, int accumulate, k3rt_error *err);
int lmoe_routed_out_bwd(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                        const void *U, const void *nrm, const void *rstd, void *dn, void *dU,
                        k3rt_error *err);

/* The layer on CUDA (cuda.c, built with K3RT_PLUGIN_HAVE_CUDA): its own layout of the saved and
 * workspace buffers, f32 or bf16. lmoe_gpu_check refuses what the CUDA kernels cannot take. */
int lmoe_gpu_check(const latent_moe *f, k3rt_error *err);
/* The side stream and its events (overlap_shared with shared experts); lmoe_gpu_destroy frees
 * what lmoe_gpu_create made, also after a failure part-way. */
int lmoe_gpu_create(latent_moe *f, int overlap_shared, k3rt_error *err);
void lmoe_gpu_destroy(latent_moe *f);
void lmoe_gpu_memory(const latent_moe *f, int64_t tokens, k3rt_memory *out);
int lmoe_gpu_forward(latent_moe *f, const k3rt_fwd_args *a, k3rt_error *err);
int lmoe_gpu_backward(latent_moe *f, const k3rt_bwd_args *a, k3rt_error *err);

#endif
