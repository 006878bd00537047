/* dense_glu: descriptor, options, parameters, FLOP and memory counts. */
#include "dense_glu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const k3rt_option options[] = {
    {"hidden", K3RT_OPT_INT, 0, "0", 0, 1000000, NULL,
     "hidden width; 0 = ceil(8*d_model/3) rounded up to a multiple of 64 (the parameter count "
     "of a 4*d_model two-matrix MLP)"},
    {"act", K3RT_OPT_STRING, 0, "\"situ\"", K3RT_RANGE_ANY, "situ|swiglu",
     "situ: beta1*tanh(g/beta1)*sigmoid(g) * beta2*tanh(u/beta2) (K3); swiglu: silu(g)*u"},
    {"beta1", K3RT_OPT_FLOAT, 0, "4.0", K3RT_RANGE_ANY, NULL,
     "SiTU gate cap (> 0); used by act = situ only"},
    {"beta2", K3RT_OPT_FLOAT, 0, "25.0", K3RT_RANGE_ANY, NULL,
     "SiTU up-branch cap (> 0); used by act = situ only"},
    {"init_std", K3RT_OPT_FLOAT, 0, "0.02", 0, 10, NULL,
     "std of the normal init of gate/up; down uses init_std/sqrt(2*n_layers) (GPT-2)"},
};

int64_t dense_glu_hidden_bytes(const dense_glu *f, int64_t batch, int64_t seq)
{
    int64_t bytes = batch * seq * f->hidden * (int64_t)k3rt_dtype_size(f->dtype);
    return (bytes + 255) / 256 * 256;
}

static int64_t default_hidden(int64_t d)
{
    int64_t h = (8 * d + 2) / 3;
    return (h + 63) / 64 * 64;
}

static int glu_create(const k3rt_create_args *a, void **self, k3rt_error *err)
{
    const char *act = k3rt_cfg_string(a->config, "act");
    double b1 = k3rt_cfg_float(a->config, "beta1"), b2 = k3rt_cfg_float(a->config, "beta2");
    if (!(b1 > 0) || !(b2 > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "dense_glu: key '%s' must be > 0, got %g",
                         b1 > 0 ? "beta2" : "beta1", b1 > 0 ? b2 : b1);
    dense_glu *f = calloc(1, sizeof *f);
    if (!f)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "dense_glu: out of memory");
    f->dtype = a->dtype;
    f->device = a->device;
    f->d = a->d_model;
    f->hidden = k3rt_cfg_int(a->config, "hidden");
    if (f->hidden == 0)
        f->hidden = default_hidden(f->d);
    f->glu = strcmp(act, "swiglu") ? K3RT_GLU_SITU : K3RT_GLU_SWIGLU;
    f->beta1 = b1;
    f->beta2 = b2;
    f->init_std = k3rt_cfg_float(a->config, "init_std");
    /* Each layer adds two residual branches (mixer and FFN): GPT-2 scales the projections
     * that write into the stream so its variance does not grow with depth. */
    f->down_std = f->init_std / sqrt(2.0 * a->n_layers);
    *self = f;
    return K3RT_OK;
}

static void glu_destroy(void *self) { free(self); }

static int glu_declare(void *self, k3rt_param_sink *sink, k3rt_error *err)
{
    const dense_glu *f = self;
    static const char *const names[GLU_N_PARAMS] = {"gate_proj.weight", "up_proj.weight",
                                                    "down_proj.weight"};
    for (int i = 0; i < GLU_N_PARAMS; i++) {
        k3rt_param_decl d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.role = K3RT_ROLE_MATRIX;
        d.name = names[i];
        d.ndim = 2;
        d.shape[0] = i == GLU_DOWN ? f->d : f->hidden;
        d.shape[1] = i == GLU_DOWN ? f->hidden : f->d;
        d.init = K3RT_INIT_NORMAL;
        d.init_a = i == GLU_DOWN ? f->down_std : f->init_std;
        d.layer = -1;
        K3RT_TRY(k3rt_param_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

/* Model FLOPs count the three projections only (the GLU is O(tokens * hidden)):
 * forward 3 * 2*N*d*H; backward twice that (input gradient and weight gradient of each). */
static int glu_flops(void *self, int64_t batch, int64_t seq, k3rt_flops *out)
{
    const dense_glu *f = self;
    double proj = 2.0 * (double)(batch * seq) * (double)f->d * (double)f->hidden;
    out->forward = 3 * proj;
    out->backward = 6 * proj;
    return K3RT_OK;
}

/* saved: g, u and a = glu(g, u), [N, H] each; workspace: da, dg, du [N, H] each. Each buffer
 * is rounded up to 256 bytes. */
static int glu_memory(void *self, int64_t batch, int64_t seq, k3rt_memory *out)
{
    const dense_glu *f = self;
    int64_t h = dense_glu_hidden_bytes(f, batch, seq);
    out->saved_bytes = 3 * h;
    out->workspace_bytes = 3 * h;
    out->state_bytes = 0;
    return K3RT_OK;
}

/* The saved parts g, u (read by the GLU's backward) and a (read only by dWd's product). */
static int glu_saved(void *self, int64_t batch, int64_t seq, k3rt_saved_sink *sink,
                     k3rt_error *err)
{
    const dense_glu *f = self;
    static const char *const names[GLU_SAVED_N] = {"g", "u", "act"};
    double proj = 2.0 * (double)(batch * seq) * (double)f->d * (double)f->hidden;
    for (int i = 0; i < GLU_SAVED_N; i++) {
        k3rt_saved_decl d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        d.name = names[i];
        d.bytes = dense_glu_hidden_bytes(f, batch, seq);
        d.dtype = f->dtype;
        d.flags = K3RT_SAVED_RECOMPUTE | (i == GLU_SAVED_A ? K3RT_SAVED_GEMM_ONLY : 0);
        d.recompute_flops = 2 * proj;
        K3RT_TRY(k3rt_saved_sink_add(sink, &d, err));
    }
    return K3RT_OK;
}

static int glu_experts(void *self, int32_t *n_experts, int32_t *top_k)
{
    (void)self;
    *n_experts = 0;
    *top_k = 0;
    return K3RT_OK;
}

static const k3rt_instance_vtable instance = {
    .struct_size = sizeof(k3rt_instance_vtable),
    .create = glu_create,
    .destroy = glu_destroy,
    .declare_params = glu_declare,
    .flops = glu_flops,
    .memory = glu_memory,
    .saved = glu_saved,
};

static const k3rt_moe_vtable moe = {
    .struct_size = sizeof(k3rt_moe_vtable),
    .forward = dense_glu_forward,
    .backward = dense_glu_backward,
    .experts = glu_experts,
};

static const k3rt_plugin_descriptor descriptor = {
    .struct_size = sizeof(k3rt_plugin_descriptor),
    .abi_major = K3RT_ABI_MAJOR,
    .abi_minor = K3RT_ABI_MINOR,
    .name = "dense_glu",
    .kind = K3RT_KIND_MOE,
    .version = "1.0.0",
    .description = "dense GLU feed-forward (SiTU-GLU or SwiGLU), no experts",
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
