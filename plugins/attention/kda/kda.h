/* Kimi Delta Attention (KDA): the instance, its parameter slots, the buffer layout and the
 * internal entry points shared by plugin.c, the CPU reference (cpu.c, built for float and
 * double), the CUDA path (cuda.c), the tests and the CPU benchmark. Math: spec kda_mla.md
 * §2-§6 (+ ERRATA).
 *
 * Tensor layout of the recurrence ("core"), per sequence b, token t:
 *   q, k  [B, T, H, dim_k]  L2-normalised queries and keys (H qk heads)
 *   v     [B, T, HV, dim_v]  values (HV value heads; value head j reads qk head j / (HV / H))
 *   g     [B, T, HV, dim_k]  log decay per key channel (<= 0)
 *   beta  [B, T, HV]      write strength in (0, 1)
 *   S     [B, HV, dim_k, dim_v] recurrent state; S_t = (I - b k k^T) Diag(e^g) S_{t-1} + b k v^T
 *   o     [B, T, HV, dim_v]  o_t = S_t^T (scale q_t),  scale = dim_k^-1/2
 */
#ifndef K3RT_PLUGIN_KDA_H
#define K3RT_PLUGIN_KDA_H

#include <k3rt/k3rt.h>

enum { KDA_RECURRENT = 0, KDA_CHUNKED = 1 };

/* Rows of the sub-blocks inside a chunk: intra-chunk products are taken block row by block
 * row against the block's first token, so no exponent exceeds one block of decay (spec §4.2). */
#define KDA_SUB 16

/* Largest decay (nats) within a sub-block that is factorised through its first token:
 * e^80 < FLT_MAX = e^88.7, and a lower bound of -5 spans at most 75 over KDA_SUB - 1 steps.
 * Beyond it (unbounded gates) the diagonal block is summed pair by pair. */
#define KDA_THETA 80.0

/* Parameter slots, in declaration order; a slot absent from a configuration has index -1. */
enum {
    KDA_Q,       /* q_proj.weight    [H*dim_k, d]   head_matrix, rows by qk head */
    KDA_K,       /* k_proj.weight    [H*dim_k, d]   head_matrix, rows by qk head */
    KDA_V,       /* v_proj.weight    [HV*dim_v, d]  head_matrix, rows by value head */
    KDA_QCONV,   /* q_conv1d.weight  [H*dim_k, W]   conv */
    KDA_KCONV,   /* k_conv1d.weight  [H*dim_k, W]   conv */
    KDA_VCONV,   /* v_conv1d.weight  [HV*dim_v, W]  conv */
    KDA_FA,      /* f_a_proj.weight  [rf, d]        matrix            (forget_rank > 0) */
    KDA_FB,      /* f_b_proj.weight  [HV*dim_k, rf]  head_matrix, rows (forget_rank > 0) */
    KDA_F,       /* f_proj.weight    [HV*dim_k, d]  head_matrix, rows (forget_rank == 0) */
    KDA_B,       /* b_proj.weight    [HV, d]        head_matrix, one row per value head */
    KDA_ALOG,    /* A_log            [HV]           vector, no weight decay */
    KDA_DTB,     /* dt_bias          [HV*dim_k]     vector, no weight decay */
    KDA_GA,      /* g_a_proj.weight  [rg, d]        matrix            (gate_rank > 0) */
    KDA_GB,      /* g_b_proj.weight  [HV*dim_v, rg]  head_matrix, rows (gate_rank > 0) */
    KDA_G,       /* g_proj.weight    [HV*dim_v, d]  head_matrix, rows (gate_rank == 0) */
    KDA_NORM,    /* o_norm.weight    [dim_v]        norm_gain, shared by the heads */
    KDA_O,       /* o_proj.weight    [d, HV*dim_v]  head_matrix, columns by value head */
    KDA_N_SLOTS
};

