/* Model assembly: modules per layer, parameter naming and storage, initialisation. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "plugin/named.h"
#include "util/checked.h"

int model_resolve_spec(registry *reg, const json_t *spec, int kind, const char *where,
                       const plugin_entry **out, k3rt_error *err)
{
    const char *name = json_string_value(json_object_get(spec, "plugin"));
    const char *path = json_string_value(json_object_get(spec, "path"));
    if (!json_is_object(spec) || !name)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: expected a plugin spec", where);
    const plugin_entry *e = NULL;
    if (path) {
        /* A spec never loads code: a plugin named by its file is one the command line
         * (--plugin) or the recipe (k3.plugin) has already loaded. Specs also come from
         * checkpoint manifests and mid-run changes. */
        if (!(e = registry_find_file(reg, path, 0)))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: plugin '%s' is named by its file %s, "
                             "which nothing on this command loaded; k3rt loads a plugin file "
                             "only when the command line (--plugin %s) or the recipe "
                             "(k3.plugin) names it, never from a checkpoint or a mid-run "
                             "change", where, name, path, path);
    } else {
        e = registry_find(reg, name, kind);
        if (!e)
            return registry_not_found(reg, name, kind, where, err);
    }
    if (e->desc.kind != kind)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: plugin '%s' is a %s plugin, expected %s",
                         where, name, k3rt_kind_name(e->desc.kind), k3rt_kind_name(kind));
    *out = e;
    return K3RT_OK;
}

static int grow(void **items, int *cap, int n, size_t size, k3rt_error *err)
{
    if (n < *cap)
        return K3RT_OK;
    int c = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, (size_t)c * size);
    if (!p)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    *items = p;
    *cap = c;
    return K3RT_OK;
}

static k3rt_create_args base_args(const model *m, int layer)
{
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = m->opt.dtype;
    a.device = m->opt.device;
    a.d_model = m->d;
    a.vocab = m->vocab;
    a.n_layers = m->n_layers;
    a.layer = layer;
    a.deterministic = m->opt.deterministic;
    a.comm = m->opt.comm;
    a.stream = m->opt.stream;
    a.seed = m->opt.seed;
    return a;
}

/* Creates a module from a spec and appends it; *index receives its position. */
static int add_module(model *m, registry *reg, const json_t *spec, int kind, int layer,
                      const char *where, const char *prefix, const k3rt_create_args *args,
                      int *index, k3rt_error *err)
{
    const plugin_entry *e;
    K3RT_TRY(model_resolve_spec(reg, spec, kind, where, &e, err));
    K3RT_TRY(grow((void **)&m->mods, &m->cap_mods, m->n_mods, sizeof *m->mods, err));
    model_module *mm = &m->mods[m->n_mods];
    memset(mm, 0, sizeof *mm);
    K3RT_TRY(rig_create(&mm->r, e, json_object_get(spec, "config"), args, where, err));
    mm->kind = kind;
    mm->layer = layer;
    snprintf(mm->prefix, sizeof mm->prefix, "%s", prefix);
    *index = m->n_mods++;
    return K3RT_OK;
}

static int add_param(model *m, const char *name, const k3rt_param_decl *decl, int module,
                     int index, k3rt_error *err)
{
    if (model_find_param(m, name) >= 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: parameter %s is declared twice", name);
    K3RT_TRY(grow((void **)&m->params, &m->cap_params, m->n_params, sizeof *m->params, err));
    param_slot *p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->decl = *decl;
    p->decl.name = NULL;  /* set once the array stops moving (model_build) */
    p->module = module;
    p->index = index;
    int bad = decl->ndim < 0 || decl->ndim > K3RT_MAX_DIMS;
    p->numel = 1;
    for (int i = 0; i < decl->ndim && !bad; i++)
        p->numel = ck_mul(&bad, p->numel, decl->shape[i]);
    if (bad)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: parameter %s is too large (its shape's "
                         "element count does not fit 64 bits, or a dimension is negative); "
                         "reduce the sizes in its plugin's options", name);
    return K3RT_OK;
}

static k3rt_param_decl own_decl(int role, int64_t d0, int64_t d1, int init, double std)
{
    k3rt_param_decl d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.role = role;
    d.ndim = d1 ? 2 : 1;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.init = init;
    d.init_a = std;
    d.layer = -1;
    return d;
}

/* Appends every declaration of module mi (optionally only those of one residual layer). */
static int add_module_params(model *m, int mi, int only_layer, k3rt_error *err)
{
    model_module *mm = &m->mods[mi];
    for (int j = 0; j < rig_n_params(&mm->r); j++) {
        const k3rt_param_decl *d = rig_param(&mm->r, j);
        char name[160];
        if (mm->kind == K3RT_KIND_RESIDUAL) {
            if (d->layer != only_layer)
                continue;
            if (d->layer >= 0)
                snprintf(name, sizeof name, "layers.%d.residual.%s", d->layer, d->name);
            else
                snprintf(name, sizeof name, "residual.%s", d->name);
        } else {
            snprintf(name, sizeof name, "%s%s", mm->prefix, d->name);
        }
        K3RT_TRY(add_param(m, name, d, mi, j, err));
    }
    return K3RT_OK;
}

static int check_residual_layers(model *m, k3rt_error *err)
{
    model_module *mm = &m->mods[m->residual];
    for (int j = 0; j < rig_n_params(&mm->r); j++) {
        int l = rig_param(&mm->r, j)->layer;
        if (l < -1 || l >= m->n_layers)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: parameter %s claims layer %d of %d",
                             mm->r.where, rig_param(&mm->r, j)->name, l, m->n_layers);
    }
    return K3RT_OK;
}

