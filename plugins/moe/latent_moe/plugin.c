/* latent_moe: Stable LatentMoE as in Kimi K3 — descriptor, options, parameters, FLOP and memory
 * counts. Math: spec moe_balance_attnres.md §1–§2; forward and backward in moe.c.
 *
 * Per token x (the FFN sublayer's normed input, width d):
 *   s = sigmoid(Wr x)  (E scores, full width)        selection = top-k(s + b), b from the balancer
 *   p_j = routed_scaling * s_j / sum_{chosen} s      (renormalize; else routed_scaling * s_j)
 *   c = Wdown x  (latent l)   ->   y_j = Wd_j glu(Wg_j c, Wu_j c)   for the k chosen experts
 *   U = sum_j p_j y_j   ->   n = RMSNorm(U) (latent_norm; off = NVIDIA's LatentMoE)   ->   Wup n
 *   + the shared experts at full width: Wsd glu(Wsg x, Wsu x), `shared` of them fused.
 *
 * routed_scaling is DeepSeek's routed_scaling_factor: a constant factor on every gate weight.
 * With the latent norm it cancels in the forward (RMSNorm(cU) = RMSNorm(U) up to the norm's
 * eps; exactly at eps = 0) and only matters without it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "latent_moe.h"

static const k3rt_option options[] = {
    {"experts", K3RT_OPT_INT, 0, "64", 1, 1 << 20, NULL, "routed experts E"},
    {"top_k", K3RT_OPT_INT, 0, "8", 1, 1 << 16, NULL, "experts per token k (<= experts)"},
    {"latent", K3RT_OPT_INT, 0, "0", 0, 1 << 20, NULL,
     "latent width l the routed experts work in; 0 = d_model/2 (K3: 3584 at d 7168)"},
    {"expert_hidden", K3RT_OPT_INT, 0, "0", 0, 1 << 20, NULL,
     "hidden width m of a routed expert; 0 = latent"},
    {"shared", K3RT_OPT_INT, 0, "2", 0, 1024, NULL,
     "shared experts at full width, stored fused (K3: 2)"},
    {"shared_hidden", K3RT_OPT_INT, 0, "0", 0, 1 << 20, NULL,
     "hidden width of one shared expert; 0 = expert_hidden"},
    {"act", K3RT_OPT_STRING, 0, "\"situ\"", K3RT_RANGE_ANY, "situ|swiglu",
     "situ: beta1*tanh(g/beta1)*sigmoid(g) * beta2*tanh(u/beta2) (K3); swiglu: silu(g)*u"},
    {"beta1", K3RT_OPT_FLOAT, 0, "4.0", K3RT_RANGE_ANY, NULL, "SiTU gate cap (> 0)"},
    {"beta2", K3RT_OPT_FLOAT, 0, "25.0", K3RT_RANGE_ANY, NULL, "SiTU up-branch cap (> 0)"},
    {"latent_norm", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "RMSNorm over the combined latent output (K3's Stable LatentMoE); false = NVIDIA's "
     "original LatentMoE"},
    {"norm_eps", K3RT_OPT_FLOAT, 0, "1e-5", 0, 1, NULL, "epsilon of the latent RMSNorm"},
    {"renormalize", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "gate weights = scores renormalised over the chosen k (K3 moe_renormalize)"},
    {"routed_scaling", K3RT_OPT_FLOAT, 0, "1.0", 1e-6, 1e6, NULL,
     "routed_scaling_factor: multiplies every gate weight (K3 1.0); cancels in the forward "
     "under the latent norm"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 10, NULL,
     "std of the normal init of the router and the shared experts' gate/up; the two matrices "
     "that write into the residual stream (routed_up_proj, shared down_proj) use "
     "init_std/sqrt(2*n_layers)"},
    {"latent_init_std", K3RT_OPT_FLOAT, 0, "0", 0, 10, NULL,
     "std of the normal init of the routed path before the latent norm (routed_down_proj and "
     "the expert matrices); 0 = 1/sqrt(fan_in) of each, so the combined output reaches the norm "
     "at O(1) scale instead of far below its eps"},
    {"overlap_shared", K3RT_OPT_BOOL, 0, "true", K3RT_RANGE_ANY, NULL,
     "on CUDA, run the shared experts on a second stream beside the routed ones (the same "
     "numbers either way); false = one stream"},
};

static int fail_key(k3rt_error *err, const char *key, const char *why, long long got)
{
    return k3rt_fail(err, K3RT_ERR_INVALID, "latent_moe: key '%s' %s, got %lld", key, why, got);
}

static int lmoe_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    if (a->d_model < 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "latent_moe: d_model must be >= 2, got %lld",
                         (long long)a->d_model);
    const k3rt_config *cfg = a->config;
    int64_t E = k3rt_cfg_int(cfg, "experts"), k = k3rt_cfg_int(cfg, "top_k");
    if (k > E)
        return fail_key(err, "top_k", "must be <= experts", (long long)k);
    double b1 = k3rt_cfg_float(cfg, "beta1"), b2 = k3rt_cfg_float(cfg, "beta2");
    if (!(b1 > 0) || !(b2 > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "latent_moe: key '%s' must be > 0, got %g",
                         b1 > 0 ? "beta2" : "beta1", b1 > 0 ? b2 : b1);
    latent_moe *f = calloc(1, sizeof *f);
    if (!f)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "latent_moe: out of memory");
    f->dtype = a->dtype;
    f->device = a->device;
    f->d = a->d_model;
    f->E = E, f->k = k;
    f->l = k3rt_cfg_int(cfg, "latent");
    if (f->l == 0)
        f->l = f->d / 2;
    f->m = k3rt_cfg_int(cfg, "expert_hidden");
    if (f->m == 0)
        f->m = f->l;
    int64_t hs = k3rt_cfg_int(cfg, "shared_hidden");
    f->Hs = k3rt_cfg_int(cfg, "shared") * (hs ? hs : f->m);
    f->glu = strcmp(k3rt_cfg_string(cfg, "act"), "swiglu") ? K3RT_GLU_SITU : K3RT_GLU_SWIGLU;
    f->beta1 = b1, f->beta2 = b2;
    f->latent_norm = k3rt_cfg_bool(cfg, "latent_norm");
    f->norm_eps = k3rt_cfg_float(cfg, "norm_eps");
    f->renormalize = k3rt_cfg_bool(cfg, "renormalize");
    f->rscale = k3rt_cfg_float(cfg, "routed_scaling");
    f->init_std = k3rt_cfg_float(cfg, "init_std");
    f->latent_std = k3rt_cfg_float(cfg, "latent_init_std");
    f->out_std = f->init_std / sqrt(2.0 * (a->n_layers > 0 ? a->n_layers : 1));
    int n = 0;
    for (int i = 0; i < LMOE_N_SLOTS; i++) {
        int present = i == LMOE_NORM ? f->latent_norm
                    : i >= LMOE_SH_GATE ? f->Hs > 0 : 1;
        f->slot[i] = present ? n++ : -1;
    }
    f->n_params = n;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (f->device != K3RT_DEVICE_CPU) {
        int rc = lmoe_gpu_check(f, err);
        if (!rc)
            rc = lmoe_gpu_create(f, k3rt_cfg_bool(cfg, "overlap_shared"), err);
        if (rc) {
            lmoe_gpu_destroy(f);
            free(f);
            return rc;
        }
    }
#endif
    *self = f;
    return K3RT_OK;
}

static void lmoe_destroy(void *self)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (self)
        lmoe_gpu_destroy(self);
#endif
    free(self);
}

/* With init_std everywhere (0.02) the routed path is four small matrices in a row and the
 * combined output U reaches the latent norm with mean square far below its eps, where the norm
 * is a fixed gain of eps^-1/2 rather than a normalisation (spec §1 pitfalls). Fan-in scaling
 * keeps every stage at O(1), as the K3 reimplementations' Kaiming-style inits do. */
