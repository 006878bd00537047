/* per_head_muon: descriptor, options, state allocation and checkpointed state.
 *
 * Muon (Keller Jordan) with Moonlight's RMS matching, per-head orthogonalisation (Kimi K3
 * §2.5) and QK-clip (Kimi K2), with an internal AdamW group for the parameters Muon does not
 * serve. Defaults are pinned here because implementations differ (see README.md): EMA
 * momentum 0.95 with Nesterov, 5 quintic Newton-Schulz steps (3.4445, -4.7750, 2.0315), update
 * 0.2 * sqrt(max(rows, cols)) * O per block with decoupled decay 0.1, AdamW betas (0.9, 0.95),
 * eps 1e-8, decay 0.1 on embedding / output head / router, QK-clip on at tau = 100. */
#include "muon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const k3rt_option options[] = {
    {"momentum", K3RT_OPT_FLOAT, 0, "0.95", 0, 1, NULL,
     "EMA momentum beta of the Muon group, in [0, 1): m = beta m + (1 - beta) g"},
    {"nesterov", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "orthogonalise (1 - beta) g + beta m instead of m"},
    {"ns_steps", K3RT_OPT_INT, 0, "5", 1, 100, NULL,
     "Newton-Schulz steps of the quintic (3.4445, -4.7750, 2.0315) (pinned coefficients)"},
    {"ns_precision", K3RT_OPT_STRING, 0, "\"auto\"", K3RT_RANGE_ANY, "auto|bf16|full",
     "Newton-Schulz arithmetic: bf16 (bf16 operands, fp32 accumulation, each product stored "
     "in bf16: the tensor cores on CUDA, emulated on the CPU), full (the parameters' dtype; "
     "fp32 without TF32 on CUDA), auto (bf16 on CUDA, full on the CPU)"},
    {"scale", K3RT_OPT_FLOAT, 0, "0.2", 0, 100, NULL,
     "a Muon block's update is lr * scale * sqrt(max(rows, cols)) * O: RMS about scale, "
     "like AdamW, so one lr serves both groups"},
    {"weight_decay", K3RT_OPT_FLOAT, 0, "0.1", 0, 100, NULL,
     "decoupled decay W *= 1 - lr*wd of the Muon group (matrix, head_matrix, expert_matrix)"},
    {"per_head", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "orthogonalise each head's block of a head_matrix alone; false: whole matrices "
     "(plain Muon; experts stay per expert)"},
    {"adamw_beta1", K3RT_OPT_FLOAT, 0, "0.9", 0, 1, NULL,
     "AdamW group (embedding, output_head, router, norm_gain, vector, conv): first-moment "
     "decay, in [0, 1)"},
    {"adamw_beta2", K3RT_OPT_FLOAT, 0, "0.95", 0, 1, NULL,
     "AdamW group: second-moment decay, in [0, 1)"},
    {"adamw_eps", K3RT_OPT_FLOAT, 0, "1e-8", 0, 1, NULL, "AdamW group: added to sqrt(v_hat), > 0"},
    {"adamw_weight_decay", K3RT_OPT_FLOAT, 0, "0.1", 0, 100, NULL,
     "AdamW group: decoupled decay of embedding, output_head and router (never norm_gain, "
     "vector or conv)"},
    {"qk_clip", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "after the step, rescale a head's query/key weights when its max logit exceeds qk_tau "
     "(parameters whose owner declares qk_clip, e.g. MLA)"},
    {"qk_tau", K3RT_OPT_FLOAT, 0, "100", 0, 1e9, NULL,
     "QK-clip threshold tau on the max pre-softmax logit (softmax scale included), > 0"},
};

static void muon_destroy(void *self)
{
    muon *o = self;
    if (!o)
        return;
    for (int32_t i = 0; i < o->n; i++) {
        k3rt_free(o->device, o->p[i].state);
        free(o->p[i].name);
    }
#ifdef K3RT_PLUGIN_HAVE_CUDA
    muon_gpu_destroy(o);
#endif
    free(o->p);
    free(o->adamw_index);
    free(o->aw_w), free(o->aw_g), free(o->aw_m), free(o->aw_v), free(o->aw_n), free(o->aw_wd);
    free(o->jobs);
    free(o->scratch);
    free(o);
}

