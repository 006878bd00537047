/* The instance rig refuses bad arguments before the plugin sees them (plugin.h: "arguments are
 * validated by the host"): every refusal a plugin used to make for itself is made here once,
 * naming the instance, the argument, what was expected and what was found. */
#include "testutil/testutil.h"

#include <math.h>
#include <string.h>

#include "plugin/rig.h"

static const plugin_entry *shift_plugin(void)
{
    static registry reg;
    static const plugin_entry *e;
    if (!e) {
        k3rt_error err = {0};
        TU_OK(registry_load_file(&reg, K3RT_BINARY_DIR "/fixtures/shift_mixer.so", &e, &err),
              err);
    }
    return e;
}

static k3rt_create_args make_args(int dtype, int device, int64_t d, int layers, k3rt_stream *s)
{
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = device, a.d_model = d, a.vocab = 32, a.n_layers = layers;
    a.stream = s, a.seed = 7;
    return a;
}

/* Asserts rc failed with a message holding every one of the given fragments. */
#define REFUSED(rc, err, ...)                                                                    \
    do {                                                                                         \
        ck_assert_int_ne((rc), K3RT_OK);                                                         \
        const char *frags_[] = {__VA_ARGS__};                                                    \
        for (size_t i_ = 0; i_ < sizeof frags_ / sizeof frags_[0]; i_++)                         \
            ck_assert_msg(strstr((err).msg, frags_[i_]), "message \"%s\" lacks \"%s\"",         \
                          (err).msg, frags_[i_]);                                                \
    } while (0)

/* ---- a token mixer (the shift fixture, f64 [B=2, T=5, d=4]) --------------------------------- */

enum { B = 2, T = 5, D = 4 };

typedef struct mixer {
    rig r;
    k3rt_stream *s;
    double x[B * T * D], y[B * T * D], dy[B * T * D], dx[B * T * D];
} mixer;

static void mixer_open(mixer *m)
{
    k3rt_error err = {0};
    m->s = tu_cpu_stream(1);
    k3rt_create_args a = make_args(K3RT_F64, K3RT_DEVICE_CPU, D, 1, m->s);
    json_t *cfg = json_pack("{s:f}", "init_std", 0.5);
    TU_OK(rig_create(&m->r, shift_plugin(), cfg, &a, "layers.0.mixer", &err), err);
    json_decref(cfg);
    TU_OK(rig_alloc_params(&m->r, &err), err);
    double *w = m->r.params[0].data;
    for (int i = 0; i < D * D; i++)
        w[i] = 0.1 * (i + 1);
    TU_OK(rig_alloc_shape(&m->r, B, T, 1, &err), err);
    tu_randn(m->x, B * T * D, 1.0, 3);
    tu_randn(m->dy, B * T * D, 1.0, 4);
}

static void mixer_close(mixer *m)
{
    rig_destroy(&m->r);
    k3rt_stream_destroy(m->s);
}

static k3rt_tensor act(void *p) { return k3rt_tensor_view(p, K3RT_F64, K3RT_DEVICE_CPU, 3, B, T, D, 0); }

static k3rt_fwd_args fwd(mixer *m)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act(m->x), a.y = act(m->y), a.training = 1;
    return a;
}

static k3rt_bwd_args bwd(mixer *m)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act(m->x), a.dy = act(m->dy), a.dx = act(m->dx);
    return a;
}

