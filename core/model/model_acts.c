/* Activation memory for one micro-batch shape, planned up front from the plugins' own byte
 * counts (llm.c prints what it will use; so does `k3rt train --dry-run`). */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

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

/* Lays the arena out twice: once without a base to measure it, once to hand out pointers. */
typedef struct planner {
    char *base;
    size_t at;
} planner;

static void *take(planner *p, size_t bytes)
{
    void *r = p->base ? p->base + p->at : NULL;
    p->at += (bytes + 63) & ~(size_t)63;
    return r;
}

static void layout(const model *m, model_acts *a, planner *p, int64_t N, int64_t saved,
                   int64_t ws)
{
    int64_t S = 2 * (int64_t)m->n_layers;
    size_t e = m->elem, se = m->master_elem, row = (size_t)m->d * e;
    a->tokens = take(p, (size_t)N * 4);
    a->targets = take(p, (size_t)N * 4);
    a->h0 = take(p, (size_t)N * row);
    a->hs = take(p, (size_t)(S * N) * row);
    a->rstd = take(p, (size_t)(S * N) * se);
    a->xn = take(p, (size_t)N * row);
    a->ys = take(p, (size_t)N * row);
    a->hf = take(p, (size_t)N * row);
    a->hn = take(p, (size_t)N * row);
    a->rstd_f = take(p, (size_t)N * se);
    a->dhn = take(p, (size_t)N * row);
    a->dh = take(p, (size_t)N * row);
    a->dxn = take(p, (size_t)N * row);
    a->dys = take(p, (size_t)N * row);
    a->logits = take(p, (size_t)(a->chunk * m->vocab) * e);
    a->lse = take(p, (size_t)a->chunk * se);
    a->row_loss = take(p, (size_t)N * se);
    a->saved = take(p, (size_t)saved);
    a->ws = take(p, (size_t)ws);
    for (int i = 0; i < m->n_layers; i++)
        a->d_scores[i] = m->layers[i].experts
                             ? take(p, (size_t)(N * m->layers[i].experts) * sizeof(float))
                             : NULL;
}

void model_free_acts(model *m)
{
    for (int i = 0; i < m->n_mods; i++)
        rig_unbind_shape(&m->mods[i].r);
    if (m->a) {
        free(m->a->routing);
        free(m->a->d_scores);
        free(m->a);
    }
    k3rt_free(m->opt.device, m->act);
    m->a = NULL;
    m->act = NULL;
    m->act_bytes = 0;
    m->B = m->T = 0;
}

/* Rows of the LM head processed at once: about 4M logits, at least 1 row. */
static int64_t head_chunk(const model *m, int64_t n)
{
    int64_t rows = (int64_t)(4 << 20) / m->vocab;
    if (rows < 1)
        rows = 1;
    return rows < n ? rows : n;
}

/* The modules' saved regions back to back and the largest workspace for B x T; with
 * `place`, each module also records its region. */
static int module_bytes(model *m, int64_t B, int64_t T, int place, int64_t *saved, int64_t *ws,
                        k3rt_error *err)
{
    *saved = *ws = 0;
    for (int i = 0; i < m->n_mods; i++) {
        model_module *mm = &m->mods[i];
        k3rt_memory mem;
        int64_t bytes;
        if (mm->kind == K3RT_KIND_BALANCER || mm->kind == K3RT_KIND_OPTIMIZER)
            continue;
        K3RT_TRY(rig_memory(&mm->r, B, T, &mem, err));
        K3RT_TRY(rig_saved_total(&mm->r, B, T, &bytes, err));
        if (place) {
            mm->saved_offset = *saved;
            mm->saved_bytes = bytes;
        }
        *saved += bytes;
        if (mem.workspace_bytes > *ws)
            *ws = mem.workspace_bytes;
    }
    return K3RT_OK;
}

/* Hands every module its region of the arena for B x T. */
static int bind_modules(model *m, int64_t B, int64_t T, int64_t ws_bytes, k3rt_error *err)
{
    for (int i = 0; i < m->n_mods; i++) {
        model_module *mm = &m->mods[i];
        if (mm->kind == K3RT_KIND_BALANCER || mm->kind == K3RT_KIND_OPTIMIZER)
            continue;
        K3RT_TRY(rig_bind_shape(&mm->r, B, T, (char *)m->a->saved + mm->saved_offset,
                                mm->saved_bytes, m->a->ws, ws_bytes, err));
    }
    return K3RT_OK;
}

int model_act_bytes(model *m, int64_t B, int64_t T, int64_t *bytes, k3rt_error *err)
{
    if (B < 1 || T < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: batch %lld x sequence %lld",
                         (long long)B, (long long)T);
    int64_t saved, ws;
    K3RT_TRY(module_bytes(m, B, T, 0, &saved, &ws, err));
    model_acts a;
    memset(&a, 0, sizeof a);
    a.d_scores = calloc((size_t)m->n_layers, sizeof *a.d_scores);
    if (!a.d_scores)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    a.chunk = head_chunk(m, B * T);
    planner p = {NULL, 0};
    layout(m, &a, &p, B * T, saved, ws);
    free(a.d_scores);
    *bytes = (int64_t)p.at;
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
    int64_t N = B * T, saved, ws;
    K3RT_TRY(module_bytes(m, B, T, 1, &saved, &ws, err));
    m->a = calloc(1, sizeof *m->a);
    if (m->a) {
        m->a->routing = calloc((size_t)m->n_layers, sizeof *m->a->routing);
        m->a->d_scores = calloc((size_t)m->n_layers, sizeof *m->a->d_scores);
    }
    if (!m->a || !m->a->routing || !m->a->d_scores) {
        model_free_acts(m);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    }
    m->a->chunk = head_chunk(m, N);
    planner p = {NULL, 0};
    layout(m, m->a, &p, N, saved, ws);
    m->act = k3rt_alloc(m->opt.device, p.at, err);
    if (!m->act) {
        model_free_acts(m);
        return err ? err->code : K3RT_ERR_NOMEM;
    }
    m->B = B;
    m->T = T;
    m->act_bytes = p.at;
    p.base = m->act;
    p.at = 0;
    layout(m, m->a, &p, N, saved, ws);
    int rc = bind_modules(m, B, T, ws, err);
    if (rc)
        model_free_acts(m);
    return rc;
}