static size_t aligned_bytes(int64_t n, int dtype)
{
    return ((size_t)n * k3rt_dtype_size(dtype) + 63) & ~(size_t)63;
}

/* Copies ref's name, routes it and allocates its zeroed state. */
static int add_param(muon *o, const k3rt_param_ref *ref, k3rt_stream *s, muon_param *p,
                     k3rt_error *err)
{
    const char *name = ref->name;
    size_t len = strlen(name) + 1;
    p->name = malloc(len);
    if (!p->name)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    memcpy(p->name, name, len);
    K3RT_TRY(muon_route(o, ref, p, err));
    p->n = k3rt_tensor_numel(&ref->param);
    size_t one = aligned_bytes(p->n, o->dtype);
    size_t bytes = p->rule == MUON_RULE_MUON ? one : 2 * one;
    p->state = k3rt_alloc(o->device, bytes, err);
    if (!p->state)
        return k3rt_error_prefix(err, "per_head_muon: state of %s: ", name);
    p->v = p->rule == MUON_RULE_ADAMW ? (char *)p->state + one : NULL;
    return k3rt_memset(s, p->state, o->device, 0, bytes, err);
}

static int read_options(muon *o, const k3rt_config *c, k3rt_error *err)
{
    const char *prec = k3rt_cfg_string(c, "ns_precision");
    prec = prec ? prec : "auto";
    o->ns_bf16 = !strcmp(prec, "bf16") || (!strcmp(prec, "auto") && o->device != K3RT_DEVICE_CPU);
    o->momentum = k3rt_cfg_float(c, "momentum");
    o->nesterov = k3rt_cfg_bool(c, "nesterov");
    o->ns_steps = (int)k3rt_cfg_int(c, "ns_steps");
    o->scale = k3rt_cfg_float(c, "scale");
    o->weight_decay = k3rt_cfg_float(c, "weight_decay");
    o->per_head = k3rt_cfg_bool(c, "per_head");
    o->beta1 = k3rt_cfg_float(c, "adamw_beta1");
    o->beta2 = k3rt_cfg_float(c, "adamw_beta2");
    o->eps = k3rt_cfg_float(c, "adamw_eps");
    o->adamw_weight_decay = k3rt_cfg_float(c, "adamw_weight_decay");
    o->qk_clip = k3rt_cfg_bool(c, "qk_clip");
    o->qk_tau = k3rt_cfg_float(c, "qk_tau");
    const char *key = o->momentum >= 1 ? "momentum" : o->beta1 >= 1 ? "adamw_beta1"
                      : o->beta2 >= 1 ? "adamw_beta2" : NULL;
    if (key)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: key '%s' must be < 1, got %g",
                         key, k3rt_cfg_float(c, key));
    if (!(o->eps > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: key 'adamw_eps' must be > 0, "
                         "got %g", o->eps);
    if (!(o->qk_tau > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: key 'qk_tau' must be > 0, got "
                         "%g", o->qk_tau);
    return K3RT_OK;
}

static int muon_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    /* the CUDA step keeps f32 master weights and state, as adamw does */
    if (a->device != K3RT_DEVICE_CPU && a->dtype != K3RT_F32)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "per_head_muon: master weights on CUDA must "
                         "be f32, not %s", k3rt_dtype_name(a->dtype));
    muon *o = calloc(1, sizeof *o);
    if (!o)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    o->device = a->device;
    o->dtype = a->dtype;
    int rc = read_options(o, a->config, err);
    if (!rc) {
        o->p = calloc((size_t)a->n_params + 1, sizeof *o->p);
        if (!o->p)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    }
    for (int32_t i = 0; !rc && i < a->n_params; i++) {
        o->n = i + 1;  /* so destroy frees what this iteration allocated */
        rc = add_param(o, &a->params[i], a->stream, &o->p[i], err);
    }
    if (!rc)
        rc = muon_plan_jobs(o, err);
    if (!rc)
        rc = muon_adamw_plan(o, err);
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (!rc && o->device != K3RT_DEVICE_CPU)
        rc = muon_gpu_create(o, a->stream, err);