START_TEST(test_activations_checked)
{
    mixer m;
    mixer_open(&m);
    k3rt_error err = {0};
    k3rt_fwd_args a = fwd(&m);
    TU_OK(rig_forward(&m.r, &a, &err), err);

    a = fwd(&m), a.x.shape[2] = D + 1;
    REFUSED(rig_forward(&m.r, &a, &err), err, "layers.0.mixer (shift)", "forward: x",
            "expected f64 [2, 5, 4]", "got f64 [2, 5, 5]");
    a = fwd(&m), a.y.dtype = K3RT_F32;
    REFUSED(rig_forward(&m.r, &a, &err), err, "forward: y", "got f32");
    a = fwd(&m), a.x.device = 0;
    REFUSED(rig_forward(&m.r, &a, &err), err, "forward: x", "on the CPU", "on cuda:0");
    a = fwd(&m), a.y.data = NULL;
    REFUSED(rig_forward(&m.r, &a, &err), err, "y is missing");
    a = fwd(&m), a.x.ndim = 2;
    REFUSED(rig_forward(&m.r, &a, &err), err, "forward: x");

    k3rt_bwd_args b = bwd(&m);
    TU_OK(rig_backward(&m.r, &b, &err), err);
    b = bwd(&m), b.dx.shape[0] = 1;
    REFUSED(rig_backward(&m.r, &b, &err), err, "dx", "expected f64 [2, 5, 4]");
    b = bwd(&m), b.d_state_out = act(m.dy);
    REFUSED(rig_backward(&m.r, &b, &err), err, "no recurrent state");
    a = fwd(&m), a.state_in = act(m.x);
    REFUSED(rig_forward(&m.r, &a, &err), err, "state_in", "no recurrent state");
    a = fwd(&m), a.x_prefix = act(m.x);
    REFUSED(rig_forward(&m.r, &a, &err), err, "x_prefix given", "no prefix rows");
    a = fwd(&m), a.bias = k3rt_tensor_view(m.y, K3RT_F32, K3RT_DEVICE_CPU, 1, 4, 0, 0, 0);
    REFUSED(rig_forward(&m.r, &a, &err), err, "selection bias or routing given to a token mixer");
    ck_assert(rig_guards_ok(&m.r));
    mixer_close(&m);
}
END_TEST

START_TEST(test_buffers_checked)
{
    mixer m;
    mixer_open(&m);
    k3rt_error err = {0};
    /* parameters: one short, wrong shape, wrong dtype */
    k3rt_tensor p = m.r.params[0], g = m.r.grads[0];
    k3rt_tensor bad = p;
    bad.shape[1] = D + 1;
    REFUSED(rig_bind_params(&m.r, &bad, &g, &err), err, "w_prev.weight", "[4, 4]", "[4, 5]");
    bad = g, bad.dtype = K3RT_F32;
    REFUSED(rig_bind_params(&m.r, &p, &bad, &err), err, "w_prev.weight", "f32");
    REFUSED(rig_bind_params(&m.r, NULL, NULL, &err), err, "1 parameters to bind");
    /* a batch shape that is not one */
    REFUSED(rig_bind_shape(&m.r, 0, T, NULL, 0, NULL, 0, &err), err, "batch and seq", ">= 1");
    mixer_close(&m);

    /* kda keeps activations and scratch: buffers one byte short are refused */
    k3rt_stream *s = tu_cpu_stream(1);
    k3rt_create_args a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 16, 1, s);
    json_t *cfg = json_pack("{s:i,s:i}", "heads", 2, "head_dim", 8);
    rig r;
    TU_OK(rig_create(&r, tu_plugin("kda"), cfg, &a, "layers.1.mixer", &err), err);
    json_decref(cfg);
    int64_t saved = 0;
    k3rt_memory mem;
    TU_OK(rig_saved_total(&r, 2, 8, &saved, &err), err);
    TU_OK(rig_memory(&r, 2, 8, &mem, &err), err);
    ck_assert_int_gt(saved, 0);
    ck_assert_int_gt(mem.workspace_bytes, 0);
    char *buf = malloc((size_t)saved), *ws = malloc((size_t)mem.workspace_bytes);
    REFUSED(rig_bind_shape(&r, 2, 8, buf, saved - 1, ws, mem.workspace_bytes, &err), err,
            "layers.1.mixer (kda)", "saved buffer holds");
    REFUSED(rig_bind_shape(&r, 2, 8, buf, saved, ws, mem.workspace_bytes - 1, &err), err,
            "workspace holds");
    TU_OK(rig_bind_shape(&r, 2, 8, buf, saved, ws, mem.workspace_bytes, &err), err);
    /* a call before the parameters exist */
    float x[2 * 8 * 16] = {0}, y[2 * 8 * 16];
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.x = k3rt_tensor_view(x, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 8, 16, 0);
    f.y = k3rt_tensor_view(y, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 8, 16, 0);
    REFUSED(rig_forward(&r, &f, &err), err, "before the parameters were bound");
    /* the context-parallel halo: conv_width - 1 rows of the layer input before the span */
    TU_OK(rig_alloc_params(&r, &err), err);
    k3rt_context_needs need;
    TU_OK(rig_context(&r, &need, &err), err);
    ck_assert_int_eq(need.prefix_rows, 3);  /* the default conv_width 4 */
    float pre[2 * 3 * 16] = {0};
    f.x_prefix = k3rt_tensor_view(pre, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 2, 16, 0);
    REFUSED(rig_forward(&r, &f, &err), err, "x_prefix", "expected f32 [2, 3, 16]");
    f.x_prefix.shape[1] = 3;
    TU_OK(rig_forward(&r, &f, &err), err);
    rig_destroy(&r);
    /* documents for a mixer that does not declare them (the nan_mixer fixture) */
    registry fx;
    const plugin_entry *nan_mixer;
    TU_OK(registry_init(&fx, NULL, &err), err);
    TU_OK(registry_load_file(&fx, K3RT_BINARY_DIR "/fixtures/nan_mixer.so", &nan_mixer, &err),
          err);
    cfg = json_object();
    TU_OK(rig_create(&r, nan_mixer, cfg, &a, "layers.1.mixer", &err), err);
    json_decref(cfg);
    TU_OK(rig_alloc_params(&r, &err), err);
    TU_OK(rig_alloc_shape(&r, 2, 8, 0, &err), err);
    f.x_prefix = (k3rt_tensor){0};
    int32_t docs[3] = {0, 8, 16};
    f.doc_offsets = k3rt_tensor_view(docs, K3RT_I32, K3RT_DEVICE_CPU, 1, 3, 0, 0, 0);
    REFUSED(rig_forward(&r, &f, &err), err, "K3RT_CAP_DOCUMENTS");
    rig_destroy(&r);
    registry_free(&fx);
    free(buf), free(ws);
    k3rt_stream_destroy(s);
}
END_TEST

