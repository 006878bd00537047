/* KDA's chunked recurrence ("core", spec kda_mla.md §3-§6) on CUDA, behind a C interface: the
 * forward (o, final state, what the backward needs), the backward (gradients of q, k, v, g, beta
 * and the initial state) and the affine summary of a span (§6) for context parallelism.
 * Pointers are device pointers; `stream` is the cudaStream_t (k3rt_stream_native). Every function
 * returns a k3rt status and, on failure, names the kernel and the CUDA error in err.
 *
 * Tensors (N = B*T tokens, the layout of kda.h, all rows contiguous):
 *   q, k    [B, T, H, D]    L2-normalised (H qk heads)                   dtype
 *   v, o    [B, T, HV, D]   value head j reads qk head j / (HV / H)       dtype
 *   g       [B, T, HV, D]   log decay (natural log), lower_bound <= g <= 0, lower_bound >= -5
 *   beta    [B, T, HV]      in (0, 1)                                    dtype
 *   s0, s_final, d_s0, d_s_final  [n_seq, HV, D, D]  ([dk, dv] per head)  float32
 * dtype is K3RT_F32 or K3RT_BF16 for q, k, v, g, beta, o, d_o and the gradients; states are
 * float32 in either case. dk = dv = D in {32, 64, 128}. scale s (0: D^-1/2) multiplies q.
 * Packed sequences: with cu_seqlens (int32 device array of n_docs + 1 offsets into the N tokens,
 * non-decreasing, cu_seqlens[0] = 0, cu_seqlens[n_docs] = N; B must be 1) the state starts from
 * s0 (or zero) at every document and chunks never cross a document boundary; n_seq = n_docs.
 * Without it the B rows are the sequences; n_seq = B.
 *
 * Algorithm (C = 64-token chunks, spec §4.1 in the WY form, §5.1): four kernel families.
 *  prep   chunk-parallel, grid (chunks, HV), 256 threads. Per chunk: decay exponents referenced at
 *         the midpoint of each 16-token sub-chunk (every exponent stays below 40 nats with g >= -5,
 *         so e^{G_r - G_i} factorises into two bounded factors and the intra-chunk products run
 *         on tensor cores); Aqk, L (16x16 blocks), T = (I + L)^-1 (fp32: forward substitution on
 *         the four diagonal blocks, then three levels of block merges), W = T (beta Γ k),
 *         U^T = (beta v)^T T^T, Qg = s q Γ, Kb = k Γ̄, γ. Its floor is memory (it reads q, k, v,
 *         g, 4 x 64 x D, and writes 5 tiles of 64 x D and Aqk, T, L [64 x 64]: ~0.3 ms at
 *         B8 T4096 H16 D128); measured 1.52 ms: latency-bound (below). Products: mma.sync
 *         m16n8k16 with bf16 operands and fp32 accumulation (16x16 output tiles per warp); bf16
 *         operands keep every bf16 error within spec §9 (o <= 4.2e-3 of 5e-3, NOTES.md), so
 *         tf32 (twice the operand bytes, half the rate) was not needed.
 *  state  sequential over the chunks of each sequence, grid (n_seq, HV, D / (16 NW)), NW warps of
 *         32 threads; each warp owns 16 value columns of the state (the columns evolve
 *         independently) and keeps S^T [16 x D] in fp32 registers as mma accumulators, packed
 *         to bf16 A-fragments for the products: Δ^T = U^T - S^T W^T, O = Qg S + Aqk Δ,
 *         S^T <- S^T Diag(γ) + Δ^T Kb (224 mma.sync m16n8k16 per warp per chunk at D = 128).
 *         The next chunk's W, Qg, Kb, Aqk, U^T stream into the second shared-memory stage with
 *         cp.async while the current one is computed. NW is chosen so that the grid fills the
 *         132 SMs (8 at B*HV >= 132, down to 1). Bound by the chain of dependent products per
 *         chunk (latency), which at batch 1 runs on one warp per SM sub-partition.
 *         The backward's reverse pass is the same kernel shape: dΔ^T = dO^T Aqk + dS'^T Kb^T,
 *         dS^T <- dS'^T Diag(γ) + dO^T Qg - dΔ^T W.
 *  bwd_a  chunk-parallel, 256 threads, 8 warps each owning 16 rows x D/2 columns of the
 *         chunk's dq, dk, dG accumulators (registers across the phases): dAqk = dO Δ^T,
 *         dQg = dO S^T, dKb = Δ dS'^T, dW = -dΔ S^T, dT = dW (beta Γ k)^T + dΔ (beta v)^T,
 *         T^T dW, T^T dΔ (-> dv), dL = -T^T dT T^T (-> dbeta, dLk).
 *  bwd_b  chunk-parallel: the pairwise terms of Aqk and L through the same midpoint
 *         factorisation, then the reverse cumulative sum of dG over the chunk -> dg. Its
 *         products contract over tokens only, so at D >= 64 a chunk's channels are two blocks
 *         of D/2 (grid z; 77 KB and 128 registers at D = 128: two blocks an SM).
 * Stored rather than recomputed (`saved`, written by the forward): the chunk-start states S^T and
 * the corrections Δ^T (spare the backward a second sequential pass), and the prep's outputs Qg,
 * Kb, W, Aqk, T, L, γ: recomputing them cost the backward 1.53 ms of 9.65 at B8 T4096 H16 D128
 * (H200, 2026-12-01), keeping them costs the forward ~0.1 ms of stores and 72 KB per chunk and
 * value head (bf16, D = 128; saved is ~1.9 KB per token and head in all). Recomputed: the
 * gate exponents and the sub-chunk sides (Qt, Kt, KC) in bwd_a / bwd_b, from q, k, g.
 * Measured (NOTES.md; bf16, B8 T4096 H8 D128, H200, 2026-12-04, ncu): prep 0.73 ms at one
 * block an SM (two now: the layer's forward is 0.22 ms shorter; prep not timed alone), state
 * 0.28 ms forward, reverse state 0.26, bwd_a 0.97, bwd_b 0.47 ms. The chunk
 * kernels are latency-bound (a dozen block barriers between short phases; bwd_a at one block
 * an SM, 229 KB of shared memory and 170 registers), far from the memory floor; their code
 * must stay well inside the instruction cache (NOTES.md: at 160 KB bwd_a waited on
 * instruction fetch for 47 % of its cycles);
 * the state passes are bound by their chain of dependent products (0.58 ms for 64 chunks at
 * one 8-warp block per head; 3.9 ms for 1024 chunks at batch 1, one warp per block).
 * Arithmetic: bf16 data runs the products on the tensor cores (bf16 operands, fp32 accumulation,
 * fp32 state, fp32 gates and inverse). f32 data runs every product in fp32 FMA (exact fp32; for
 * tests: ~1e-6 relative to float64), same kernels with a scalar product engine.
 * Determinism: no atomics, fixed reduction orders: the same bits on every run.
 */