static int create_layers(model *m, const json_t *doc, registry *reg, k3rt_error *err)
{
    const char *pattern = json_string_value(json_object_get(doc, "pattern"));
    const json_t *mixers = json_object_get(doc, "mixers");
    int dense_layers = (int)json_integer_value(json_object_get(doc, "dense_layers"));
    if (!pattern || (int)strlen(pattern) != m->n_layers || !json_is_object(mixers))
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: pattern must have one letter per layer "
                         "(%d) and mixers must be a table", m->n_layers);
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < m->n_layers; i++) {
        model_layer *L = &m->layers[i];
        char letter[2] = {pattern[i], 0}, where[96], prefix[64];
        const json_t *mix = json_object_get(mixers, letter);
        if (!mix)
            return k3rt_fail(err, K3RT_ERR_INVALID, "model: pattern letter '%s' at layer %d has "
                             "no entry in model.mixers", letter, i + 1);
        L->mixer_letter = pattern[i];
        k3rt_create_args args = base_args(m, i);
        snprintf(where, sizeof where, "layers.%d.mixer", i);
        snprintf(prefix, sizeof prefix, "layers.%d.mixer.", i);
        K3RT_TRY(add_module(m, reg, mix, K3RT_KIND_ATTENTION, i, where, prefix, &args,
                            &L->mixer, err));
        const json_t *ffn = json_object_get(doc, i < dense_layers ? "dense_ffn" : "ffn");
        snprintf(where, sizeof where, "layers.%d.ffn", i);
        snprintf(prefix, sizeof prefix, "layers.%d.ffn.", i);
        K3RT_TRY(add_module(m, reg, ffn, K3RT_KIND_MOE, i, where, prefix, &args, &L->ffn, err));
        L->experts = m->mods[L->ffn].r.experts;
        L->top_k = m->mods[L->ffn].r.top_k;
        L->balancer = -1;
    }
    return K3RT_OK;
}

int model_set_balancer(model *m, const json_t *spec, registry *reg, k3rt_error *err)
{
    for (int i = 0; i < m->n_layers; i++) {
        model_layer *L = &m->layers[i];
        if (L->experts == 0)
            continue;
        k3rt_create_args args = base_args(m, i);
        args.n_experts = L->experts;
        args.top_k = L->top_k;
        char where[96];
        snprintf(where, sizeof where, "layers.%d.balancer", i);
        if (L->balancer >= 0) {
            /* Replace in place: module indices of everything else stay valid. */
            model_module *mm = &m->mods[L->balancer];
            const plugin_entry *e;
            K3RT_TRY(model_resolve_spec(reg, spec, K3RT_KIND_BALANCER, where, &e, err));
            rig fresh;
            K3RT_TRY(rig_create(&fresh, e, json_object_get(spec, "config"), &args, where, err));
            rig_destroy(&mm->r);
            mm->r = fresh;
        } else {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "layers.%d.balancer.", i);
            K3RT_TRY(add_module(m, reg, spec, K3RT_KIND_BALANCER, i, where, prefix, &args,
                                &L->balancer, err));
        }
    }
    return K3RT_OK;
}