/* Packed sequences reach a plugin that declares them only when well formed, and it honours
 * them: the shift of a document's first token sees nothing. */
START_TEST(test_documents)
{
    mixer m;
    mixer_open(&m);
    k3rt_error err = {0};
    k3rt_fwd_args a = fwd(&m);
    int32_t good[5] = {0, 3, 5, 8, 10};
    a.doc_offsets = k3rt_tensor_view(good, K3RT_I32, K3RT_DEVICE_CPU, 1, 5, 0, 0, 0);
    TU_OK(rig_forward(&m.r, &a, &err), err);
    double norm3 = 0, norm4 = 0;
    for (int c = 0; c < D; c++)
        norm3 += fabs(m.y[3 * D + c]), norm4 += fabs(m.y[4 * D + c]);
    ck_assert_double_eq(norm3, 0);  /* token 3 starts a document */
    ck_assert_double_gt(norm4, 0);

    int32_t no_row_start[4] = {0, 3, 8, 10};  /* row 1 starts at token 5 */
    a.doc_offsets = k3rt_tensor_view(no_row_start, K3RT_I32, K3RT_DEVICE_CPU, 1, 4, 0, 0, 0);
    REFUSED(rig_forward(&m.r, &a, &err), err, "lacks the row start 5");
    int32_t falling[5] = {0, 6, 5, 8, 10};
    a.doc_offsets.data = falling, a.doc_offsets.shape[0] = 5;
    REFUSED(rig_forward(&m.r, &a, &err), err, "doc_offsets[2] = 5", "rise from 0 to B*T = 10");
    int32_t short_end[3] = {0, 5, 9};
    a.doc_offsets.data = short_end, a.doc_offsets.shape[0] = 3;
    REFUSED(rig_forward(&m.r, &a, &err), err, "doc_offsets[2] = 9");
    int64_t wide[3] = {0, 5, 10};
    a.doc_offsets = k3rt_tensor_view(wide, K3RT_I64, K3RT_DEVICE_CPU, 1, 3, 0, 0, 0);
    REFUSED(rig_forward(&m.r, &a, &err), err, "doc_offsets", "expected i32");

    /* the backward respects the same boundaries: dx of a document's last token is 0 */
    k3rt_bwd_args b = bwd(&m);
    b.doc_offsets = k3rt_tensor_view(good, K3RT_I32, K3RT_DEVICE_CPU, 1, 5, 0, 0, 0);
    TU_OK(rig_backward(&m.r, &b, &err), err);
    for (int c = 0; c < D; c++)
        ck_assert_double_eq(m.dx[2 * D + c], 0);
    mixer_close(&m);
}
END_TEST

