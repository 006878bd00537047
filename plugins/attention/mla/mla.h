/* NoPE MLA (Kimi-Linear / K3 gated MLA): the instance, its parameter slots and the layout of the
 * saved and workspace buffers, shared by plugin.c, the CPU kernels (cpu.inc.c) and the CUDA path
 * (cuda.c with the kernels behind mla_cuda.h). */
#ifndef K3RT_PLUGIN_MLA_H
#define K3RT_PLUGIN_MLA_H

#include <k3rt/k3rt.h>

/* Query rows per block of the causal attention: a block of rows only multiplies the keys up to
 * its last row, so the T x T products cost ~T^2/2 (+ T*MLA_BLOCK/2), and the score scratch is
 * MLA_BLOCK x T per thread instead of T x T. */
#define MLA_BLOCK 64

/* Parameter slots, in declaration order; a slot absent from a configuration has index -1. */
enum {
    MLA_Q_A,          /* q_a_proj.weight           [q_rank, d]           (q_rank > 0) */
    MLA_Q_A_NORM,     /* q_a_layernorm.weight      [q_rank]              (q_rank > 0) */
    MLA_Q_NOPE,       /* q_nope_proj.weight        [H*dn, q_in] */
    MLA_Q_SHARED,     /* q_shared_proj.weight      [H*dr, q_in]          (dr > 0) */
    MLA_KV_A,         /* kv_a_proj_with_mqa.weight [dc+dr, d]: latent c, then shared key */
    MLA_KV_A_NORM,    /* kv_a_layernorm.weight     [dc] */
    MLA_K_B,          /* k_b_proj.weight           [H*dn, dc] */
    MLA_V_B,          /* v_b_proj.weight           [H*dv, dc] */
    MLA_GATE,         /* o_gate_proj.weight        [H*dv, d]             (output_gate) */
    MLA_O,            /* o_proj.weight             [d, H*dv] */
    MLA_N_SLOTS
};

typedef struct mla {
    int64_t d;      /* d_model */
    int64_t H;      /* heads */
    int64_t rq;     /* q_rank; 0 = queries straight from x */
    int64_t dc;     /* kv_rank: latent width */
    int64_t dn;     /* qk_nope_dim: per-head key/query part from the latent */
    int64_t dr;     /* qk_shared_dim: the unrotated key part shared by all heads */
    int64_t dv;     /* v_dim */
    int64_t dqk;    /* dn + dr */
    int gate;       /* sigmoid output gate (K3 gated MLA) */
    double eps;     /* latent RMSNorm epsilon */
    double init_std;
    double scale;   /* softmax scale, 1/sqrt(dn + dr) unless configured */
    int dtype;      /* CPU: K3RT_F32 or K3RT_F64; CUDA: K3RT_F32 or K3RT_BF16 */
    int kernel;     /* CUDA attention core: MLA_KERNEL_AUTO, _K3RT or _CUDNN (mla_cuda.h) */
    int report_max; /* report_max_logit: compute and report the per-head max logits */
    int device;     /* K3RT_DEVICE_CPU or the CUDA ordinal the instance computes on */
    int slots;      /* CPU attention scratch slots = threads of the create stream; 0 on CUDA */
    int slot[MLA_N_SLOTS];  /* parameter index of each slot, or -1 */
    int n_params;
    k3rt_stream *stream;    /* the create stream */
    float *max_logit;       /* CPU: [H] since reset_stats; -inf before anything was forwarded */
    /* CUDA: the per-head maxima live on the device ([H] f32), where stats() reports them.
     * dev_fresh: no forward since reset_stats. */
    float *dev_max;
    int dev_fresh;
} mla;

/* The CPU's saved parts, in declaration order (plugin.c mla_saved): the query latent and its
 * norm, the KV latent and its rstd, the normed KV latent (read only by the up-projections'
 * products), q k v, the attention output, the log-sum-exp, the gate pre-activation. CUDA keeps
 * the run as one part. */
enum {
    MLA_SAVED_Q_LATENT, MLA_SAVED_KV_LATENT, MLA_SAVED_KV_NORMED, MLA_SAVED_QKV, MLA_SAVED_OUT,
    MLA_SAVED_LSE, MLA_SAVED_GATE, MLA_SAVED_N
};

/* Offsets, in elements of the compute dtype, into the saved buffer (kept from forward to
 * backward) and the workspace (scratch of one call). N = B*T tokens. Per-row statistics (the
 * rstd of the norms, lse, the max logits, the backward's row dots) are REAL on the CPU and f32
 * on CUDA, where a bf16 run gives each of them two bf16 elements' room. */