static int collect_params(model *m, k3rt_error *err)
{
    k3rt_param_decl d = own_decl(K3RT_ROLE_EMBEDDING, m->vocab, m->d, K3RT_INIT_NORMAL,
                                 m->init_std);
    K3RT_TRY(add_param(m, "embed.weight", &d, -1, 0, err));
    m->embed = m->n_params - 1;
    for (int i = 0; i < m->n_layers; i++) {
        char name[160];
        k3rt_param_decl g = own_decl(K3RT_ROLE_NORM_GAIN, m->d, 0, K3RT_INIT_ONES, 0);
        snprintf(name, sizeof name, "layers.%d.mixer_norm.weight", i);
        K3RT_TRY(add_param(m, name, &g, -1, 0, err));
        m->layers[i].mixer_norm = m->n_params - 1;
        K3RT_TRY(add_module_params(m, m->layers[i].mixer, 0, err));
        snprintf(name, sizeof name, "layers.%d.ffn_norm.weight", i);
        K3RT_TRY(add_param(m, name, &g, -1, 0, err));
        m->layers[i].ffn_norm = m->n_params - 1;
        K3RT_TRY(add_module_params(m, m->layers[i].ffn, 0, err));
        K3RT_TRY(add_module_params(m, m->residual, i, err));
    }
    K3RT_TRY(add_module_params(m, m->residual, -1, err));
    k3rt_param_decl g = own_decl(K3RT_ROLE_NORM_GAIN, m->d, 0, K3RT_INIT_ONES, 0);
    K3RT_TRY(add_param(m, "norm.weight", &g, -1, 0, err));
    m->final_norm = m->n_params - 1;
    k3rt_param_decl h = own_decl(K3RT_ROLE_OUTPUT_HEAD, m->vocab, m->d, K3RT_INIT_NORMAL,
                                 m->init_std);
    K3RT_TRY(add_param(m, "head.weight", &h, -1, 0, err));
    m->head = m->n_params - 1;
    return K3RT_OK;
}

/* One buffer for all master weights, one for all gradients (and one for the bf16 compute
 * copies); views per slot and per module. */
static int allocate_params(model *m, k3rt_error *err)
{
    int64_t total = 0;
    int bad = 0;
    for (int i = 0; i < m->n_params; i++) {
        param_slot *p = &m->params[i];
        p->offset = total;
        /* Align each parameter to 16 elements so vector loads never straddle two. */
        total = ck_add(&bad, total, ck_align(&bad, p->numel, 16));
    }
    ck_mul(&bad, total, (int64_t)(m->master_elem > m->elem ? m->master_elem : m->elem));
    if (bad)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: %d parameters are too large together "
                         "(their byte count does not fit 64 bits); reduce the model's sizes",
                         m->n_params);
    m->total_numel = total;
    size_t master_bytes = (size_t)total * m->master_elem;
    m->param_buf = k3rt_alloc(m->opt.device, master_bytes, err);
    m->grad_buf = m->param_buf ? k3rt_alloc(m->opt.device, master_bytes, err) : NULL;
    if (m->grad_buf && m->opt.dtype != m->master_dtype)
        m->compute_buf = k3rt_alloc(m->opt.device, (size_t)total * m->elem, err);
    if (!m->param_buf || !m->grad_buf || (m->opt.dtype != m->master_dtype && !m->compute_buf))
        return err ? err->code : K3RT_ERR_NOMEM;
    K3RT_TRY(k3rt_memset(m->opt.stream, m->param_buf, m->opt.device, 0, master_bytes, err));
    K3RT_TRY(k3rt_memset(m->opt.stream, m->grad_buf, m->opt.device, 0, master_bytes, err));
    for (int i = 0; i < m->n_params; i++) {
        param_slot *p = &m->params[i];
        k3rt_tensor t = k3rt_tensor_view((char *)m->param_buf + p->offset * (int64_t)m->master_elem,
                                         m->master_dtype, m->opt.device, p->decl.ndim,
                                         p->decl.shape[0], p->decl.shape[1], p->decl.shape[2],
                                         p->decl.shape[3]);
        p->master = t;
        t.data = (char *)m->grad_buf + p->offset * (int64_t)m->master_elem;
        p->grad = t;
        p->param = p->master;
        if (m->compute_buf) {
            p->param.data = (char *)m->compute_buf + p->offset * (int64_t)m->elem;
            p->param.dtype = m->opt.dtype;
        }
    }
    for (int mi = 0; mi < m->n_mods; mi++) {
        model_module *mm = &m->mods[mi];
        int n = rig_n_params(&mm->r);
        mm->n_params = n;
        mm->params = calloc((size_t)n + 1, sizeof(k3rt_tensor));
        mm->grads = calloc((size_t)n + 1, sizeof(k3rt_tensor));
        if (!mm->params || !mm->grads)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    }
    for (int i = 0; i < m->n_params; i++) {
        param_slot *p = &m->params[i];
        if (p->module < 0)
            continue;
        m->mods[p->module].params[p->index] = p->param;
        m->mods[p->module].grads[p->index] = p->grad;
    }
    for (int mi = 0; mi < m->n_mods; mi++)
        K3RT_TRY(rig_bind_params(&m->mods[mi].r, m->mods[mi].params, m->mods[mi].grads, err));
    return K3RT_OK;
}