/* A device or dtype outside the caps is refused at create, naming plugin, place and device. */
START_TEST(test_caps_refused)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    rig r;
    k3rt_create_args a = make_args(K3RT_F32, 0, 16, 1, s);
    /* every bundled plugin has a CUDA path now; the fixture (built without one) has none */
    static registry cpu_only_reg;
    const plugin_entry *cpu_only = NULL;
    TU_OK(registry_load_file(&cpu_only_reg, K3RT_BINARY_DIR "/fixtures/plain_residual.so",
                             &cpu_only, &err), err);
    json_t *cfg = json_pack("{}");
    REFUSED(rig_create(&r, cpu_only, cfg, &a, "residual", &err), err,
            "residual (standard)", "no CUDA implementation", "cuda:0");
    json_decref(cfg);
    cfg = json_pack("{s:i,s:i}", "heads", 2, "head_dim", 8);
    a = make_args(K3RT_BF16, K3RT_DEVICE_CPU, 16, 1, s);
    REFUSED(rig_create(&r, tu_plugin("kda"), cfg, &a, "layers.2.mixer", &err), err,
            "cannot compute in bf16 on the CPU");
    a = make_args(K3RT_F32, -7, 16, 1, s);
    REFUSED(rig_create(&r, tu_plugin("kda"), cfg, &a, "layers.2.mixer", &err), err,
            "device -7");
    a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 0, 1, s);
    REFUSED(rig_create(&r, tu_plugin("kda"), cfg, &a, "layers.2.mixer", &err), err,
            "d_model (0)");
    json_decref(cfg);
    /* the configuration is validated before create: a misspelt key names the right one */
    cfg = json_pack("{s:i,s:i}", "heads", 2, "head_dims", 8);
    a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 16, 1, s);
    REFUSED(rig_create(&r, tu_plugin("kda"), cfg, &a, "layers.2.mixer", &err), err,
            "head_dims", "head_dim");
    json_decref(cfg);
    k3rt_stream_destroy(s);
}
END_TEST

/* ---- FFNs: bias and router gradients only for routed ones; routing filled by the host ------- */