static double latent_std(const latent_moe *f, int64_t fan_in)
{
    return f->latent_std > 0 ? f->latent_std : 1.0 / sqrt((double)fan_in);
}

static k3rt_param_decl decl_of(const latent_moe *f, int slot)
{
    k3rt_param_decl p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.role = K3RT_ROLE_MATRIX;
    p.ndim = 2;
    p.init = K3RT_INIT_NORMAL;
    p.init_a = f->init_std;
    p.layer = -1;
    switch (slot) {
    case LMOE_ROUTER:
        p.name = "router.weight", p.role = K3RT_ROLE_ROUTER, p.experts = (int32_t)f->E;
        p.shape[0] = f->E, p.shape[1] = f->d;
        break;
    case LMOE_DOWN:
        p.name = "routed_down_proj.weight", p.shape[0] = f->l, p.shape[1] = f->d;
        p.init_a = latent_std(f, f->d);
        break;
    case LMOE_EX_GATE:
    case LMOE_EX_UP:
    case LMOE_EX_DOWN:
        p.name = slot == LMOE_EX_GATE ? "experts.gate_proj.weight"
               : slot == LMOE_EX_UP   ? "experts.up_proj.weight"
                                    : "experts.down_proj.weight";
        p.role = K3RT_ROLE_EXPERT_MATRIX, p.experts = (int32_t)f->E, p.ndim = 3;
        p.shape[0] = f->E;
        p.shape[1] = slot == LMOE_EX_DOWN ? f->l : f->m;
        p.shape[2] = slot == LMOE_EX_DOWN ? f->m : f->l;
        p.init_a = latent_std(f, p.shape[2]);
        break;
    case LMOE_NORM:
        p.name = "routed_norm.weight", p.role = K3RT_ROLE_NORM_GAIN, p.ndim = 1;
        p.shape[0] = f->l, p.init = K3RT_INIT_ONES, p.init_a = 0;
        break;
    case LMOE_UP:
        p.name = "routed_up_proj.weight", p.shape[0] = f->d, p.shape[1] = f->l;
        p.init_a = f->out_std;
        break;
    case LMOE_SH_GATE:
    case LMOE_SH_UP:
        p.name = slot == LMOE_SH_GATE ? "shared_experts.gate_proj.weight"
                                    : "shared_experts.up_proj.weight";
        p.shape[0] = f->Hs, p.shape[1] = f->d;
        break;
    default: /* LMOE_SH_DOWN */
        p.name = "shared_experts.down_proj.weight", p.shape[0] = f->d, p.shape[1] = f->Hs;
        p.init_a = f->out_std;
        break;
    }
    return p;
}

