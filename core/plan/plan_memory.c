/* Memory per GPU and communication volumes of a declared model under a parallel plan.
 *
 * Assumptions (printed by plan_print.c):
 *   - ranks = dp x ep x cp x pp; pp stages of ceil(L / pp) layers, the largest sized with
 *     every parameter outside the layers; every rank of a stage holds the stage's
 *     non-expert parameters; routed-expert
 *     matrices are split across the ep ranks (experts / ep per layer each) and replicated
 *     across dp x cp;
 *   - bf16 weights, fp32 master weights, fp32 gradients, fp32 optimizer states sized per role
 *     by the optimizer plugin itself (a probe parameter of each role; nothing model-sized is
 *     allocated);
 *   - shard_optimizer: master weights and optimizer states are split across the ranks that
 *     hold the same parameters (N for non-expert, dp x cp for expert parameters); gradients
 *     are split the same way only under shard_gradients (ZeRO-2);
 *   - activations: keep-everything (no recompute or offload): the model's buffers, every
 *     plugin's memory().saved_bytes and the largest workspace for one micro-batch of
 *     micro_batch x seq_len/cp tokens, as the CPU plugins count them in f32, halved for bf16;
 *   - expert all-to-all: uniform routing, bf16 tokens, ep the fastest-varying axis of the rank
 *     layout (an ep group is consecutive GPUs). */
#include "plan/plan_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

void plan_module_name(const model *m, int mi, char *buf, size_t len)
{
    const model_module *mm = &m->mods[mi];
    const char *plugin = mm->r.e->desc.name;
    if (mm->kind == K3RT_KIND_ATTENTION)
        snprintf(buf, len, "mixer %c (%s)", m->layers[mm->layer].mixer_letter, plugin);
    else if (mm->kind == K3RT_KIND_MOE)
        snprintf(buf, len, "%s (%s)", m->layers[mm->layer].experts ? "ffn" : "dense ffn",
                 plugin);
    else
        snprintf(buf, len, "%s (%s)", k3rt_kind_name(mm->kind), plugin);
}

/* A small parameter with the same role and layout flags as `like`. */
static void probe_decl(const k3rt_param_decl *like, k3rt_param_decl *d)
{
    *d = *like;
    d->name = "probe.weight";
    for (int k = 0; k < d->ndim; k++)
        d->shape[k] = 8;
    if (d->role == K3RT_ROLE_HEAD_MATRIX && d->ndim == 2 && d->heads > 0)
        d->shape[d->head_axis == 1] = 4 * (int64_t)d->heads;
    if (d->role == K3RT_ROLE_EXPERT_MATRIX && d->ndim == 3)
        d->shape[0] = d->experts = 2;
    if (d->role == K3RT_ROLE_ROUTER && d->experts > 0)
        d->experts = (int32_t)d->shape[0];
}

/* fp32 state values per parameter element the optimizer keeps for parameters like `like`. */
static int probe_state(const model *m, const plugin_entry *e, const json_t *spec,
                       const k3rt_param_decl *like, double *values, k3rt_error *err)
{
    k3rt_param_decl d;
    probe_decl(like, &d);
    int64_t n = 1;
    for (int k = 0; k < d.ndim; k++)
        n *= d.shape[k];
    float *buf = calloc((size_t)(2 * n), sizeof *buf);
    if (!buf)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "plan: out of memory");
    k3rt_param_ref ref;
    memset(&ref, 0, sizeof ref);
    ref.struct_size = sizeof ref;
    ref.name = d.name;
    ref.decl = &d;
    ref.param = k3rt_tensor_view(buf, K3RT_F32, K3RT_DEVICE_CPU, d.ndim, d.shape[0], d.shape[1],
                                 d.shape[2], d.shape[3]);
    ref.grad = ref.param;
    ref.grad.data = buf + n;
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = m->d;
    a.vocab = m->vocab;
    a.n_layers = m->n_layers;
    a.layer = -1;
    a.params = &ref;
    a.n_params = 1;
    a.stream = k3rt_host_stream();
    rig opt;
    int rc = rig_create(&opt, e, json_object_get(spec, "config"), &a, "optimizer", err);
    k3rt_memory mem;
    if (!rc) {
        rc = rig_memory(&opt, 0, 0, &mem, err);
        rig_destroy(&opt);
    }
    free(buf);
    if (!rc)
        *values = (double)mem.state_bytes / (4.0 * (double)n);
    return rc;
}