static int init_params(model *m, k3rt_error *err)
{
    for (int i = 0; i < m->n_params; i++) {
        param_slot *p = &m->params[i];
        rig *owner = p->module >= 0 ? &m->mods[p->module].r : NULL;
        k3rt_tensor host = p->master;
        void *staging = NULL;
        if (m->opt.device != K3RT_DEVICE_CPU) {
            staging = malloc((size_t)p->numel * m->master_elem);
            if (!staging)
                return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
            host.data = staging;
            host.device = K3RT_DEVICE_CPU;
        }
        int rc = param_init_values(&p->decl, host, m->opt.seed, p->name, owner, err);
        if (!rc && staging)
            rc = k3rt_memcpy(m->opt.stream, p->master.data, m->opt.device, staging,
                             K3RT_DEVICE_CPU, (size_t)p->numel * m->master_elem, err);
        /* Copies from pageable memory may return before the copy is done: wait before the
         * staging buffer goes. */
        if (!rc && staging)
            rc = k3rt_stream_sync(m->opt.stream, err);
        free(staging);
        if (rc)
            return rc;
    }
    K3RT_TRY(model_sync_compute(m, err));
    return k3rt_stream_sync(m->opt.stream, err);
}

static int read_scalars(model *m, const json_t *doc, k3rt_error *err)
{
    m->d = json_integer_value(json_object_get(doc, "d_model"));
    m->vocab = json_integer_value(json_object_get(doc, "vocab"));
    m->n_layers = (int)json_integer_value(json_object_get(doc, "layers"));
    m->norm_eps = json_number_value(json_object_get(doc, "norm_eps"));
    m->init_std = json_number_value(json_object_get(doc, "init_std"));
    if (m->d < 1 || m->vocab < 2 || m->n_layers < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: d_model, vocab and layers must be "
                         "positive (got %lld, %lld, %d)", (long long)m->d,
                         (long long)m->vocab, m->n_layers);
    if (!(m->norm_eps > 0))
        m->norm_eps = 1e-5;
    if (!(m->init_std > 0))
        m->init_std = 0.02;
    return K3RT_OK;
}

static int alloc_routed(model *m, k3rt_error *err)
{
    m->routed = calloc((size_t)m->n_layers, sizeof *m->routed);
    m->routed_at = calloc((size_t)m->n_layers, sizeof *m->routed_at);
    if (!m->routed || !m->routed_at)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].experts) {
            m->routed[i] = calloc((size_t)m->layers[i].experts, sizeof(int64_t));
            if (!m->routed[i])
                return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
            m->routed_at[i] = m->routed_width;
            m->routed_width += m->layers[i].experts;
        }
    if (m->opt.device == K3RT_DEVICE_CPU || m->routed_width == 0)
        return K3RT_OK;
    size_t bytes = (size_t)(1 + MODEL_ROUTED_SLOTS * m->routed_width) * sizeof(int64_t);
    m->aux_stage = k3rt_alloc(m->opt.device, bytes, err);
    if (!m->aux_stage)
        return err->code;
    m->routed_stage = (int64_t *)(m->aux_stage + 1);  /* the slots follow the one double */
    return K3RT_OK;
}

void model_reset_routed(model *m)
{
    for (int i = 0; i < m->n_layers; i++)
        if (m->routed[i])
            memset(m->routed[i], 0, (size_t)m->layers[i].experts * sizeof(int64_t));
    m->routed_used = 0;
    m->aux_loss = 0;
}

int model_flush_routed(model *m, k3rt_error *err)
{
    if (!m->routed_used)
        return K3RT_OK;
    /* one copy of the staged auxiliary loss and the used slots behind it */
    int64_t n = 1 + m->routed_used * m->routed_width, *h = malloc((size_t)n * sizeof *h);
    if (!h)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    int rc = k3rt_memcpy(m->opt.stream, h, K3RT_DEVICE_CPU, m->aux_stage, m->opt.device,
                         (size_t)n * sizeof *h, err);
    if (!rc)
        rc = k3rt_stream_sync(m->opt.stream, err);
    if (!rc) {
        double aux;
        memcpy(&aux, h, sizeof aux);
        m->aux_loss += aux;
    }
    for (int s = 0; !rc && s < m->routed_used; s++)
        for (int i = 0; i < m->n_layers; i++)
            for (int64_t e = 0; m->routed[i] && e < m->layers[i].experts; e++)
                m->routed[i][e] += h[1 + s * m->routed_width + m->routed_at[i] + e];
    free(h);
    m->routed_used = 0;
    return rc;
}