typedef struct kda {
    int64_t d;          /* d_model */
    int64_t H, HV;      /* qk heads, value heads (HV % H == 0) */
    int64_t dim_k, dim_v;  /* key and value head widths */
    int64_t W;          /* short-conv width */
    int has_lb;         /* 1: g = lb * sigmoid(e^A_log z); 0: g = -e^A_log softplus(z) */
    double lb;          /* lower bound of g (log retention per step), in [-5, 0) */
    int64_t rf, rg;     /* forget / output gate ranks (0 = full rank) */
    int algorithm;      /* KDA_RECURRENT or KDA_CHUNKED */
    int64_t C;          /* chunk size (recurrent: checkpoint interval of the saved states) */
    double norm_eps;    /* output RMSNorm epsilon */
    double init_std;
    int dtype;          /* CPU: K3RT_F32 or K3RT_F64; CUDA: K3RT_F32 or K3RT_BF16 */
    int device;         /* K3RT_DEVICE_CPU or a CUDA device */
    int64_t max_docs;   /* documents per call the saved memory is planned for (0: one a row) */
    int slots;          /* per-thread scratch slots = threads of the create stream */
    int slot[KDA_N_SLOTS];  /* parameter index of each slot, or -1 */
    int n_params;
    k3rt_stream *stream;    /* the create stream (every call runs on it) */
    void *compose_ws;       /* CUDA: cp_compose's scratch, compose_bytes, grown on demand */
    size_t compose_bytes;
} kda;

/* Documents per call that the saved memory is planned for: max_documents, at least one per
 * batch row. */
static inline int64_t kda_doc_cap(const kda *m, int64_t B)
{
    return m->max_docs > B ? m->max_docs : B;
}

/* Packed sequences: the row-local start and end of the document that holds row-local token t
 * of row b. docs: the doc_offsets (n_docs + 1 rising entries from 0 to B*T, every row start
 * among them) on the host; NULL means the row is one sequence. */
static inline void kda_doc_span(const int32_t *docs, int64_t n_docs, int64_t T, int64_t b,
                                int64_t t, int64_t *start, int64_t *end)
{
    if (!docs) {
        *start = 0, *end = T;
        return;
    }
    int64_t n = b * T + t, lo = 0, hi = n_docs - 1; /* the last document starting at or before n */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (docs[mid] <= n)
            lo = mid;
        else
            hi = mid - 1;
    }
    *start = docs[lo] - b * T, *end = docs[lo + 1] - b * T;
}

static inline int64_t kda_chunks(int64_t T, int64_t C) { return (T + C - 1) / C; }

/* Shapes of one call of the recurrence. */
typedef struct kda_dims {
    int64_t B, T, H, HV, dim_k, dim_v;
    int64_t C;          /* chunk size */
    double scale;       /* applied to q: dim_k^-1/2 */
} kda_dims;

/* The CPU's saved parts, in declaration order (plugin.c kda_saved); the inputs of matrix
 * products alone (the gates' low-rank hiddens, o_proj's input) are GEMM-only. */
enum {
    KDA_SAVED_PROJ, KDA_SAVED_CONV, KDA_SAVED_CORE_IN, KDA_SAVED_QK_RSTD, KDA_SAVED_FORGET_LOW,
    KDA_SAVED_GATES, KDA_SAVED_CORE_OUT, KDA_SAVED_OUT_RSTD, KDA_SAVED_OGATE_LOW,
    KDA_SAVED_OGATE, KDA_SAVED_OUT_IN, KDA_SAVED_STATES, KDA_SAVED_N
};

/* A saved tensor by its layout offset (kda_layout *lp), in whichever part holds it. */
#define KDA_SV(lp, off) \
    ((REAL *)k3rt_saved_at(io->saved, (lp)->part_end, KDA_SAVED_N, (off), sizeof(REAL)))

/* Elements of the compute dtype, into the saved buffer (forward -> backward) and the
 * workspace. N = B*T tokens, Dk = H*dim_k, Dv = HV*dim_v, Dg = HV*dim_k. */
