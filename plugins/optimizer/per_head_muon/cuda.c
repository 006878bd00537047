/* per_head_muon on CUDA: the step of step.c, on the device, without a synchronisation.
 *
 *   1. momentum_kernel: every Muon block's momentum and Nesterov mix into a contiguous f32
 *      arena U, with each chunk's sum of squares;
 *   2. normalise_kernel: X = U / (||U||_F + eps) per block, stored in the Newton-Schulz dtype
 *      (bf16, or f32 for ns_precision = "full");
 *   3. Newton-Schulz: blocks of equal shape are one group, contiguous in the arenas, so each
 *      product of a step is one strided-batched GEMM per group (k3rt_gemm_strided_batched_into:
 *      cuBLASLt, bf16 on the tensor cores with fp32 accumulation, or f32 without TF32), and the
 *      terms b S and a X are those products' addends, read in their epilogues (C apart from D),
 *      so no elementwise pass runs between them;
 *   4. apply_kernel: W = W (1 - lr wd) - lr scale sqrt(max(R, C)) X;
 *   5. the AdamW group: k3rt_adamw_step_multi, one fused launch (step.c);
 *   6. QK-clip: qk_clip_kernel reads each head's max logit on the device and scales its block.
 *      A NaN or +inf logit cannot stop the step without reading it back, so the kernel leaves
 *      that head alone and records it; a later step (the next one in training, where the
 *      forward and backward in between have finished it) reports it as an error (the CPU
 *      refuses the step itself).
 * The device tables (blocks, chunks, clip heads) are built once at create; the per-parameter
 * pointers are uploaded again only when the engine passes different ones. */
#include "muon.h"
#include "muon_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Blocks of one shape, contiguous in the arenas from x_off (X, Y, U) and s_off (S, P). */
typedef struct ns_group {
    int64_t rows, cols, count, x_off, s_off, filled;
} ns_group;

struct muon_gpu {
    int nsdt;                        /* K3RT_BF16 or K3RT_F32 */
    muon_cu_ptrs *ptrs;              /* host copy of what the device table holds */
    int ptrs_valid;
    muon_cu_ptrs *d_ptrs;
    muon_cu_block *d_blocks;
    muon_cu_chunk *d_chunks, *d_clip_chunks;
    muon_cu_clip *d_clips;
    int64_t n_chunks, n_clip_chunks, n_clips;
    int32_t *clip_param;             /* clip id -> parameter, for the error message */
    int32_t *clip_head;
    ns_group *groups;
    int n_groups;
    int64_t x_elems, s_elems;
    float *u;
    void *x, *y, *sq, *p;
    double *partial;
    int32_t *d_bad;
    muon_cu_word *word;
    int64_t posted_step;
};

enum { ARENA_ALIGN = 128 };  /* elements: 256-byte group starts in bf16, 512 in f32 */

