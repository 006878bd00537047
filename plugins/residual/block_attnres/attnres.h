/* block_attnres: Block Attention Residuals (Kimi Team 2026; K3). Each sublayer's input is a
 * softmax-weighted sum over depth: the completed block sums, the embedding as block 0, and the
 * block in progress (the partial sum), weighted by a learned pseudo-query against RMS-normed
 * keys. See cpu.inc.c for one mixing op and attnres.c for the K3 control flow.
 */
#ifndef BLOCK_ATTNRES_H
#define BLOCK_ATTNRES_H

#include <k3rt/k3rt.h>

typedef struct attnres {
    int dtype;           /* K3RT_F32 or K3RT_F64 */
    int64_t d;
    int32_t n_layers;
    int S;               /* sublayers: 2 * n_layers */
    int kb;              /* sublayers per block: 2 * block_layers, or 1 with full = true */
    int block_layers;
    int full;
    double eps;          /* key RMSNorm epsilon */
    int nb;              /* stored sources: the embedding and every block that closes */
    /* depth_weights statistics: [S + 1, nb + 1] sums of alpha over tokens, tokens per row,
     * and the f32 means handed to the stats sink. */
    double *alpha_sum;
    int64_t *alpha_tokens;
    float *depth_weights;
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
 * saved (one region each, 64-byte aligned; E = element bytes, N = B*T tokens):
 *   stored sources   nb x [N, d]   the embedding and the closed block sums
 *   partial          [N, d]        the running partial sum (the final one after finish)
 *   d stored         nb x [N, d]   their gradients, accumulated from every later reader
 *   d partial        [N, d]
 *   per mixing op s = 1..S: alpha [N, n_s], and rho, z [N] of its partial (the key-norm scale
 *   and the logit, kept because a reconstructed partial is exact only up to rounding)
 * workspace: q = gamma * w [d], dq [d], scratch [N, nb + 1] twice, one [N, d] row block (the
 * partial reconstructed from the sublayer's input). */
typedef struct attnres_layout {
    int64_t N;
    int64_t row;                           /* bytes of one [N, d] region, 64-byte aligned */
    int64_t src, partial, dsrc, dpartial;  /* byte offsets into saved */
    int64_t ops;                           /* where the per-op caches start */
    int64_t saved_bytes;
    int64_t ws_q, ws_dq, ws_a, ws_c, ws_row, workspace_bytes;
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
int attnres_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int attnres_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);

/* Adds the mean of alpha [N, n] over tokens to row s of the depth-weight statistics. */
void attnres_note_alpha(attnres *r, int s, const void *alpha, int64_t N, int n);

#endif