START_TEST(test_moe_routing)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    const int64_t d = 8, N = 2 * 4;
    float x[2 * 4 * 8], y[2 * 4 * 8], dy[2 * 4 * 8], dx[2 * 4 * 8], bias[5] = {0};
    tu_randnf(x, N * d, 1.0, 1);
    tu_randnf(dy, N * d, 1.0, 2);
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.x = k3rt_tensor_view(x, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 4, d, 0);
    f.y = k3rt_tensor_view(y, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 4, d, 0);
    f.training = 1;

    rig dense;
    k3rt_create_args a = make_args(K3RT_F32, K3RT_DEVICE_CPU, d, 1, s);
    json_t *cfg = json_pack("{s:i}", "hidden", 16);
    TU_OK(rig_create(&dense, tu_plugin("dense_glu"), cfg, &a, "layers.0.ffn", &err), err);
    json_decref(cfg);
    TU_OK(rig_alloc_params(&dense, &err), err);
    TU_OK(rig_alloc_shape(&dense, 2, 4, 1, &err), err);
    f.bias = k3rt_tensor_view(bias, K3RT_F32, K3RT_DEVICE_CPU, 1, 4, 0, 0, 0);
    REFUSED(rig_forward(&dense, &f, &err), err, "selection bias given to a dense FFN");
    f.bias.ndim = 0;
    f.state_in = f.x;
    REFUSED(rig_forward(&dense, &f, &err), err, "recurrent state or context prefix given to an FFN");
    f.state_in.ndim = 0;
    TU_OK(rig_forward(&dense, &f, &err), err);
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.x = f.x, b.dy = k3rt_tensor_view(dy, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 4, d, 0);
    b.dx = k3rt_tensor_view(dx, K3RT_F32, K3RT_DEVICE_CPU, 3, 2, 4, d, 0);
    b.d_scores = k3rt_tensor_view(y, K3RT_F32, K3RT_DEVICE_CPU, 2, N, 4, 0, 0);
    REFUSED(rig_backward(&dense, &b, &err), err, "router-score gradients given to a dense FFN");
    rig_destroy(&dense);

    rig moe;
    cfg = json_pack("{s:i,s:i,s:i,s:i,s:i}", "experts", 4, "top_k", 2, "latent", 4,
                    "expert_hidden", 8, "shared", 0);
    TU_OK(rig_create(&moe, tu_plugin("latent_moe"), cfg, &a, "layers.1.ffn", &err), err);
    json_decref(cfg);
    ck_assert_int_eq(moe.experts, 4);
    TU_OK(rig_alloc_params(&moe, &err), err);
    TU_OK(rig_alloc_shape(&moe, 2, 4, 1, &err), err);
    k3rt_routing routing;
    f.routing = &routing;
    f.bias = k3rt_tensor_view(bias, K3RT_F32, K3RT_DEVICE_CPU, 1, 5, 0, 0, 0);
    REFUSED(rig_forward(&moe, &f, &err), err, "bias", "expected f32 [4]", "got f32 [5]");
    f.bias.shape[0] = 4;
    TU_OK(rig_forward(&moe, &f, &err), err);
    /* what the host knows it fills in; the rest the plugin reported, checked */
    ck_assert_int_eq(routing.batch, 2);
    ck_assert_int_eq(routing.seq, 4);
    ck_assert_int_eq(routing.experts, 4);
    ck_assert_int_eq(routing.top_k, 2);
    ck_assert_ptr_eq(routing.bias.data, bias);
    const int64_t *counts = routing.counts.data;
    int64_t total = 0;
    for (int e = 0; e < 4; e++)
        total += counts[e];
    ck_assert_int_eq(total, N * 2);
    if (routing.offsets.ndim) {
        const int64_t *o = routing.offsets.data;
        for (int e = 0; e < 4; e++)
            ck_assert_int_eq(o[e + 1] - o[e], counts[e]);
    }
    b.d_scores.shape[1] = 5;
    REFUSED(rig_backward(&moe, &b, &err), err, "d_scores", "[8, 4]");
    rig_destroy(&moe);
    k3rt_stream_destroy(s);
}
END_TEST

/* ---- residual: sublayer ranges, the forward's input for mix_backward, op sources ------------ */