static int64_t round_up(int64_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static void *dev_alloc(const muon *o, k3rt_stream *s, size_t bytes, int zero, k3rt_error *err)
{
    void *p = k3rt_alloc(o->device, bytes ? bytes : 1, err);
    if (!p)
        return NULL;
    if (zero && k3rt_memset(s, p, o->device, 0, bytes ? bytes : 1, err)) {
        k3rt_free(o->device, p);
        return NULL;
    }
    return p;
}

/* Copies a host table to a fresh device one. */
static int upload(const muon *o, k3rt_stream *s, void **dst, const void *src, size_t bytes,
                  k3rt_error *err)
{
    *dst = dev_alloc(o, s, bytes, 0, err);
    if (!*dst)
        return k3rt_error_prefix(err, "per_head_muon: device tables: ");
    return bytes ? k3rt_memcpy(s, *dst, o->device, src, K3RT_DEVICE_CPU, bytes, err) : K3RT_OK;
}

/* The groups of equal block shape, in order of first appearance. */
static int plan_groups(muon *o, struct muon_gpu *g, k3rt_error *err)
{
    g->groups = calloc((size_t)o->n + 1, sizeof *g->groups);
    if (!g->groups)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    for (int32_t i = 0; i < o->n; i++) {
        const muon_view *v = &o->p[i].view;
        if (o->p[i].rule != MUON_RULE_MUON)
            continue;
        int k = 0;
        while (k < g->n_groups && (g->groups[k].rows != v->rows || g->groups[k].cols != v->cols))
            k++;
        if (k == g->n_groups)
            g->groups[g->n_groups++] = (ns_group){.rows = v->rows, .cols = v->cols};
        g->groups[k].count += v->count;
    }
    for (int k = 0; k < g->n_groups; k++) {
        ns_group *q = &g->groups[k];
        int64_t m = q->rows < q->cols ? q->rows : q->cols;
        q->x_off = g->x_elems;
        q->s_off = g->s_elems;
        g->x_elems += round_up(q->count * q->rows * q->cols);
        g->s_elems += round_up(q->count * m * m);
    }
    return K3RT_OK;
}

static int group_of(const struct muon_gpu *g, const muon_view *v)
{
    int k = 0;
    while (g->groups[k].rows != v->rows || g->groups[k].cols != v->cols)
        k++;
    return k;
}

static int64_t chunks_of(int64_t elems) { return (elems + MUON_CU_CHUNK - 1) / MUON_CU_CHUNK; }

/* Every Muon block and its chunks. */
static int plan_blocks(muon *o, k3rt_stream *s, struct muon_gpu *g, k3rt_error *err)
{
    int64_t nb = 0, nc = 0;
    for (int32_t i = 0; i < o->n; i++)
        if (o->p[i].rule == MUON_RULE_MUON) {
            nb += o->p[i].view.count;
            nc += o->p[i].view.count * chunks_of(o->p[i].view.rows * o->p[i].view.cols);
        }
    muon_cu_block *b = calloc((size_t)nb + 1, sizeof *b);
    muon_cu_chunk *c = calloc((size_t)nc + 1, sizeof *c);
    int rc = b && c ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    int64_t kb = 0, kc = 0;
    for (int32_t i = 0; i < o->n && !rc; i++) {
        const muon_param *p = &o->p[i];
        const muon_view *v = &p->view;
        if (p->rule != MUON_RULE_MUON)
            continue;
        ns_group *q = &g->groups[group_of(g, v)];
        int64_t e = v->rows * v->cols;
        for (int64_t k = 0; k < v->count; k++, kb++) {
            b[kb] = (muon_cu_block){
                .ptrs = i, .decayed = p->decayed, .rows = v->rows, .cols = v->cols,
                .ld = v->ld, .src = k * v->stride, .dst = q->x_off + q->filled++ * e,
                .chunk0 = kc, .chunk1 = kc + chunks_of(e),
                .shape = sqrt((double)(v->rows > v->cols ? v->rows : v->cols))};
            for (int64_t f = 0; f < e; f += MUON_CU_CHUNK, kc++)
                c[kc] = (muon_cu_chunk){.owner = (int32_t)kb,
                                        .count = (int32_t)(e - f < MUON_CU_CHUNK ? e - f
                                                                                 : MUON_CU_CHUNK),
                                        .first = f};
        }
    }
    if (!rc && nb > INT32_MAX)
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: %lld Muon blocks exceed 2^31",
                       (long long)nb);
    g->n_chunks = nc;
    if (!rc)
        rc = upload(o, s, (void **)&g->d_blocks, b, (size_t)nb * sizeof *b, err);
    if (!rc)
        rc = upload(o, s, (void **)&g->d_chunks, c, (size_t)nc * sizeof *c, err);
    if (!rc)  /* the uploads read the host tables before they are freed */
        rc = k3rt_stream_sync(s, err);
    free(b), free(c);
    return rc;
}