static int optimizer_states(const model *m, const json_t *doc, registry *reg, plan_report *r,
                            k3rt_error *err)
{
    const json_t *spec = json_object_get(doc, "optimizer");
    const plugin_entry *e;
    K3RT_TRY(model_resolve_spec(reg, spec, K3RT_KIND_OPTIMIZER, "optimizer", &e, err));
    snprintf(r->optimizer, sizeof r->optimizer, "%s", e->desc.name);
    for (int role = 1; role < K3RT_ROLE_COUNT_; role++) {
        const k3rt_param_decl *like = NULL;
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].decl.role == role) {
                like = like ? like : &m->params[i].decl;
                r->roles[role].numel += m->params[i].numel;
            }
        if (like)
            K3RT_TRY(probe_state(m, e, spec, like, &r->roles[role].values, err));
    }
    return K3RT_OK;
}

static int is_expert(const model *m, const param_slot *p)
{
    return p->decl.role == K3RT_ROLE_EXPERT_MATRIX && p->module >= 0 &&
           m->layers[m->mods[p->module].layer].experts > 0;
}

static int parameter_memory(const model *m, plan_report *r, k3rt_error *err)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].experts % r->ep)
            return k3rt_fail(err, K3RT_ERR_INVALID, "plan: ep = %d does not divide the %d "
                             "experts of layers.%d.ffn (each ep rank holds an equal share)",
                             r->ep, m->layers[i].experts, i);
    /* Pipeline stages take ceil(L / pp) layers each; the largest stage is sized, and it is
     * charged every parameter outside the layers (embedding, head, final norm, residual). */
    r->stage_layers = (m->n_layers + r->pp - 1) / r->pp;
    double stage = (double)r->stage_layers / m->n_layers;
    double ranks = (double)r->gpus / r->pp, expert_replicas = (double)r->dp * r->cp;
    for (int i = 0; i < m->n_params; i++) {
        const param_slot *p = &m->params[i];
        int expert = is_expert(m, p);
        int in_layer = p->module >= 0 && m->mods[p->module].layer >= 0;
        double held = (double)p->numel / (expert ? r->ep : 1) * (in_layer ? stage : 1);
        double shard = r->shard_optimizer ? (expert ? expert_replicas : ranks) : 1;
        double gshard = r->shard_gradients ? (expert ? expert_replicas : ranks) : 1;
        r->rank_params += held;
        r->mem_weights += 2 * held;
        r->mem_master += 4 * held / shard;
        r->mem_grads += 4 * held / gshard;
        r->mem_optimizer += 4 * r->roles[p->decl.role].values * held / shard;
    }
    return K3RT_OK;
}

/* Dispatch width: what the first routed-expert matrix reads (its `in`); combine width: what
 * the last one writes (its `out`) — experts declare their matrices input first. */
static void expert_traffic(const model *m, plan_report *r)
{
    for (int i = 0; i < m->n_layers; i++) {
        const model_layer *L = &m->layers[i];
        if (!L->experts)
            continue;
        if (!r->moe_layers++) {
            r->experts = L->experts;
            r->top_k = L->top_k;
            const rig *mod = &m->mods[L->ffn].r;
            for (int j = 0; j < rig_n_params(mod); j++) {
                const k3rt_param_decl *d = rig_param(mod, j);
                if (d->role != K3RT_ROLE_EXPERT_MATRIX || d->ndim != 3)
                    continue;
                if (!r->dispatch_width)
                    r->dispatch_width = d->shape[2];
                r->combine_width = d->shape[1];
            }
        }
    }
    double tokens = (double)r->micro_batch * (double)(r->seq_len / r->cp);
    r->a2a_bytes = tokens * r->top_k * (double)(r->dispatch_width + r->combine_width) * 2;
    r->a2a_off_rank = (double)(r->ep - 1) / r->ep;
    r->a2a_off_node = r->ep > r->node_gpus ? (double)(r->ep - r->node_gpus) / r->ep : 0;
}

/* The affine state summaries of every mixer that reports a state layout for context
 * parallelism, grouped by pattern letter. */