START_TEST(test_residual_calls)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    rig r;
    k3rt_create_args a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 4, 2, s);
    a.layer = -1;
    json_t *cfg = json_object();
    TU_OK(rig_create(&r, tu_plugin("standard"), cfg, &a, "residual", &err), err);
    json_decref(cfg);
    TU_OK(rig_alloc_params(&r, &err), err);
    TU_OK(rig_alloc_shape(&r, 1, 3, 1, &err), err);
    float t[12] = {0}, u[12] = {0};
    k3rt_residual_args ra;
    memset(&ra, 0, sizeof ra);
    ra.t = k3rt_tensor_view(t, K3RT_F32, K3RT_DEVICE_CPU, 3, 1, 3, 4, 0);
    TU_OK(rig_residual(&r, RIG_BEGIN, &ra, &err), err);
    ra.sublayer = 4;
    REFUSED(rig_residual(&r, RIG_MIX, &ra, &err), err, "residual (standard)", "mix",
            "of sublayer 4 (the model has 4 sublayers)");
    ra.sublayer = 1;
    REFUSED(rig_residual(&r, RIG_MIX_BACKWARD, &ra, &err), err, "sublayer_input");
    ra.sublayer_input = k3rt_tensor_view(u, K3RT_F32, K3RT_DEVICE_CPU, 3, 1, 3, 4, 0);
    TU_OK(rig_residual(&r, RIG_MIX_BACKWARD, &ra, &err), err);
    ra.sublayer = 0;
    REFUSED(rig_residual(&r, RIG_OP_FORWARD, &ra, &err), err, "needs a source or a partial");
    /* the fused pre-norm: its gain, normed output, rstd and epsilon are checked too */
    ck_assert(rig_has_residual(&r, RIG_MIX_NORM));
    float gain[4] = {1, 1, 1, 1}, normed[12], rstd[3];
    ra.norm_gain = k3rt_tensor_view(gain, K3RT_F32, K3RT_DEVICE_CPU, 1, 4, 0, 0, 0);
    ra.rstd = k3rt_tensor_view(rstd, K3RT_F32, K3RT_DEVICE_CPU, 1, 3, 0, 0, 0);
    ra.norm_eps = 1e-6;
    REFUSED(rig_residual(&r, RIG_MIX_NORM, &ra, &err), err, "normed is missing");
    ra.normed = k3rt_tensor_view(normed, K3RT_F32, K3RT_DEVICE_CPU, 3, 1, 3, 4, 0);
    ra.norm_eps = 0;
    REFUSED(rig_residual(&r, RIG_MIX_NORM, &ra, &err), err, "norm_eps must be > 0");
    ra.norm_eps = 1e-6, ra.rstd.shape[0] = 4;
    REFUSED(rig_residual(&r, RIG_MIX_NORM, &ra, &err), err, "rstd", "expected f32 [3]");
    ra.rstd.shape[0] = 3;
    TU_OK(rig_residual(&r, RIG_MIX_NORM, &ra, &err), err);
    rig_destroy(&r);
    /* a residual without the fused norm (the standard one, minus it): the call is refused,
     * naming it */
    static registry fx_reg;
    const plugin_entry *fx = NULL;
    TU_OK(registry_load_file(&fx_reg, K3RT_BINARY_DIR "/fixtures/plain_residual.so",
                             &fx, &err), err);
    cfg = json_object();
    TU_OK(rig_create(&r, fx, cfg, &a, "residual", &err), err);
    json_decref(cfg);
    TU_OK(rig_alloc_params(&r, &err), err);
    TU_OK(rig_alloc_shape(&r, 1, 3, 1, &err), err);
    ck_assert(!rig_has_residual(&r, RIG_MIX_NORM));
    REFUSED(rig_residual(&r, RIG_MIX_NORM, &ra, &err), err, "residual (standard)",
            "has no mix_norm()");
    rig_destroy(&r);
    k3rt_stream_destroy(s);
}
END_TEST

/* ---- optimizer: the parameter list of create, a 1-based step, a usable rate, roles ----------- */

START_TEST(test_optimizer_step)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    float w[6] = {1, 2, 3, 4, 5, 6}, g[6] = {1, 1, 1, 1, 1, 1}, ml[2] = {1, 1};
    k3rt_param_decl decl = {0};
    decl.struct_size = sizeof decl;
    decl.role = K3RT_ROLE_MATRIX, decl.name = "w", decl.ndim = 2;
    decl.shape[0] = 2, decl.shape[1] = 3, decl.layer = -1;
    k3rt_param_ref ref = {0};
    ref.struct_size = sizeof ref;
    ref.name = "layers.0.ffn.w", ref.decl = &decl;
    ref.param = k3rt_tensor_view(w, K3RT_F32, K3RT_DEVICE_CPU, 2, 2, 3, 0, 0);
    ref.grad = k3rt_tensor_view(g, K3RT_F32, K3RT_DEVICE_CPU, 2, 2, 3, 0, 0);
    k3rt_create_args a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 0, 0, s);
    a.params = &ref, a.n_params = 1;
    rig r;
    json_t *cfg = json_object();
    TU_OK(rig_create(&r, tu_plugin("adamw"), cfg, &a, "optimizer", &err), err);
    json_decref(cfg);
    REFUSED(rig_step(&r, NULL, 1e-3, 1, &ref, 0, &err), err, "optimizer (adamw)",
            "step got 0 parameters, create got 1");
    REFUSED(rig_step(&r, NULL, 1e-3, 0, &ref, 1, &err), err, "steps count from 1");
    REFUSED(rig_step(&r, NULL, NAN, 1, &ref, 1, &err), err, "learning rate nan");
    REFUSED(rig_step(&r, NULL, -1.0, 1, &ref, 1, &err), err, "learning rate -1");
    k3rt_param_ref bad = ref;
    bad.head_max_logit = k3rt_tensor_view(ml, K3RT_F32, K3RT_DEVICE_CPU, 1, 2, 0, 0, 0);
    REFUSED(rig_step(&r, NULL, 1e-3, 1, &bad, 1, &err), err, "has no QK-clip");
    bad = ref, bad.grad.shape[1] = 2;
    REFUSED(rig_step(&r, NULL, 1e-3, 1, &bad, 1, &err), err, "layers.0.ffn.w");
    TU_OK(rig_step(&r, NULL, 1e-3, 1, &ref, 1, &err), err);
    ck_assert_float_lt(w[0], 1.0f);
    rig_destroy(&r);
    k3rt_param_decl odd = decl;
    odd.role = 99;
    ref.decl = &odd;
    cfg = json_object();
    REFUSED(rig_create(&r, tu_plugin("adamw"), cfg, &a, "optimizer", &err), err,
            "unknown role 99");
    json_decref(cfg);
    k3rt_stream_destroy(s);
}
END_TEST