/* Every head of every QK-clip parameter and its chunks. */
static int plan_clips(muon *o, k3rt_stream *s, struct muon_gpu *g, k3rt_error *err)
{
    int64_t nh = 0, nc = 0;
    for (int32_t i = 0; i < o->n; i++)
        if (o->p[i].qk_clip) {
            nh += o->p[i].heads.count;
            nc += o->p[i].heads.count * chunks_of(o->p[i].heads.rows * o->p[i].heads.cols);
        }
    g->n_clips = nh;
    g->n_clip_chunks = nc;
    if (!nh)
        return K3RT_OK;
    muon_cu_clip *h = calloc((size_t)nh, sizeof *h);
    muon_cu_chunk *c = calloc((size_t)nc, sizeof *c);
    g->clip_param = calloc((size_t)nh, sizeof *g->clip_param);
    g->clip_head = calloc((size_t)nh, sizeof *g->clip_head);
    int rc = h && c && g->clip_param && g->clip_head
                 ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    int64_t kh = 0, kc = 0;
    for (int32_t i = 0; i < o->n && !rc; i++) {
        const muon_param *p = &o->p[i];
        const muon_view *v = &p->heads;
        if (!p->qk_clip)
            continue;
        int64_t e = v->rows * v->cols;
        for (int64_t k = 0; k < v->count; k++, kh++) {
            h[kh] = (muon_cu_clip){.ptrs = i, .mode = p->qk_clip, .head = (int32_t)k,
                                   .id = (int32_t)kh, .rows = v->rows, .cols = v->cols,
                                   .ld = v->ld, .src = k * v->stride};
            g->clip_param[kh] = i;
            g->clip_head[kh] = (int32_t)k;
            for (int64_t f = 0; f < e; f += MUON_CU_CHUNK, kc++)
                c[kc] = (muon_cu_chunk){.owner = (int32_t)kh,
                                        .count = (int32_t)(e - f < MUON_CU_CHUNK ? e - f
                                                                                 : MUON_CU_CHUNK),
                                        .first = f};
        }
    }
    if (!rc)
        rc = upload(o, s, (void **)&g->d_clips, h, (size_t)nh * sizeof *h, err);
    if (!rc)
        rc = upload(o, s, (void **)&g->d_clip_chunks, c, (size_t)nc * sizeof *c, err);
    if (!rc)
        rc = k3rt_stream_sync(s, err);
    free(h), free(c);
    if (rc)
        return rc;
    g->d_bad = dev_alloc(o, s, sizeof *g->d_bad, 0, err);
    if (!g->d_bad)
        return k3rt_error_prefix(err, "per_head_muon: QK-clip flag: ");
    K3RT_TRY(k3rt_memset(s, g->d_bad, o->device, 0x7f, sizeof *g->d_bad, err));
    return muon_cu_word_create(&g->word, o->device, g->d_bad, err);
}

static int alloc_arenas(muon *o, k3rt_stream *s, struct muon_gpu *g, k3rt_error *err)
{
    size_t es = k3rt_dtype_size(g->nsdt), xe = (size_t)g->x_elems, se = (size_t)g->s_elems;
    /* zeroed: the padding between groups is never written, and stays finite where a pass reads it */
    g->u = dev_alloc(o, s, xe * sizeof(float), 1, err);
    g->x = g->u && g->nsdt == K3RT_BF16 ? dev_alloc(o, s, xe * es, 1, err) : g->u;
    g->y = g->x ? dev_alloc(o, s, xe * es, 1, err) : NULL;
    g->sq = g->y ? dev_alloc(o, s, se * es, 1, err) : NULL;
    g->p = g->sq ? dev_alloc(o, s, se * es, 1, err) : NULL;
    g->partial = g->p ? dev_alloc(o, s, (size_t)g->n_chunks * sizeof(double), 0, err) : NULL;
    g->d_ptrs = g->partial ? dev_alloc(o, s, (size_t)(o->n + 1) * sizeof(muon_cu_ptrs), 0, err)
                           : NULL;
    if (!g->d_ptrs)
        return k3rt_error_prefix(err, "per_head_muon: Newton-Schulz arenas (%lld + %lld "
                                 "elements): ", (long long)g->x_elems, (long long)g->s_elems);
    return K3RT_OK;
}

int muon_gpu_create(muon *o, k3rt_stream *s, k3rt_error *err)
{
    struct muon_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    o->gpu = g;
    g->nsdt = o->ns_bf16 ? K3RT_BF16 : K3RT_F32;
    g->posted_step = -1;
    g->ptrs = calloc((size_t)o->n + 1, sizeof *g->ptrs);
    if (!g->ptrs)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    K3RT_TRY(plan_groups(o, g, err));
    K3RT_TRY(plan_blocks(o, s, g, err));
    K3RT_TRY(plan_clips(o, s, g, err));
    return alloc_arenas(o, s, g, err);
}

