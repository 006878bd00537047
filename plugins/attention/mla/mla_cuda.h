/* The MLA plugin's own CUDA kernels behind a C interface (the .cu files of this folder): the
 * causal attention core and the per-token loops around it. Pointers are device pointers of the
 * call's dtype (K3RT_F32 or K3RT_BF16) unless typed float, which are f32 in either case;
 * `stream` is the cudaStream_t (k3rt_stream_native). Every function returns a k3rt status and
 * names what was wrong in err.
 *
 * Layouts, N = B*T tokens: Q, K [B, T, H, dqk]; V, O [B, T, H, dv]; lse and row dots [B, H, T].
 */
#ifndef K3RT_PLUGIN_MLA_CUDA_H
#define K3RT_PLUGIN_MLA_CUDA_H

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows per block of the per-block maxima (block_max): the smallest query tile of any kernel. */
#define MLA_CUDA_MAX_ROWS 32

/* Which implementation runs the attention core (mla_attn.kernel). */
enum {
    MLA_KERNEL_AUTO = 0,  /* cuDNN's fused attention where it takes the call, else k3rt's */
    MLA_KERNEL_K3RT = 1,  /* k3rt's own kernels */
    MLA_KERNEL_CUDNN = 2  /* cuDNN's, or an error saying why not */
};

/* One causal softmax attention, softmax(scale Q K^T + mask) V, per (batch, head):
 *   forward   reads q, k, v; writes o and lse (natural log-sum-exp of each row's scaled logits)
 *             and, when block_max is not NULL, the largest scaled logit of every
 *             MLA_CUDA_MAX_ROWS rows ([B*H, ceil(T/32)], NaN when a row's sum is NaN);
 *   backward  reads q, k, v, o, lse, dout; writes dq, dk, dv (overwritten), using drow
 *             ([B, H, T] f32 scratch). With `deterministic` no float atomics and fixed
 *             summation orders: the same bits on every run. Without it the tensor-core
 *             backward makes one pass and sums dQ with float atomics into dq_acc ([B, T, H, dqk]
 *             f32 scratch, 16-byte aligned, needed then): five products instead of seven, the
 *             last bits of dq varying between runs. The fp32 kernels are deterministic in
 *             either mode.
 * k3rt's kernels: bf16 with (dqk, dv) = (192, 128) or (128, 128) and 16-byte aligned rows runs
 * on the tensor cores (mma.sync m16n8k16, fp32 accumulation, online softmax); every other case
 * runs the fp32-arithmetic kernels (exact fp32 for f32 data), for head widths up to what shared
 * memory holds.
 * cuDNN's fused attention (kernel AUTO or CUDNN; attn_cudnn.h): bf16, T a multiple of 128, head
 * widths multiples of 8 up to 256 on Hopper (128 elsewhere), 16-byte aligned tensors, and the
 * library (libcudnn.so.9, 9.6 or later) loadable. Its forward cannot give block_max (the max
 * logits QK-clip needs): a forward asked for them runs k3rt's kernels. Its backward uses dq_acc
 * and drow as scratch and is not deterministic, so a deterministic backward always runs k3rt's
 * kernels. The lse of either forward serves either backward.
 * Packed documents (docs, not NULL): i32 offsets [n_docs + 1] on the device over the B*T
 * tokens, as k3rt_fwd_args.doc_offsets (every row start among them); query i then sees the keys
 * j with doc_start(i) <= j <= i, in the forward, its lse and block_max, and the backward. Only
 * k3rt's kernels mask documents: auto runs them, and kernel CUDNN is refused (attn.cu says
 * why). */
typedef struct mla_attn {
    int dtype;
    int64_t B, T, H, dqk, dv;
    double scale;
    const void *q, *k, *v;
    void *o;
    float *lse;
    float *block_max;
    const void *dout;
    void *dq, *dk, *dv_out;
    float *drow;
    int deterministic;
    float *dq_acc;
    int kernel;
    const int32_t *docs;
    int64_t n_docs;
} mla_attn;

/* Makes `device` current on the calling thread (the kernels launch on the current device). */
int mla_cuda_enter(int device, k3rt_error *err);

int mla_attn_fwd_cuda(void *stream, const mla_attn *a, k3rt_error *err);
int mla_attn_bwd_cuda(void *stream, const mla_attn *a, k3rt_error *err);
/* Which kernels mla_attn_*_cuda choose for a's forward (backward: its backward):
 * "cudnn", "tensor-core" or "fp32". */
const char *mla_attn_path(const mla_attn *a, int backward);

/* head_max[h] = max over b and row blocks of block_max[(b*H + h), :], NaN-propagating; when
 * `combine`, also max with the old head_max[h]. */
int mla_head_max_cuda(void *stream, const float *block_max, int64_t B, int64_t H, int64_t T,
                      float *head_max, int combine, k3rt_error *err);

/* dst[n, h, :] = [a[n, h*wa : (h+1)*wa] ; b-part], the b-part being b[n, h*wb : (h+1)*wb] or,
 * when b_shared, b[n, 0 : wb] for every head (the shared key). wb may be 0. */
int mla_assemble_cuda(void *stream, int dtype, void *dst, const void *a, int64_t wa,
                      const void *b, int64_t wb, int b_shared, int64_t N, int64_t H,
                      k3rt_error *err);
/* The reverse: a[n, h*wa ...] = src[n, h, 0:wa]; b gets src[n, h, wa:wa+wb], per head or, when
 * b_shared, summed over the heads in order into b[n, 0:wb]. a or b may be NULL. */
int mla_split_cuda(void *stream, int dtype, const void *src, void *a, int64_t wa, void *b,
                   int64_t wb, int b_shared, int64_t N, int64_t H, k3rt_error *err);

/* Decoding (decode.cu): one query per (b, h) against the latent cache kv [B, cap, dc + dr] (ĉ,
 * then the shared key kr) of L <= cap positions: scores scale (q_abs ĉ_τ + q_r kr_τ) into
 * scores ([B, H, cap] f32 scratch), their softmax P, and ctx [B, H, dc] = sum_τ P(τ) ĉ_τ;
 * q_abs [B, H, dc], q_r [B, H, dr] (NULL when dr = 0). */
int mla_decode_attend_cuda(void *stream, int dtype, int64_t B, int64_t H, int64_t dc,
                           int64_t dr, int64_t L, int64_t cap, double scale, const void *q_abs,
                           const void *q_r, const void *kv, float *scores, void *ctx,
                           k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