typedef struct kda_layout {
    /* saved */
    int64_t qp, kp, vp;        /* [N, Dk|Dk|Dv] projections before the conv */
    int64_t qc, kc, vc;        /* [N, Dk|Dk|Dv] conv outputs before SiLU */
    int64_t qn, kn, v;         /* [N, Dk|Dk|Dv] core inputs: L2-normalised q, k; SiLU v */
    int64_t rq, rk;            /* [N, H] x2     1/sqrt(sum q^2 + 1e-6) per head */
    int64_t fa;                /* [N, rf]       forget gate down-projection (rf > 0) */
    int64_t z;                 /* [N, Dg]       gate input a + dt_bias */
    int64_t g;                 /* [N, Dg]       log decay */
    int64_t beta;              /* [N, HV]       sigmoid(x Wb^T) */
    int64_t o;                 /* [N, Dv]       core output before the norm */
    int64_t rstd;              /* [N, HV]       output RMSNorm 1/rms */
    int64_t ga;                /* [N, rg]       output gate down-projection (rg > 0) */
    int64_t G;                 /* [N, Dv]       output gate pre-activation */
    int64_t yg;                /* [N, Dv]       o_proj input */
    int64_t states;            /* [B, HV, NT, dim_k, dim_v] state at every chunk start (with
                                  documents: [HV, NT_j, dim_k, dim_v] for each in turn) */
    int64_t saved;             /* total */
    int64_t part_end[KDA_SAVED_N]; /* the run as the CPU's saved parts (cumulative ends) */
    /* workspace of forward, backward and cp_summary */
    int64_t on;                /* [N, Dv]       normed core output */
    int64_t halo;              /* [B*(W-1), Dk+Dk+Dv] projections of the conv halo */
    int64_t dhalo;             /* [B*(W-1), max(Dk, Dv)] gradient of one of them */
    int64_t d1, d2, d3;        /* [N, Dv] x3    dyg -> do, d(on) -> dv pre-SiLU, dG */
    int64_t dlow;              /* [N, max(rf, rg)] gradients of the low-rank gates */
    int64_t dq, dk, dv;        /* [N, Dk|Dk|Dv] gradients of the recurrence inputs */
    int64_t dg, dbeta;         /* [N, Dg], [N, HV] */
    int64_t dp;                /* [N, max(Dk, Dv)] gradient of one conv input */
    int64_t dac;               /* [Dg]          per-channel dA_log sums */
    int64_t core, core_n;      /* the recurrence's workspace and its size */
    int64_t workspace;         /* total */
} kda_layout;

/* The parts of layout l pointed into one block laid out as the run (benchmarks, which call
 * the layer functions without the engine). */
static inline void kda_parts_in_block(const kda_layout *l, void *block, size_t es, void **parts)
{
    for (int i = 0; i < KDA_SAVED_N; i++)
        parts[i] = (char *)block + (size_t)(i ? l->part_end[i - 1] : 0) * es;
}

void kda_layout_make(const kda *m, int64_t B, int64_t T, int slots, kda_layout *l);
/* FLOPs (multiply-add = 2) of the recurrence alone, forward and backward. */
void kda_core_flops(const kda_dims *d, int algorithm, double *fwd, double *bwd);

/* Buffers of one layer call. Pointers are of the call's dtype; params and grads are indexed by
 * parameter slot (KDA_*), NULL where a slot is absent. The x_halo / dx_halo pair is the conv
 * halo for context parallelism: the W-1 rows of the layer input that precede x in the
 * sequence ([B, W-1, d]); NULL means the span starts the sequence (zero padding). */
