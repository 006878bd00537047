/* Activation memory for one micro-batch shape, planned up front from the plugins' own byte
 * counts (llm.c prints what it will use; so does `k3rt train --dry-run`). */
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
#include "model/model_internal.h"
#include "util/checked.h"

int model_sub_module(const model *m, int s)
{
    const model_layer *L = &m->layers[s / 2];
    return s % 2 ? L->ffn : L->mixer;
}

int model_sub_norm(const model *m, int s)
{
    const model_layer *L = &m->layers[s / 2];
    return s % 2 ? L->ffn_norm : L->mixer_norm;
}

/* Lays the arena out twice: once without a base to measure it, once to hand out pointers.
 * Every size comes from the recipe (batch, sequence, width, layers, vocabulary, experts), so
 * the sums and products are checked: `bad` is set once any of them overflows 64 bits. */
typedef struct planner {
    char *base;
    int64_t at;
    int bad;
} planner;

static void *take(planner *p, int64_t bytes)
{
    void *r = p->base && !p->bad ? p->base + p->at : NULL;
    p->at = ck_add(&p->bad, p->at, ck_align(&p->bad, bytes, 64));
    return r;
}

/* n rows of `width` elements of `elem` bytes. */
static void *take_rows(planner *p, int64_t n, int64_t width, size_t elem)
{
    return take(p, ck_mul(&p->bad, ck_mul(&p->bad, n, width), (int64_t)elem));
}

static void layout(const model *m, model_acts *a, planner *p, int64_t N, int64_t saved,
                   int64_t ws)
{
    int64_t S = 2 * (int64_t)m->n_layers, SN = ck_mul(&p->bad, S, N);
    size_t e = m->elem, se = m->master_elem;
    a->tokens = take_rows(p, N, 1, 4);
    a->targets = take_rows(p, N, 1, 4);
    a->h0 = take_rows(p, N, m->d, e);
    a->hs = take_rows(p, SN, m->d, e);
    a->rstd = take_rows(p, SN, 1, se);
    a->xn = take_rows(p, N, m->d, e);
    a->ys = take_rows(p, N, m->d, e);
    a->hf = take_rows(p, N, m->d, e);
    a->hn = take_rows(p, N, m->d, e);
    a->rstd_f = take_rows(p, N, 1, se);
    a->dhn = take_rows(p, N, m->d, e);
    a->dh = take_rows(p, N, m->d, e);
    a->dxn = take_rows(p, N, m->d, e);
    a->dys = take_rows(p, N, m->d, e);
    a->logits = take_rows(p, a->chunk, m->vocab, e);
    a->lse = take_rows(p, a->chunk, 1, se);
    a->row_loss = take_rows(p, N, 1, se);
    a->saved = take(p, saved);
    a->ws = take(p, ws);
    for (int i = 0; i < m->n_layers; i++)
        a->d_scores[i] = m->layers[i].experts
                             ? take_rows(p, N, m->layers[i].experts, sizeof(float))
                             : NULL;
}

/* The message for an arena whose size does not fit 64 bits. */
static int too_large(const model *m, int64_t B, int64_t T, k3rt_error *err)
{
    return k3rt_fail(err, K3RT_ERR_INVALID, "model: activations for micro-batches of %lld x "
                     "%lld tokens are too large (more than 2^63 bytes at d_model %lld, %d "
                     "layers, vocab %lld); reduce plan.micro_batch or plan.seq_len",
                     (long long)B, (long long)T, (long long)m->d, m->n_layers,
                     (long long)m->vocab);
}

void model_free_acts(model *m)
{
    for (int i = 0; i < m->n_mods; i++)
        rig_unbind_shape(&m->mods[i].r);
    if (m->am) {
        actman_free(m->am);
        free(m->am);
        m->am = NULL;
    }
    if (m->a) {
        free(m->a->routing);
        free(m->a->d_scores);
        free(m->a);
    }
    k3rt_free(m->opt.device, m->act);
    k3rt_free(m->opt.device, m->docs_buf);
    m->docs_buf = NULL;
    memset(&m->docs, 0, sizeof m->docs);
    m->a = NULL;
    m->act = NULL;
    m->act_bytes = 0;
    m->B = m->T = 0;
}