typedef struct mla_layout {
    /* saved */
    int64_t qa, q_rstd, qan;   /* [N, rq], [N], [N, rq]      (rq > 0) */
    int64_t c, kv_rstd, chat;  /* [N, dc], [N], [N, dc]      latent before/after its norm */
    int64_t q, k;              /* [B, T, H, dqk]             assembled [nope ; shared] */
    int64_t v, o;              /* [B, T, H, dv] */
    int64_t lse;               /* [B, H, T]                  softmax log-sum-exp per row */
    int64_t z;                 /* [B, T, H, dv]              gate pre-activation (gate) */
    int64_t saved;             /* total */
    int64_t part_end[MLA_SAVED_N]; /* the run as the CPU's saved parts (cumulative ends) */
    /* forward workspace */
    int64_t f_qn, f_qr, f_kn;  /* [N, H*dn], [N, H*dr], [N, H*dn] projections before assembly */
    int64_t f_kr;              /* [N, dr]                    the shared key */
    int64_t f_og;              /* [N, H*dv]                  gated attention output */
    int64_t f_max;             /* CPU: [B*H] max logit of each (b, h); CUDA: [B*H, ceil(T/32)]
                                  max of each row block (mla_cuda.h) */
    int64_t f_scratch;         /* [slots, MLA_BLOCK, T]      scores of one row block */
    int64_t fwd;               /* total */
    /* backward workspace */
    int64_t b_g1, b_g2;        /* [N, H*dv] x2: gated output, then dz; d(gated), then dO */
    int64_t b_dq, b_dk, b_dv;  /* [B, T, H, dqk] x2, [B, T, H, dv] */
    int64_t b_dqn, b_dqr;      /* [N, H*dn], [N, H*dr] */
    int64_t b_dkn, b_dkr;      /* [N, H*dn], [N, dr] */
    int64_t b_dqin, b_dqa;     /* [N, rq] x2                 (rq > 0) */
    int64_t b_dchat, b_dc;     /* [N, dc] x2 */
    int64_t b_dqacc;           /* CUDA bf16: [B, T, H, dqk] f32 dQ accumulator of the attention
                                  core (mla_cuda.h), over b_dqn .. b_dc */
    int64_t b_scratch;         /* [slots, 2, MLA_BLOCK, T]   P and dP of one row block */
    int64_t b_drow;            /* CUDA: [B, H, T]            dO . O per row */
    int64_t bwd;               /* total */
    int64_t workspace;         /* max(fwd, bwd) */
} mla_layout;

void mla_layout_make(const mla *m, int64_t B, int64_t T, int slots, mla_layout *l);

int mla_forward_f32(mla *m, const k3rt_fwd_args *a, k3rt_error *err);
int mla_forward_f64(mla *m, const k3rt_fwd_args *a, k3rt_error *err);
int mla_backward_f32(mla *m, const k3rt_bwd_args *a, k3rt_error *err);
int mla_backward_f64(mla *m, const k3rt_bwd_args *a, k3rt_error *err);

/* ---- incremental decoding (decode.c) ---------------------------------------------------- */

/* The latent KV cache of B sequences decoded side by side, in the decode-absorbed form (spec
 * §7.1, exact under NoPE): per position the normed latent ĉ (dc) and the shared key kr (dr),
 * the MQA key of every head; one query attends to it as
 *   score_h(τ) = scale ((W_kb,h^T q_h^n) · ĉ_τ + q_h^r · kr_τ),  o_h = W_vb,h Σ_τ P_h(τ) ĉ_τ. */
typedef struct mla_cache {
    int64_t B, cap;   /* sequences; positions allocated per sequence (grows by doubling) */
    void *kv;         /* [B, cap, dc + dr] compute dtype */
    void *scores;     /* [B, H, cap] f32 (REAL on the CPU): one step's scores */
    void *ws;         /* one step's buffers (decode.c) */
} mla_cache;

/* The decode step's own pieces, per device and dtype (device pointers, compute dtype):
 *   attend  ctx [B, H, dc] = Σ_τ P(τ) ĉ_τ over the L cached positions, P = softmax of the
 *           scores above from q_abs [B, H, dc] = W_kb,h^T q_h^n and q_r [B, H, dr] (NULL when
 *           dr = 0); scores: the cache's scratch.
 *   gate    og = o sigmoid(z) over n elements. */
typedef struct mla_dec_kernels {
    int (*attend)(const mla *m, k3rt_stream *s, int64_t B, int64_t L, const mla_cache *c,
                  const void *q_abs, const void *q_r, void *ctx, k3rt_error *err);
    int (*gate)(const mla *m, k3rt_stream *s, int64_t n, const void *o, const void *z, void *og,
                k3rt_error *err);
} mla_dec_kernels;

extern const mla_dec_kernels mla_dec_cpu_f32, mla_dec_cpu_f64;

int mla_cache_create(void *self, const k3rt_cache_args *a, void **cache, k3rt_error *err);
int mla_decode_step(void *self, void *cache, const k3rt_decode_args *a, k3rt_error *err);
void mla_cache_destroy(void *self, void *cache);

/* The CUDA path (cuda.c; built only with K3RT_PLUGIN_HAVE_CUDA), f32 or bf16 on device
 * tensors. Under bf16 the parameter gradients are f32 (k3rt/ops.h). */
int mla_forward_cuda(mla *m, const k3rt_fwd_args *a, k3rt_error *err);
int mla_backward_cuda(mla *m, const k3rt_bwd_args *a, k3rt_error *err);
/* The decode step's pieces on CUDA (cuda_decode.c). */
extern const mla_dec_kernels mla_dec_cuda;

#endif