typedef struct kda_io {
    int64_t B, T;
    const void *x, *x_halo;
    void *y;
    const void *params[KDA_N_SLOTS];
    void *grads[KDA_N_SLOTS];
    const void *s_in;          /* [B, HV, dim_k, dim_v] or NULL (zeros) */
    void *s_out;               /* or NULL */
    const void *dy;
    void *dx, *dx_halo;        /* dx overwritten; dx_halo overwritten when both halos given */
    const void *ds_out;        /* or NULL (zeros) */
    void *ds_in;               /* or NULL */
    void *const *saved;        /* the saved parts (kda_layout.part_end) */
    void *ws;
    /* Packed sequences: doc_offsets ([n_docs + 1] i32 on the instance's device) or NULL. State
     * and conv window restart at every document; a row's first document starts from s_in and
     * x_halo of its row, its last one gives s_out. */
    const int32_t *docs;
    int64_t n_docs;
} kda_io;

/* Internal entry points, per dtype (tensor layouts at the top of this file):
 * kda_core_ws_elems  workspace of the recurrence in elements: per-thread scratch for `slots`
 *                    threads and, with GVA, per-value-head q/k gradients before they are
 *                    summed over the value heads that share a qk head; the same for either dtype.
 * kda_core_fwd       o (and s_final) from q, k, v, g, beta and s0 (NULL: zeros); states
 *                    [B, HV, NT, dim_k, dim_v] receives the state at every chunk start.
 * kda_core_bwd       gradients of every input from d_o and ds_final (NULL: zeros), given the
 *                    states of either algorithm's forward; ds0 may be NULL. Overwrites.
 * kda_core_summary   the affine map of the span, m [B, HV, dim_k, dim_k], b [B, HV, dim_k, dim_v].
 * kda_compose        (m, b) = (m2 m1, m2 b1 + b2) over n heads; outputs may alias inputs.
 * kda_layer_*        the layer (cpu_layer.inc.c) on a kda_io. */
#define KDA_DECLARE(REAL, S)                                                                    \
    int64_t kda_core_ws_elems_##S(const kda_dims *d, int slots);                                \
    int kda_core_fwd_##S(k3rt_stream *s, int algorithm, const kda_dims *d, const REAL *q,       \
                         const REAL *k, const REAL *v, const REAL *g, const REAL *beta,         \
                         const REAL *s0, REAL *o, REAL *states, REAL *s_final, REAL *ws,        \
                         int64_t ws_elems, k3rt_error *err);                                    \
    int kda_core_bwd_##S(k3rt_stream *s, int algorithm, const kda_dims *d, const REAL *q,       \
                         const REAL *k, const REAL *v, const REAL *g, const REAL *beta,         \
                         const REAL *states, const REAL *d_o, const REAL *ds_final, REAL *dq,   \
                         REAL *dk, REAL *dv, REAL *dg, REAL *dbeta, REAL *ds0, REAL *ws,        \
                         int64_t ws_elems, k3rt_error *err);                                    \
    int kda_core_summary_##S(k3rt_stream *s, const kda_dims *d, const REAL *q, const REAL *k,   \
                             const REAL *v, const REAL *g, const REAL *beta, REAL *m, REAL *b,  \
                             REAL *ws, int64_t ws_elems, k3rt_error *err);                      \
    int kda_compose_##S(k3rt_stream *s, int64_t n, int64_t dim_k, int64_t dim_v, const REAL *m1,  \
                        const REAL *b1, const REAL *m2, const REAL *b2, REAL *m, REAL *b,       \
                        k3rt_error *err);                                                       \
    int kda_layer_fwd_##S(const kda *m, k3rt_stream *s, const kda_io *io, k3rt_error *err);     \
    int kda_layer_bwd_##S(const kda *m, k3rt_stream *s, const kda_io *io, k3rt_error *err);     \
    int kda_layer_summary_##S(const kda *m, k3rt_stream *s, const kda_io *io, REAL *sm,         \
                              REAL *sb, k3rt_error *err);

KDA_DECLARE(float, f32)
KDA_DECLARE(double, f64)

/* ---- incremental decoding (decode.c) ---------------------------------------------------- */

/* One cache per batch of B sequences decoded side by side: what the layer keeps between two
 * tokens, and one step's scratch. */