/* Rows of the LM head processed at once, at least 1: about 4M logits on the CPU (they stay in
 * cache), 128M on a GPU, where a chunk of a few hundred rows leaves the head's three GEMMs at
 * a fraction of the tensor cores' speed (measured on the H200: 46 ms of a 194 ms dense step in
 * 251 chunks of 131 rows at vocabulary 32000) for 256 MB of bf16 logits. */
static int64_t head_chunk(const model *m, int64_t n)
{
    int64_t target = m->opt.device == K3RT_DEVICE_CPU ? (int64_t)4 << 20 : (int64_t)128 << 20;
    int64_t rows = target / m->vocab;
    if (rows < 1)
        rows = 1;
    return rows < n ? rows : n;
}

/* The saved regions of modules outside the activation manager (the residual) back to back,
 * and the largest workspace, for B x T; with `place`, each module also records its region. */
static int module_bytes(model *m, int64_t B, int64_t T, int place, int64_t *saved, int64_t *ws,
                        k3rt_error *err)
{
    *saved = *ws = 0;
    for (int i = 0; i < m->n_mods; i++) {
        model_module *mm = &m->mods[i];
        k3rt_memory mem;
        int64_t bytes = 0;
        if (mm->kind == K3RT_KIND_BALANCER || mm->kind == K3RT_KIND_OPTIMIZER)
            continue;
        K3RT_TRY(rig_memory(&mm->r, B, T, &mem, err));
        if (mm->kind == K3RT_KIND_RESIDUAL)
            K3RT_TRY(rig_saved_total(&mm->r, B, T, &bytes, err));
        if (place) {
            mm->saved_offset = *saved;
            mm->saved_bytes = bytes;
        }
        int bad = bytes < 0 || mem.workspace_bytes < 0;
        *saved = ck_add(&bad, *saved, bytes);
        if (bad)
            return k3rt_fail(err, K3RT_ERR_INVALID, "model: %s (plugin %s) asks for %lld saved "
                             "and %lld workspace bytes at micro-batch %lld x %lld: too large "
                             "(or negative); reduce plan.micro_batch or plan.seq_len",
                             mm->prefix, mm->r.e->desc.name, (long long)bytes,
                             (long long)mem.workspace_bytes, (long long)B, (long long)T);
        if (mem.workspace_bytes > *ws)
            *ws = mem.workspace_bytes;
    }
    return K3RT_OK;
}

/* Hands every module its saved parts and the workspace for B x T: the residual its region,
 * mixers and FFNs the activation manager's placement. */
static int bind_modules(model *m, int64_t B, int64_t T, int64_t ws_bytes, k3rt_error *err)
{
    for (int i = 0; i < m->n_mods; i++) {
        model_module *mm = &m->mods[i];
        if (mm->kind == K3RT_KIND_BALANCER || mm->kind == K3RT_KIND_OPTIMIZER)
            continue;
        if (mm->kind == K3RT_KIND_RESIDUAL)
            K3RT_TRY(rig_bind_shape(&mm->r, B, T, (char *)m->a->saved + mm->saved_offset,
                                    mm->saved_bytes, m->a->ws, ws_bytes, err));
        else
            K3RT_TRY(rig_bind_shape(&mm->r, B, T, NULL, RIG_SAVED_POINTED, m->a->ws, ws_bytes,
                                    err));
    }
    return actman_place(m, m->am, (char *)m->a->saved + m->a->managed_offset, err);
}

/* The residual's saved bytes plus the activation manager's device regions. */
static int saved_bytes(model *m, int64_t B, int64_t T, int place, actman *am, int64_t *saved,
                       int64_t *ws, k3rt_error *err)
{
    K3RT_TRY(module_bytes(m, B, T, place, saved, ws, err));
    K3RT_TRY(actman_plan_with(m, B, T, m->opt.activations, m->opt.planned, am, err));
    int bad = 0;
    int64_t own = *saved;
    *saved = ck_add(&bad, ck_align(&bad, own, 64), actman_device_bytes(am));
    if (place)
        m->a->managed_offset = ck_align(&bad, own, 64);
    if (bad) {
        actman_free(am);
        return too_large(m, B, T, err);
    }
    return K3RT_OK;
}

