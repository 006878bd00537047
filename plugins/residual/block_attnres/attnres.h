/* block_attnres: Block Attention Residuals (Kimi Team 2026; K3). Each sublayer's input is a
 * softmax-weighted sum over depth: the completed block sums, the embedding as block 0, and the
 * block in progress (the partial sum), weighted by a learned pseudo-query against RMS-normed
 * keys. See cpu.inc.c for one mixing op and attnres.c for the K3 control flow.
 */
#ifndef BLOCK_ATTNRES_H
#define BLOCK_ATTNRES_H

#include <k3rt/k3rt.h>

typedef struct attnres {
    int dtype;           /* K3RT_F32 or K3RT_F64 on the CPU, K3RT_F32 or K3RT_BF16 on CUDA */
    int acc;             /* dtype of the gradient accumulators and the per-op caches (alpha, rho,
                            z): dtype on the CPU, f32 on CUDA (every reader adds into them) */
    int device;          /* K3RT_DEVICE_CPU or a CUDA ordinal */
    k3rt_stream *stream; /* the run's stream (for clearing the device statistics) */
    int64_t d;
    int32_t n_layers;
    int S;               /* sublayers: 2 * n_layers */
    int kb;              /* sublayers per block: 2 * block_layers, or 1 with full = true */
    int block_layers;
    int full;
    double eps;          /* key RMSNorm epsilon */
    int nb;              /* stored sources: the embedding and every block that closes */
    /* depth_weights statistics: [S + 1, nb + 1] sums of alpha over tokens, tokens per row,
     * and the f32 means handed to the stats sink. On CUDA the sums and means live on the
     * device (dev_sum, dev_mean), updated by every forward; the token counts stay here. */
    double *alpha_sum;
    int64_t *alpha_tokens;
    float *depth_weights;
    double *dev_sum;
    float *dev_mean;
    /* per-call source pointer lists, nb + 1 each (an instance serves one thread at a time) */
    const void **v;
    void **dv;
} attnres;

/* ---- the schedule (K3 control flow, generalised to kb sublayers per block) ------------------
 * Sublayer 0 (layer 0's attention) reads the embedding alone. Sublayer s >= 1 and the output
 * aggregation (s = S) read the n_closed(s) stored sources plus the current partial sum.
 * Sublayer s < S with s % kb == 0 opens a block: right after its mix the partial sum it read is
 * stored as a source, and its own output starts the next partial sum. */
int attnres_closed(const attnres *r, int s);   /* stored sources read by sublayer s */
int attnres_sources(const attnres *r, int s);  /* sources of its mixing op (1 for s = 0) */
int attnres_opens(const attnres *r, int s);    /* 1 when sublayer s starts a block */

/* ---- buffers -------------------------------------------------------------------------------
 * saved (one region each, 64-byte aligned; N = B*T tokens; "acc" rows are of r->acc):
 *   stored sources   nb x [N, d]   the embedding and the closed block sums
 *   partial          [N, d]        the running partial sum (the final one after finish)
 *   d stored         nb x [N, d]   acc: their gradients, accumulated from every later reader
 *   d partial        [N, d]        acc
 *   per mixing op s = 1..S: alpha [N, n_s], and rho, z [N] of its partial (acc; the key-norm
 *   scale and the logit, kept because a reconstructed partial is exact only up to rounding)
 *   CUDA: out32 [N, d] f32, the output aggregation's h (its backward's dh . h)
 * workspace: q = gamma * w [d], dq [d], scratch [N, nb + 1] twice (acc), one [N, d] row block
 * (the partial reconstructed from the sublayer's input) and one for the gradient of a fused
 * pre-norm's input; CUDA: h32 [N, d] f32 (op mode) and the backward's per-block sums. */
typedef struct attnres_layout {
    int64_t N;
    int64_t row;                           /* bytes of one [N, d] region, 64-byte aligned */
    int64_t acc_row;                       /* the same in the accumulators' dtype */
    int64_t src, partial, dsrc, dpartial;  /* byte offsets into saved */
    int64_t ops;                           /* where the per-op caches start */
    int64_t out32;                         /* CUDA */
    int64_t saved_bytes;
    int64_t ws_q, ws_dq, ws_a, ws_c, ws_row, ws_dh, ws_h32, ws_part, workspace_bytes;
} attnres_layout;

