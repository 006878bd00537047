/* Sliding-window attention: causal softmax attention in which token t attends to tokens
 * t - window + 1 .. t only (Mistral / Gemma local layers). A third-party k3rt plugin built out
 * of tree against the installed SDK.
 *
 *   q = x Wq^T, k = x Wk^T, v = x Wv^T            [N, H*D]   (N = B*T tokens, H heads of D)
 *   for each sequence, head h and token t, with u in W(t) = [max(0, t - window + 1), t]:
 *     p_tu = softmax_u(scale * q_th . k_uh),  o_th = sum_u p_tu v_uh,   scale = 1/sqrt(D)
 *   y = o Wo^T                                     [N, d]
 *
 * Memory per call: five saved parts, declared by class so the host's activation manager may
 * move each (saved()): q, k, v and o [N, H*D] and the probabilities p [B, H, T, min(window, T)];
 * the workspace holds do, dq, dk, dv and a p-shaped scratch, carved by swa_layout. */
#ifndef SWA_H
#define SWA_H

#include <k3rt/k3rt.h>

typedef struct swa {
    int64_t d, H, D, window;
    double scale, init_std;
    int dtype;
} swa;

/* The saved parts, in the order the calls receive them (args->saved[i]). */
enum { SWA_SAVED_Q, SWA_SAVED_K, SWA_SAVED_V, SWA_SAVED_O, SWA_SAVED_P, SWA_N_SAVED };

/* Bytes of the saved parts and offsets in the workspace for B x T tokens. */
typedef struct swa_layout {
    int64_t act, probs;                  /* one [N, H*D] part; the p part */
    int64_t dO, dq, dk, dv, dp, workspace;  /* workspace */
    int64_t L;                           /* probabilities kept per query: min(window, T) */
} swa_layout;

swa_layout swa_layout_of(const swa *m, int64_t B, int64_t T);

/* The attention core over the projected q, k, v (everything [N, H*D] row-major):
 *   forward:  o and p from q, k, v
 *   backward: dq, dk, dv (overwritten) from do, q, k, v, p; dp is scratch shaped as p */
int swa_core_fwd_f32(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const float *q,
                     const float *k, const float *v, float *o, float *p, k3rt_error *err);
int swa_core_bwd_f32(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const float *q,
                     const float *k, const float *v, const float *p, const float *dO, float *dq,
                     float *dk, float *dv, float *dp, k3rt_error *err);
int swa_core_fwd_f64(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const double *q,
                     const double *k, const double *v, double *o, double *p, k3rt_error *err);
int swa_core_bwd_f64(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const double *q,
                     const double *k, const double *v, const double *p, const double *dO,
                     double *dq, double *dk, double *dv, double *dp, k3rt_error *err);

#endif