void muon_gpu_destroy(muon *o)
{
    struct muon_gpu *g = o->gpu;
    if (!g)
        return;
    muon_cu_word_destroy(g->word);
    void *dev[] = {g->d_ptrs, g->d_blocks, g->d_chunks, g->d_clip_chunks, g->d_clips,
                   g->x != g->u ? g->x : NULL, g->u, g->y, g->sq, g->p, g->partial, g->d_bad};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            k3rt_free(o->device, dev[i]);
    free(g->ptrs), free(g->groups), free(g->clip_param), free(g->clip_head);
    free(g);
    o->gpu = NULL;
}

int64_t muon_gpu_workspace_bytes(const muon *o)
{
    const struct muon_gpu *g = o->gpu;
    if (!g)
        return 0;
    int64_t es = (int64_t)k3rt_dtype_size(g->nsdt);
    return g->x_elems * (int64_t)sizeof(float) + g->x_elems * es * (g->x == g->u ? 1 : 2) +
           2 * g->s_elems * es + g->n_chunks * (int64_t)sizeof(double);
}

/* ---- the step ------------------------------------------------------------------------------ */

static char *at(void *base, int64_t elems, int dtype)
{
    return (char *)base + elems * (int64_t)k3rt_dtype_size(dtype);
}

/* `steps` quintic iterations over every group; returns the arena holding the result. */
static int newton_schulz(muon *o, k3rt_stream *s, void **out, k3rt_error *err)
{
    struct muon_gpu *g = o->gpu;
    const int dt = g->nsdt;
    void *cur = g->x, *nxt = g->y;
    for (int it = 0; it < o->ns_steps; it++) {
        for (int k = 0; k < g->n_groups; k++) {  /* S = X X^T (wide) or X^T X (tall) */
            const ns_group *q = &g->groups[k];
            int64_t R = q->rows, C = q->cols, m = R <= C ? R : C;
            K3RT_TRY(k3rt_gemm_strided_batched(s, dt, R > C, R <= C, m, m, R <= C ? C : R, 1.0,
                                               at(cur, q->x_off, dt), C, R * C,
                                               at(cur, q->x_off, dt), C, R * C, 0.0,
                                               at(g->sq, q->s_off, dt), m, m * m, q->count,
                                               err));
        }
        for (int k = 0; k < g->n_groups; k++) {  /* P = c S S + b S */
            const ns_group *q = &g->groups[k];
            int64_t m = q->rows <= q->cols ? q->rows : q->cols;
            const void *sq = at(g->sq, q->s_off, dt);
            K3RT_TRY(k3rt_gemm_strided_batched_into(s, dt, 0, 0, m, m, m, MUON_NS_C, sq, m, m * m,
                                                    sq, m, m * m, MUON_NS_B, sq,
                                                    at(g->p, q->s_off, dt), m, m * m, q->count,
                                                    err));
        }
        for (int k = 0; k < g->n_groups; k++) {  /* X' = P X + a X (wide) or X P + a X (tall) */
            const ns_group *q = &g->groups[k];
            int64_t R = q->rows, C = q->cols, m = R <= C ? R : C, rc = R * C;
            const void *xa = at(cur, q->x_off, dt), *pp = at(g->p, q->s_off, dt);
            void *xn = at(nxt, q->x_off, dt);
            if (R <= C)
                K3RT_TRY(k3rt_gemm_strided_batched_into(s, dt, 0, 0, R, C, R, 1.0, pp, m, m * m,
                                                        xa, C, rc, MUON_NS_A, xa, xn, C, rc,
                                                        q->count, err));
            else
                K3RT_TRY(k3rt_gemm_strided_batched_into(s, dt, 0, 0, R, C, C, 1.0, xa, C, rc, pp,
                                                        m, m * m, MUON_NS_A, xa, xn, C, rc,
                                                        q->count, err));
        }
        void *t = cur;
        cur = nxt;
        nxt = t;
    }
    *out = cur;
    return K3RT_OK;
}