#ifndef K3RT_PLUGIN_KDA_CUDA_H
#define K3RT_PLUGIN_KDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KDA_CUDA_CHUNK 64

typedef struct kda_cuda_args {
    int dtype;                  /* K3RT_F32 or K3RT_BF16 */
    int64_t B, T, H, HV, D;     /* D = dk = dv */
    double scale;               /* 0: D^-1/2 */
    const int32_t *cu_seqlens;  /* [n_docs + 1] device, or NULL */
    int64_t n_docs;             /* with cu_seqlens */
    /* forward */
    const void *q, *k, *v, *g, *beta;
    const float *s0;            /* or NULL (zeros) */
    void *o;
    float *s_final;             /* or NULL */
    void *saved;                /* kda_cuda_saved_bytes; written by the forward, read by the backward */
    void *workspace;            /* kda_cuda_workspace_bytes; scratch of either call */
    /* backward (reads q, k, v, g, beta, s0 and saved as the forward had them) */
    const void *d_o;
    const float *d_s_final;     /* or NULL (zeros) */
    void *d_q, *d_k, *d_v, *d_g, *d_beta;  /* overwritten */
    float *d_s0;                /* or NULL */
    /* Packed rows: with cu_seqlens and row_len > 0 the N tokens are N / row_len rows of row_len
     * tokens, every row start a document start (documents non-empty), and s0, s_final, d_s0,
     * d_s_final and the summary's m, bm are per row ([N / row_len, HV, D, D]): a document that
     * starts a row starts from that row's s0 (others from zero), one that ends a row gives its
     * s_final (a summary: its map, M = 0 when the document does not start the row too). 0: per
     * document, as above. */
    int64_t row_len;
} kda_cuda_args;

/* Bytes of `saved` and of `workspace` (for the backward when `backward`, which is the larger),
 * from the sizes and dtype of a (pointers are not read; the packed layout when cu_seqlens is
 * set or n_docs > 0: a call with fewer documents needs no more). */
int kda_cuda_saved_bytes(const kda_cuda_args *a, size_t *bytes, k3rt_error *err);
int kda_cuda_workspace_bytes(const kda_cuda_args *a, int backward, size_t *bytes, k3rt_error *err);

int kda_cuda_fwd(void *stream, const kda_cuda_args *a, k3rt_error *err);
int kda_cuda_bwd(void *stream, const kda_cuda_args *a, k3rt_error *err);

/* The affine map of each sequence's span (spec §6.1): S_out = M S_in + Bm, m [n_seq, HV, D, D],
 * bm [n_seq, HV, D, D] (float32), from q, k, v, g, beta (s0 and o unused). Uses saved and the
 * forward's workspace as scratch (a backward needs the forward run again after it). */
int kda_cuda_summary(void *stream, const kda_cuda_args *a, float *m, float *bm, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