/* ---- balancer: a routing of its layer, selections in range -------------------------------- */

START_TEST(test_balancer_routing)
{
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    k3rt_create_args a = make_args(K3RT_F32, K3RT_DEVICE_CPU, 0, 0, s);
    a.n_experts = 4, a.top_k = 2;
    rig r;
    json_t *cfg = json_object();
    TU_OK(rig_create(&r, tu_plugin("quantile"), cfg, &a, "layers.1.balancer", &err), err);
    json_decref(cfg);
    float scores[2 * 4] = {0};
    int32_t sel[2 * 2] = {0, 1, 2, 3};
    int64_t counts[4] = {1, 1, 1, 1};
    k3rt_routing g;
    memset(&g, 0, sizeof g);
    g.struct_size = sizeof g;
    g.batch = 2, g.seq = 1, g.experts = 4, g.top_k = 2;
    g.scores = k3rt_tensor_view(scores, K3RT_F32, K3RT_DEVICE_CPU, 2, 2, 4, 0, 0);
    g.selected = k3rt_tensor_view(sel, K3RT_I32, K3RT_DEVICE_CPU, 2, 2, 2, 0, 0);
    g.counts = k3rt_tensor_view(counts, K3RT_I64, K3RT_DEVICE_CPU, 1, 4, 0, 0, 0);
    TU_OK(rig_observe(&r, &g, &err), err);
    sel[3] = 4;
    REFUSED(rig_observe(&r, &g, &err), err, "layers.1.balancer (quantile)",
            "routing.selected[3] = 4 is outside [0, 4)");
    sel[3] = 3;
    g.experts = 8;
    REFUSED(rig_observe(&r, &g, &err), err, "routing of 8 experts top-2",
            "serves 4 experts top-2");
    g.experts = 4;
    double loss;
    REFUSED(rig_aux_loss(&r, &g, 1.0, &loss, g.scores, &err), err, "has no aux_loss()");
    rig_destroy(&r);
    a.n_experts = 4, a.top_k = 5;
    cfg = json_object();
    REFUSED(rig_create(&r, tu_plugin("quantile"), cfg, &a, "layers.1.balancer", &err), err,
            "4 experts with top-5");
    json_decref(cfg);
    k3rt_stream_destroy(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rig");
    TCase *tc = tcase_create("rig");
    tcase_add_test(tc, test_activations_checked);
    tcase_add_test(tc, test_buffers_checked);
    tcase_add_test(tc, test_documents);
    tcase_add_test(tc, test_caps_refused);
    tcase_add_test(tc, test_moe_routing);
    tcase_add_test(tc, test_residual_calls);
    tcase_add_test(tc, test_optimizer_step);
    tcase_add_test(tc, test_balancer_routing);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