void attnres_layout_make(const attnres *r, int64_t N, attnres_layout *l);
/* Bytes of the cache of mixing op s (alpha [N, n_s], rho and z [N]); 0 for s = 0. */
int64_t attnres_op_bytes(const attnres *r, int64_t N, int s);
/* Offsets of op s's alpha, rho and z in saved. */
void attnres_op_offsets(const attnres *r, const attnres_layout *l, int s, int64_t *alpha,
                        int64_t *rho, int64_t *z);

/* ---- one mixing op over explicit sources, written once over the real type (cpu.inc.c) ----- */
typedef struct ar_op {
    k3rt_stream *stream;
    int64_t N, d;
    int n;                       /* sources; the partial sum, when there is one, is the last */
    const void *const *v;        /* [n] -> [N, d] */
    const void *w, *gamma;       /* [d] pseudo-query and key-norm gain */
    double eps;
    void *alpha;                 /* [N, n] softmax weights: forward writes, backward reads */
    void *rho_last, *z_last;     /* [N] or NULL: key-norm scale and logit of source n-1; the
                                    forward writes them, the backward uses them when given */
    void *q;                     /* workspace [d]: gamma * w */
} ar_op;

/* h [N, d] = sum_i alpha_i v_i, alpha = softmax_i(w . RMSNorm_gamma(v_i)). */
int attnres_fwd_f32(const ar_op *op, void *h, k3rt_error *err);
int attnres_fwd_f64(const ar_op *op, void *h, k3rt_error *err);
/* dv[i] += d/dv_i (dv[i] may be NULL: skipped), dw += , dgamma += ; c [N, n] and dq [d]
 * are workspace. */
int attnres_bwd_f32(const ar_op *op, const void *dh, void *const *dv, void *dw, void *dgamma,
                    void *c, void *dq, k3rt_error *err);
int attnres_bwd_f64(const ar_op *op, const void *dh, void *const *dv, void *dw, void *dgamma,
                    void *c, void *dq, k3rt_error *err);
/* The partial sum read by an op, from what the op produced: h = sum_{i<n-1} alpha_i v_i +
 * alpha_{n-1} p, so p = (h - sum_{i<n-1} alpha_i v_i) / alpha_{n-1} (0 where alpha_{n-1} is
 * below the dtype's epsilon: there every term that uses p carries a factor alpha_{n-1}). */
int attnres_partial_f32(const ar_op *op, const void *h, void *p, k3rt_error *err);
int attnres_partial_f64(const ar_op *op, const void *h, void *p, k3rt_error *err);

/* ---- the residual protocol (attnres.c) --------------------------------------------------- */
int attnres_begin(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_mix(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_push(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_finish(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_finish_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_push_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_mix_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_mix_norm(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_mix_norm_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);

/* Adds alpha [N, n] (NULL: the identity mix of sublayer 0) to row s of the depth-weight
 * statistics, on the instance's device. */
int attnres_note_alpha(attnres *r, k3rt_stream *st, int s, const void *alpha, int64_t N, int n,
                       k3rt_error *err);

#ifdef K3RT_PLUGIN_HAVE_CUDA
/* ---- the op on CUDA (cuda.c over cuda/attnres_cuda.h); op->q is not used ------------------ */
/* h = the mix; h32 (may be NULL) its f32 copy; with norm, normed and rstd of a's pre-norm. */
int attnres_cuda_fwd(const attnres *r, const ar_op *op, const k3rt_residual_args *norm,
                     void *h, void *h32, k3rt_error *err);
/* dh is the gradient of h, or with norm of a's normed; h (or h32) the forward's output;
 * recon: source n-1 is rebuilt from h; overwrite: dv are of r->dtype and overwritten, else
 * accumulators of r->acc. */
int attnres_cuda_bwd(const attnres *r, const ar_op *op, const k3rt_residual_args *norm,
                     const void *dh, const void *h, const void *h32, int recon, int overwrite,
                     void *const *dv, void *dw, void *dgamma, void *scratch, k3rt_error *err);
int attnres_cuda_stats(attnres *r, k3rt_stream *st, int s, const void *alpha, int64_t N, int n,
                       k3rt_error *err);
int attnres_cuda_create(attnres *r, k3rt_error *err);
void attnres_cuda_destroy(attnres *r);
int64_t attnres_cuda_scratch_bytes(int64_t N, int64_t d);
#endif

#endif