#endif
    if (rc) {
        muon_destroy(o);
        return rc;
    }
    *self = o;
    return K3RT_OK;
}

static int muon_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    (void)batch, (void)seq;
    const muon *o = self;
    int64_t es = (int64_t)k3rt_dtype_size(o->dtype);
    out->saved_bytes = 0;
    /* Newton-Schulz scratch of the largest block, one per CPU thread of the step's stream;
     * counted for one thread, as the stream's thread count is not known here. */
    out->workspace_bytes = o->slot_elems * es;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (o->device != K3RT_DEVICE_CPU)  /* the arenas of every block at once */
        out->workspace_bytes = muon_gpu_workspace_bytes(o);
#endif
    out->state_bytes = 0;
    for (int32_t i = 0; i < o->n; i++)
        out->state_bytes += (o->p[i].rule == MUON_RULE_MUON ? 1 : 2) * o->p[i].n * es;
    return K3RT_OK;
}

/* The live state: "<param>.momentum" (Muon group), "<param>.m" and "<param>.v" (AdamW
 * group), and the step counter "step" [1] i64 (host). */
static int muon_state(void *self, k3rt_tensor_sink *sink, k3rt_error *err)
{
    muon *o = self;
    char name[512];
    for (int32_t i = 0; i < o->n; i++) {
        const muon_param *p = &o->p[i];
        k3rt_tensor t = k3rt_tensor_view(p->state, o->dtype, o->device, 1, p->n, 0, 0, 0);
        snprintf(name, sizeof name, "%s.%s", p->name, p->rule == MUON_RULE_MUON ? "momentum"
                                                                                  : "m");
        K3RT_TRY(k3rt_tensor_sink_add(sink, name, t, K3RT_STAT_LOCAL, err));
        if (p->rule == MUON_RULE_ADAMW) {
            t.data = p->v;
            snprintf(name, sizeof name, "%s.v", p->name);
            K3RT_TRY(k3rt_tensor_sink_add(sink, name, t, K3RT_STAT_LOCAL, err));
        }
    }
    k3rt_tensor step = k3rt_tensor_view(&o->step, K3RT_I64, K3RT_DEVICE_CPU, 1, 1, 0, 0, 0);
    return k3rt_tensor_sink_add(sink, "step", step, K3RT_STAT_LOCAL, err);
}

static int muon_state_loaded(void *self, k3rt_error *err)
{
    const muon *o = self;
    if (o->step < 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "per_head_muon: loaded step counter is %lld "
                         "(expected >= 0)", (long long)o->step);
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = muon_create,
    .destroy = muon_destroy,
    .memory = muon_memory,
    .state = muon_state,
    .state_loaded = muon_state_loaded,
};

/* The device decides the path: step.c on the CPU, cuda.c on the GPU (cuda.c reuses step.c's
 * AdamW group and QK-clip pieces; step.c never calls into cuda.c). */
static int muon_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err)
{
    muon *o = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (o->device != K3RT_DEVICE_CPU)
        K3RT_TRY(muon_gpu_step(o, a, err));
    else
#endif
        K3RT_TRY(muon_cpu_step(o, a, err));
    o->step = a->step;  /* the engine's count: it survives resumes that skip or repeat steps */
    return K3RT_OK;
}

static const k3rt_optimizer_vtable optimizer = {
    .struct_size = sizeof(k3rt_optimizer_vtable),
    .step = muon_step,
    .describe = muon_describe,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "per_head_muon",
    .kind = K3RT_KIND_OPTIMIZER,
    .version = "1.0.0",
    .description = "Muon with per-head/per-expert Newton-Schulz, RMS-matched update, QK-clip "
                   "and an AdamW group, chosen by parameter role",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &optimizer,
};

K3RT_PLUGIN_EXPORT(descriptor)