static int state_traffic(model *m, plan_report *r, k3rt_error *err)
{
    for (int i = 0; i < m->n_layers; i++) {
        model_module *mm = &m->mods[m->layers[i].mixer];
        const plugin_entry *e = mm->r.e;
        if (!e->vt.attention.cp_summary)
            continue;
        char name[96];
        snprintf(name, sizeof name, "mixer %c (%s)", m->layers[i].mixer_letter, e->desc.name);
        int c = 0;
        while (c < r->n_cps && strcmp(r->cps[c].name, name))
            c++;
        if (c == PLAN_MAX_CP)
            continue;
        plan_cp_state *s = &r->cps[c];
        if (c == r->n_cps) {
            r->n_cps++;
            k3rt_state_layout l;
            memset(&l, 0, sizeof l);
            l.struct_size = sizeof l;
            K3RT_TRY(rig_fail(&mm->r, e->vt.attention.state_layout(mm->r.self,
                                                                   r->micro_batch, &l, err),
                              err));
            snprintf(s->name, sizeof s->name, "%s", name);
            s->m_elems = k3rt_tensor_numel(&l.summary_m);
            s->b_elems = k3rt_tensor_numel(&l.summary_b);
            s->send_bytes = 4.0 * (double)(s->m_elems + s->b_elems);
            s->gather_bytes = (double)(r->cp - 1) * s->send_bytes;
        }
        s->layers++;
    }
    return K3RT_OK;
}

static plan_act_part *act_part(plan_report *r, const char *name)
{
    int c = 0;
    while (c < r->n_acts && strcmp(r->acts[c].name, name))
        c++;
    if (c == PLAN_MAX_COMPONENTS)
        return NULL;
    if (c == r->n_acts) {
        r->n_acts++;
        snprintf(r->acts[c].name, sizeof r->acts[c].name, "%s", name);
    }
    return &r->acts[c];
}

/* The arena model_act_bytes sizes, split into the modules' saved bytes (by part), the largest
 * workspace and the model's own buffers (residual inputs, norms, head chunk, gradients). */
static int activations(model *m, plan_report *r, k3rt_error *err)
{
    int64_t T = r->seq_len / r->cp, act, ws = 0;
    K3RT_TRY(model_act_bytes(m, r->micro_batch, T, &act, err));
    double modules = 0;
    for (int i = 0; i < m->n_mods; i++) {
        if (m->mods[i].kind == K3RT_KIND_BALANCER)
            continue;
        k3rt_memory mem;
        int64_t saved;
        K3RT_TRY(rig_memory(&m->mods[i].r, r->micro_batch, T, &mem, err));
        K3RT_TRY(rig_saved_total(&m->mods[i].r, r->micro_batch, T, &saved, err));
        char name[96];
        plan_module_name(m, i, name, sizeof name);
        plan_act_part *p = act_part(r, name);
        if (p)
            p->bytes += (double)saved;
        modules += (double)saved;
        ws = mem.workspace_bytes > ws ? mem.workspace_bytes : ws;
    }
    plan_act_part *w = act_part(r, "largest workspace"), *own = act_part(r, "model buffers");
    if (w)
        w->bytes = (double)ws;
    if (own)
        own->bytes = (double)act - modules - (double)ws;  /* alignment included */
    r->act_f32_bytes = (double)act;
    /* 1F1B: stage 0 holds min(pp, micro-batches) forwards before its first backward, each
     * with its layers' share of one micro-batch's activations (the largest workspace once). */
    r->in_flight = (int)(r->grad_accum < r->pp ? r->grad_accum : r->pp);
    double stage = (double)r->stage_layers / m->n_layers;
    r->mem_activations = 0.5 * ((double)act - (double)ws) * stage * r->in_flight + 0.5 * (double)ws;
    r->bubble = r->pp > 1 ? (double)(r->pp - 1) / (double)(r->grad_accum + r->pp - 1) : 0;
    r->pp_bytes = r->pp > 1 ? 2.0 * (double)r->micro_batch * (double)T * (double)m->d : 0;
    return K3RT_OK;
}

int plan_memory(model *m, const json_t *doc, registry *reg, plan_report *r, k3rt_error *err)
{
    K3RT_TRY(optimizer_states(m, doc, reg, r, err));
    K3RT_TRY(parameter_memory(m, r, err));
    K3RT_TRY(activations(m, r, err));
    r->mem_total = r->mem_weights + r->mem_master + r->mem_grads + r->mem_optimizer +
                   r->mem_activations;
    r->fits = r->mem_total <= r->gpu_mem;
    expert_traffic(m, r);
    return state_traffic(m, r, err);
}