int model_act_bytes(model *m, int64_t B, int64_t T, int64_t *bytes, k3rt_error *err)
{
    if (B < 1 || T < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: batch %lld x sequence %lld",
                         (long long)B, (long long)T);
    int64_t saved, ws;
    actman am;
    K3RT_TRY(saved_bytes(m, B, T, 0, &am, &saved, &ws, err));
    actman_free(&am);
    model_acts a;
    memset(&a, 0, sizeof a);
    a.d_scores = calloc((size_t)m->n_layers, sizeof *a.d_scores);
    if (!a.d_scores)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    planner p = {NULL, 0, 0};
    int64_t N = ck_mul(&p.bad, B, T);
    a.chunk = head_chunk(m, N);
    layout(m, &a, &p, N, saved, ws);
    free(a.d_scores);
    if (p.bad)
        return too_large(m, B, T, err);
    *bytes = p.at;
    return K3RT_OK;
}

int model_set_shape(model *m, int64_t B, int64_t T, k3rt_error *err)
{
    if (B == m->B && T == m->T && m->a)
        return K3RT_OK;
    if (B < 1 || T < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: batch %lld x sequence %lld",
                         (long long)B, (long long)T);
    model_free_acts(m);
    planner p = {NULL, 0, 0};
    int64_t N = ck_mul(&p.bad, B, T), saved, ws;
    if (p.bad)
        return too_large(m, B, T, err);
    m->a = calloc(1, sizeof *m->a);
    m->am = calloc(1, sizeof *m->am);
    if (m->a) {
        m->a->routing = calloc((size_t)m->n_layers, sizeof *m->a->routing);
        m->a->d_scores = calloc((size_t)m->n_layers, sizeof *m->a->d_scores);
    }
    if (!m->a || !m->am || !m->a->routing || !m->a->d_scores) {
        model_free_acts(m);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    }
    int rc = saved_bytes(m, B, T, 1, m->am, &saved, &ws, err);
    if (rc) {
        free(m->am);
        m->am = NULL;
        model_free_acts(m);
        return rc;
    }
    m->a->chunk = head_chunk(m, N);
    layout(m, m->a, &p, N, saved, ws);
    if (p.bad) {
        model_free_acts(m);
        return too_large(m, B, T, err);
    }
    m->act = k3rt_alloc(m->opt.device, (size_t)p.at, err);
    if (!m->act) {
        model_free_acts(m);
        return err ? err->code : K3RT_ERR_NOMEM;
    }
    m->B = B;
    m->T = T;
    m->act_bytes = (size_t)p.at;
    p.base = m->act;
    p.at = 0;
    layout(m, m->a, &p, N, saved, ws);
    rc = bind_modules(m, B, T, ws, err);
    if (rc)
        model_free_acts(m);
    return rc;
}

int model_set_documents(model *m, const int32_t *offsets, int64_t n_docs, k3rt_error *err)
{
    memset(&m->docs, 0, sizeof m->docs);
    if (n_docs == 0)
        return K3RT_OK;
    int64_t N = m->B * m->T;
    if (!m->a || n_docs < 1 || n_docs > N)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: %lld documents for a batch of %lld "
                         "tokens (set the shape first; 1 to one per token)", (long long)n_docs,
                         (long long)N);
    if (!m->docs_buf && !(m->docs_buf = k3rt_alloc(m->opt.device, (size_t)(N + 1) * 4, err)))
        return err ? err->code : K3RT_ERR_NOMEM;
    K3RT_TRY(k3rt_memcpy(m->opt.stream, m->docs_buf, m->opt.device, offsets, K3RT_DEVICE_CPU,
                         (size_t)(n_docs + 1) * 4, err));
    m->docs = k3rt_tensor_view(m->docs_buf, K3RT_I32, m->opt.device, 1, n_docs + 1, 0, 0, 0);
    return K3RT_OK;
}