static int lmoe_declare(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const latent_moe *f = self;
    for (int i = 0; i < LMOE_N_SLOTS; i++)
        if (f->slot[i] >= 0) {
            k3rt_param_decl p = decl_of(f, i);
            K3RT_TRY(k3rt_param_sink_add(sink, &p, err));
        }
    return K3RT_OK;
}

/* Model FLOPs of the active path, per token (matrix products only; the router's sigmoid and
 * top-k, the GLUs, the norm and the combine are O(E + k(l + m)) and left out):
 *   2 d E (router) + 2 d l (down) + 3 * 2 k l m (k experts) + 2 l d (up) + 3 * 2 d Hs (shared)
 * The backward is twice that: an input gradient and a weight gradient per product. */
static int lmoe_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const latent_moe *f = self;
    double N = (double)(batch * seq), d = (double)f->d, l = (double)f->l, m = (double)f->m;
    double per_token = 2 * d * (double)f->E + 4 * d * l + 6 * (double)f->k * l * m +
                       6 * d * (double)f->Hs;
    out->forward = N * per_token;
    out->backward = 2 * N * per_token;
    return K3RT_OK;
}

static int lmoe_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (((const latent_moe *)self)->device != K3RT_DEVICE_CPU) {
        lmoe_gpu_memory(self, batch * seq, out);
        return K3RT_OK;
    }