typedef struct kda_cache {
    int64_t B;
    void *S;          /* [B, HV, dim_k, dim_v] the recurrent state: REAL on the CPU, f32 on
                         CUDA (as state_layout) */
    void *hist[3];    /* [B, W-1, Dk | Dk | Dv] the q, k, v conv inputs (projections) of the
                         last W-1 tokens, oldest first, zeros before the first token: the conv
                         halo of the next token (compute dtype) */
    void *ws;         /* one step's buffers (kda_dec_layout in decode.c) */
} kda_cache;

/* The pieces of one decode step that the shared ops lack, per device and dtype; decode.c runs
 * the step with them (device pointers, compute dtype unless said otherwise):
 *   conv    out = act(z), z = the short conv of the token p [B, C] over hist [B, W-1, C] (the
 *           previous W-1 inputs), C = heads * hd; act = SiLU, then with l2 the L2 norm of each
 *           head's hd channels (kda_cu_conv_fwd's); then hist drops its oldest row and appends p.
 *           scratch: kda_dec_scratch bytes.
 *   gate    g = the forget gate of z [B, HV*dim_k] (z + dt_bias, then lb sigmoid or softplus).
 *           On the CPU z becomes z + dt_bias in place.
 *   recur   one token of the recurrence per (sequence, value head) on the state S (kda_cache),
 *           o = S^T (scale q) after the write.
 *   ogate   yg = on sigmoid(G) over n elements. */
typedef struct kda_dec_kernels {
    int (*conv)(const kda *m, k3rt_stream *s, int64_t B, int64_t heads, int64_t hd,
                const void *p, void *hist, const void *w, int l2, void *out, void *scratch,
                k3rt_error *err);
    int (*gate)(const kda *m, k3rt_stream *s, int64_t B, void *z, const void *a_log,
                const void *dt_bias, void *g, k3rt_error *err);
    int (*recur)(const kda *m, k3rt_stream *s, int64_t B, void *S, const void *q, const void *k,
                 const void *v, const void *g, const void *beta, void *o, void *scratch,
                 k3rt_error *err);
    int (*ogate)(const kda *m, k3rt_stream *s, int64_t n, const void *on, const void *G,
                 void *yg, k3rt_error *err);
} kda_dec_kernels;

extern const kda_dec_kernels kda_dec_cpu_f32, kda_dec_cpu_f64;
/* Scratch bytes the CPU pieces need for B sequences (the CUDA ones need none). */
int64_t kda_dec_scratch(const kda *m, int64_t B);

int kda_cache_create(void *self, const k3rt_cache_args *a, void **cache, k3rt_error *err);
int kda_decode_step(void *self, void *cache, const k3rt_decode_args *a, k3rt_error *err);
void kda_cache_destroy(void *self, void *cache);

/* The layer on CUDA (cuda.c, built only with CUDA), f32 or bf16: sizes of the saved parts and
 * the workspace, forward, backward, cp_summary (f32 m, b) and cp_compose (f32, n heads). */
int kda_gpu_memory(const kda *m, int64_t B, int64_t T, k3rt_memory *out, k3rt_error *err);
int kda_gpu_saved(const kda *m, int64_t B, int64_t T, k3rt_saved_sink *sink, k3rt_error *err);
int kda_gpu_forward(const kda *m, const k3rt_fwd_args *a, k3rt_error *err);
int kda_gpu_backward(const kda *m, const k3rt_bwd_args *a, k3rt_error *err);
int kda_gpu_summary(const kda *m, const k3rt_fwd_args *a, float *sm, float *sb,
                    k3rt_error *err);
int kda_gpu_compose(kda *m, k3rt_stream *s, int64_t n, const float *m1, const float *b1,
                    const float *m2, const float *b2, float *mo, float *bo, k3rt_error *err);
/* The decode step's pieces on CUDA (cuda_decode.c), f32 or bf16. */
extern const kda_dec_kernels kda_dec_cuda;

#endif
