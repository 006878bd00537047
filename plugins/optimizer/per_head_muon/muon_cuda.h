/* per_head_muon's device kernels behind a C interface (kernels.cu), called by cuda.c. Every
 * Muon block, of every parameter, is cut into chunks of MUON_CU_CHUNK elements (a block's
 * elements in row-major order); one CUDA block handles one chunk, so a launch covers the whole
 * group of a step whatever the mix of shapes. `stream` is the cudaStream_t
 * (k3rt_stream_native). Pointers are device pointers; tables are device copies of the structs
 * below. Every function returns a k3rt status and names what failed in err. */
#ifndef K3RT_PLUGIN_MUON_CUDA_H
#define K3RT_PLUGIN_MUON_CUDA_H

#include <k3rt/k3rt.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUON_CU_CHUNK 16384

/* The per-step pointers of one parameter (weights, gradient, momentum, QK-clip max logits). */
typedef struct muon_cu_ptrs {
    float *w;
    const float *g;
    float *mom;
    const float *logit;
} muon_cu_ptrs;

/* One Muon block: rows x cols at element `src` of its parameter, rows `ld` apart; its
 * elements sit contiguously from `dst` in the arenas, and its chunks are [chunk0, chunk1). */
typedef struct muon_cu_block {
    int32_t ptrs;        /* index into the pointer table */
    int32_t decayed;
    int64_t rows, cols, ld, src, dst;
    int64_t chunk0, chunk1;
    double shape;        /* sqrt(max(rows, cols)) */
} muon_cu_block;

/* One head of a QK-clip parameter: the same addressing; `mode` k3rt_qk_clip; `head` indexes
 * the max logits; `id` orders the heads for the first-bad-head report. */
typedef struct muon_cu_clip {
    int32_t ptrs, mode, head, id;
    int64_t rows, cols, ld, src;
} muon_cu_clip;

/* `first` element of block (or clip head) `owner`, `count` elements. */
typedef struct muon_cu_chunk {
    int32_t owner;
    int32_t count;
    int64_t first;
} muon_cu_chunk;

/* m = beta m + (1 - beta) g; u = nesterov ? (1 - beta) g + beta m : m into the f32 arena u,
 * and partial[c] = sum of u^2 over chunk c (f64, a fixed tree). */
int muon_cu_momentum(void *stream, const muon_cu_ptrs *ptrs, const muon_cu_block *blocks,
                     const muon_cu_chunk *chunks, int64_t n_chunks, double beta, int nesterov,
                     float *u, double *partial, k3rt_error *err);
/* x = u / (||u_block||_F + eps) as f32 or bf16 (x may be u when f32); each block's norm is the
 * sum of its chunks' partials in chunk order. */
int muon_cu_normalise(void *stream, const muon_cu_block *blocks, const muon_cu_chunk *chunks,
                      int64_t n_chunks, const double *partial, double eps, const float *u,
                      void *x, int x_bf16, k3rt_error *err);
/* w = w (1 - lr wd [decayed]) - lr scale shape x. */
int muon_cu_apply(void *stream, const muon_cu_ptrs *ptrs, const muon_cu_block *blocks,
                  const muon_cu_chunk *chunks, int64_t n_chunks, const void *x, int x_bf16,
                  double lr, double scale, double weight_decay, k3rt_error *err);
/* QK-clip: a head whose max logit s exceeds tau is scaled by sqrt(tau / s) (K3RT_QK_SQRT) or
 * tau / s (K3RT_QK_FULL); -inf and values <= tau are left alone; NaN or +inf leave the head
 * alone and lower *bad to the head's id (bad starts above every id). */
int muon_cu_qk_clip(void *stream, const muon_cu_ptrs *ptrs, const muon_cu_clip *clips,
                    const muon_cu_chunk *chunks, int64_t n_chunks, double tau, int32_t *bad,
                    k3rt_error *err);

/* A device word (the caller's, on `device`, set to MUON_CU_NONE) read back without a
 * synchronisation: post copies it into pinned memory behind the stream's work so far, records
 * an event and resets the word to MUON_CU_NONE; poll returns that copy once the event has
 * completed (a later step, after the forward and backward that followed), else MUON_CU_NONE
 * with the post still pending. Post again only when nothing is pending (muon_cu_word_posted):
 * until then the kernels keep lowering the same device word. *w is set before any failure, for
 * muon_cu_word_destroy. */
#define MUON_CU_NONE 0x7f7f7f7f
typedef struct muon_cu_word muon_cu_word;
int muon_cu_word_create(muon_cu_word **w, int device, int32_t *dev, k3rt_error *err);
int muon_cu_word_post(muon_cu_word *w, void *stream, k3rt_error *err);
int muon_cu_word_poll(muon_cu_word *w, int32_t *value, k3rt_error *err);
int muon_cu_word_posted(const muon_cu_word *w);
void muon_cu_word_destroy(muon_cu_word *w);

#ifdef __cplusplus
}
#endif
#endif