#endif
    lmoe_layout L;
    lmoe_layout_make(self, batch * seq, &L);
    out->saved_bytes = L.saved;
    out->workspace_bytes = L.workspace;
    out->state_bytes = 0;
    return K3RT_OK;
}

/* The saved parts (latent_moe.h): on the CPU the layout's run in eight parts, the inputs of
 * matrix products alone (c, glu(g, u), the shared glu) marked GEMM-only; on the GPU one part. */
static int lmoe_saved(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                      k3rt_error *err)
{
    const latent_moe *f = self;
    static const char *const names[LMOE_SAVED_N] = {
        "routing", "latent_in", "expert_gu", "expert_act", "expert_out", "latent_out",
        "shared_gu", "shared_act"};
    k3rt_saved_decl d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    k3rt_flops fl;
    lmoe_flops(self, batch, seq, &fl);
    d.recompute_flops = fl.forward;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (f->device != K3RT_DEVICE_CPU) {
        k3rt_memory mem;
        lmoe_gpu_memory(self, batch * seq, &mem);
        d.name = "saved";
        d.bytes = mem.saved_bytes;
        d.dtype = K3RT_DTYPE_INVALID;
        return k3rt_saved_sink_add(sink, &d, err);
    }
#endif
    lmoe_layout L;
    lmoe_layout_make(f, batch * seq, &L);
    for (int i = 0; i < LMOE_SAVED_N; i++) {
        int gemm = i == LMOE_SAVED_LATENT_IN || i == LMOE_SAVED_EXPERT_ACT ||
                   i == LMOE_SAVED_SHARED_ACT;
        d.name = names[i];
        d.bytes = L.part_end[i] - (i ? L.part_end[i - 1] : 0);
        d.dtype = i == LMOE_SAVED_ROUTING ? K3RT_DTYPE_INVALID : f->dtype;
        d.flags = K3RT_SAVED_RECOMPUTE | (gemm ? K3RT_SAVED_GEMM_ONLY : 0);
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

static int lmoe_experts(void *self, int32_t *n_experts, int32_t *top_k)
{
    const latent_moe *f = self;
    *n_experts = (int32_t)f->E;
    *top_k = (int32_t)f->k;
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = lmoe_create,
    .destroy = lmoe_destroy,
    .declare_params = lmoe_declare,
    .flops = lmoe_flops,
    .memory = lmoe_memory,
    .saved = lmoe_saved,
};

/* The device decides the path: moe.c on the CPU, cuda.c on the GPU (both over moe.c's shared
 * output half, so neither file calls the other's entry points). */
static int lmoe_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (((const latent_moe *)self)->device != K3RT_DEVICE_CPU)
        return lmoe_gpu_forward(self, a, err);
#endif
    return lmoe_cpu_forward(self, a, err);
}

static int lmoe_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (((const latent_moe *)self)->device != K3RT_DEVICE_CPU)
        return lmoe_gpu_backward(self, a, err);
#endif
    return lmoe_cpu_backward(self, a, err);
}

static const k3rt_moe_vtable moe = {
    .struct_size = sizeof(k3rt_moe_vtable),
    .forward = lmoe_forward,
    .backward = lmoe_backward,
    .experts = lmoe_experts,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "latent_moe",
    .kind = K3RT_KIND_MOE,
    .version = "1.0.0",
    .description = "Stable LatentMoE (K3): sigmoid router, experts in a latent space with a "
                   "latent RMSNorm, shared experts; dropless",
#ifdef K3RT_PLUGIN_HAVE_CUDA
    .caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#else
    .caps = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC,
#endif
    .options = options,
    .n_options = sizeof options / sizeof options[0],
    .option_size = sizeof(k3rt_option),
    .instance = &instance,
    .vtable = &moe,
};

K3RT_PLUGIN_EXPORT(descriptor)