int model_declare(model *m, const json_t *doc, registry *reg, const model_options *opt,
                  k3rt_error *err)
{
    memset(m, 0, sizeof *m);
    m->opt = *opt;
    m->residual = -1;
    m->elem = k3rt_dtype_size(opt->dtype);
    int cpu = opt->device == K3RT_DEVICE_CPU;
    if (cpu ? opt->dtype != K3RT_F32 && opt->dtype != K3RT_F64
            : opt->dtype != K3RT_F32 && opt->dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "model: compute dtype %s is not supported "
                         "on the %s (%s)", k3rt_dtype_name(opt->dtype), cpu ? "CPU" : "GPU",
                         cpu ? "f32, or f64 for tests" : "bf16 or f32");
    m->master_dtype = opt->dtype == K3RT_BF16 ? K3RT_F32 : opt->dtype;
    m->master_elem = k3rt_dtype_size(m->master_dtype);
    int rc = read_scalars(m, doc, err);
    if (!rc)
        rc = create_layers(m, doc, reg, err);
    if (!rc) {
        k3rt_create_args args = base_args(m, -1);
        rc = add_module(m, reg, json_object_get(doc, "residual"), K3RT_KIND_RESIDUAL, -1,
                        "residual", "residual.", &args, &m->residual, err);
    }
    if (!rc)
        rc = check_residual_layers(m, err);
    if (!rc)
        rc = model_set_balancer(m, json_object_get(doc, "balancer"), reg, err);
    if (!rc)
        rc = collect_params(m, err);
    for (int i = 0; !rc && i < m->n_params; i++)
        m->params[i].decl.name = m->params[i].name;  /* the array no longer moves */
    if (rc)
        model_free(m);
    return rc;
}

int model_build(model *m, const json_t *doc, registry *reg, const model_options *opt,
                k3rt_error *err)
{
    K3RT_TRY(model_declare(m, doc, reg, opt, err));
    int rc = allocate_params(m, err);
    if (!rc)
        rc = init_params(m, err);
    if (!rc)
        rc = alloc_routed(m, err);
    if (rc)
        model_free(m);
    return rc;
}

void model_free(model *m)
{
    model_decode_end(m);
    model_free_acts(m);
    for (int i = 0; i < m->n_mods; i++) {
        rig_destroy(&m->mods[i].r);
        free(m->mods[i].params);
        free(m->mods[i].grads);
    }
    free(m->mods);
    if (m->routed)
        for (int i = 0; i < m->n_layers; i++)
            free(m->routed[i]);
    free(m->routed);
    free(m->routed_at);
    k3rt_free(m->opt.device, m->aux_stage);  /* routed_stage lies inside it */
    free(m->layers);
    free(m->params);
    k3rt_free(m->opt.device, m->param_buf);
    k3rt_free(m->opt.device, m->grad_buf);
    k3rt_free(m->opt.device, m->compute_buf);
    memset(m, 0, sizeof *m);
}

int model_find_param(const model *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name))
            return i;
    return -1;
}

rig *model_balancer(model *m, int layer)
{
    int b = m->layers[layer].balancer;
    return b >= 0 ? &m->mods[b].r : NULL;
}

void model_zero_grads(model *m)
{
    k3rt_memset(m->opt.stream, m->grad_buf, m->opt.device, 0,
                (size_t)m->total_numel * m->master_elem, NULL);
}

int model_sync_compute(model *m, k3rt_error *err)
{
    if (!m->compute_buf)
        return K3RT_OK;
    return k3rt_cast(m->opt.stream, m->param_buf, m->master_dtype, m->compute_buf, m->opt.dtype,
                     m->total_numel, err);
}

int64_t model_param_active(const model *m, int i)
{
    const param_slot *p = &m->params[i];
    if (p->decl.role == K3RT_ROLE_EMBEDDING)
        return 0;  /* a lookup, not a matrix product */
    if (p->decl.role == K3RT_ROLE_EXPERT_MATRIX && p->module >= 0) {
        const model_layer *L = &m->layers[m->mods[p->module].layer];
        return p->numel / p->decl.experts * L->top_k;
    }
    return p->numel;
}

void model_param_counts(const model *m, int64_t *total, int64_t *active)
{
    int64_t t = 0, a = 0;
    for (int i = 0; i < m->n_params; i++) {
        t += m->params[i].numel;
        a += model_param_active(m, i);
    }
    if (total)
        *total = t;
    if (active)
        *active = a;
}