/* The pointer table, uploaded only when the engine's pointers changed since the last step. */
static int refresh_ptrs(muon *o, const k3rt_optimizer_step *a, k3rt_error *err)
{
    struct muon_gpu *g = o->gpu;
    int changed = !g->ptrs_valid;
    for (int32_t i = 0; i < o->n; i++) {
        const k3rt_param_ref *r = &a->params[i];
        muon_cu_ptrs p = {.w = r->param.data, .g = r->grad.data, .mom = o->p[i].state,
                          .logit = o->p[i].qk_clip ? r->head_max_logit.data : NULL};
        if (memcmp(&p, &g->ptrs[i], sizeof p)) {
            g->ptrs[i] = p;
            changed = 1;
        }
    }
    g->ptrs_valid = 1;
    if (!changed)
        return K3RT_OK;
    /* from pageable memory: staged before the call returns, so g->ptrs may change next step */
    return k3rt_memcpy(a->stream, g->d_ptrs, o->device, g->ptrs, K3RT_DEVICE_CPU,
                       (size_t)o->n * sizeof *g->ptrs, err);
}

/* A NaN or +inf max logit met by an earlier step's QK-clip, once its flag reached the host
 * (polled, never waited for: in training the forward and backward since have long finished
 * it). */
static int previous_clip(muon *o, k3rt_error *err)
{
    struct muon_gpu *g = o->gpu;
    int32_t bad;
    if (!g->word)
        return K3RT_OK;
    K3RT_TRY(muon_cu_word_poll(g->word, &bad, err));
    if (bad == MUON_CU_NONE)
        return K3RT_OK;
    return k3rt_fail(err, K3RT_ERR_NUMERIC, "per_head_muon: parameter %s: head %d reported a "
                     "max logit of NaN or +inf by step %lld; QK-clip needs a finite value (that "
                     "head was left unclipped)", o->p[g->clip_param[bad]].name,
                     (int)g->clip_head[bad], (long long)g->posted_step);
}

int muon_gpu_step(muon *o, const k3rt_optimizer_step *a, k3rt_error *err)
{
    struct muon_gpu *g = o->gpu;
    k3rt_stream *s = a->stream;
    void *st = k3rt_stream_native(s);
    K3RT_TRY(previous_clip(o, err));
    for (int32_t i = 0; i < o->n; i++)
        if (o->p[i].qk_clip && !k3rt_tensor_present(&a->params[i].head_max_logit))
            return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: parameter %s: QK-clip is on "
                             "(qk_clip) but its owner reported no max logits (stats "
                             "\"max_logit\"); turn the owner's reporting on (mla: "
                             "report_max_logit = true) or set qk_clip = false", o->p[i].name);
    K3RT_TRY(refresh_ptrs(o, a, err));
    if (g->n_chunks) {
        void *res;
        K3RT_TRY(muon_cu_momentum(st, g->d_ptrs, g->d_blocks, g->d_chunks, g->n_chunks,
                                  o->momentum, o->nesterov, g->u, g->partial, err));
        K3RT_TRY(muon_cu_normalise(st, g->d_blocks, g->d_chunks, g->n_chunks, g->partial,
                                   MUON_NS_EPS, g->u, g->x, g->nsdt == K3RT_BF16, err));
        if (newton_schulz(o, s, &res, err))
            return k3rt_error_prefix(err, "per_head_muon: Newton-Schulz: ");
        K3RT_TRY(muon_cu_apply(st, g->d_ptrs, g->d_blocks, g->d_chunks, g->n_chunks, res,
                               g->nsdt == K3RT_BF16, a->lr, o->scale, o->weight_decay, err));
    }
    K3RT_TRY(muon_adamw_group(o, a, err));
    if (g->n_clip_chunks) {
        K3RT_TRY(muon_cu_qk_clip(st, g->d_ptrs, g->d_clips, g->d_clip_chunks, g->n_clip_chunks,
                                 o->qk_tau, g->d_bad, err));
        if (!muon_cu_word_posted(g->word)) {
            K3RT_TRY(muon_cu_word_post(g->word, st, err));
            g->posted_step = a->step;
        }
    }
    return K3RT_OK;
}
