/* A whole training step of tiny_dense.lua on the GPU against the CPU: the same recipe, seed
 * and batch; the loss and every parameter's gradient, error = rms(cpu - gpu) / rms(cpu).
 * fp32 on the GPU (full fp32 GEMMs, no TF32) must match to 1e-4 per gradient, every op
 * being within 1e-5; bf16 compute with fp32 master weights and gradients must match to 5e-2,
 * and the bf16 weight copies must be the master weights rounded.
 *
 * Skips (exit 77) without a CUDA device or when a plugin of the recipe has no CUDA path in
 * this build. Runs without fork: CUDA does not survive a fork of an initialised process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "recipe/recipe.h"
#include "testutil/testutil.h"

enum { B = 4, T = 64 };

typedef struct built {
    registry reg;
    recipe *rec;
    k3rt_stream *s;
    model m;
} built;

static void build(built *b, int device, int dtype)
{
    k3rt_error err = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/scripts/recipes/tiny_dense.lua", tu_source_dir());
    TU_OK(registry_init(&b->reg, NULL, &err), err);
    TU_OK(recipe_load(path, &b->reg, NULL, 0, NULL, &b->rec, &err), err);
    TU_OK(k3rt_stream_create(device, K3RT_STREAM_COMPUTE, &b->s, &err), err);
    const json_t *doc = recipe_json(b->rec);
    json_t *mdoc = json_deep_copy(json_object_get(doc, "model"));
    model_options o = {dtype, device, b->s, NULL, 1, 1, NULL, NULL};
    TU_OK(model_build(&b->m, mdoc, &b->reg, &o, &err), err);
    json_decref(mdoc);
    TU_OK(model_set_shape(&b->m, B, T, &err), err);
}

static void release(built *b)
{
    model_free(&b->m);
    k3rt_stream_destroy(b->s);
    recipe_free(b->rec);
    registry_free(&b->reg);
}

/* A tensor of the model as host doubles. */
static double *host_values(const built *b, const k3rt_tensor *t)
{
    k3rt_error err = {0};
    int64_t n = k3rt_tensor_numel(t);
    size_t bytes = (size_t)n * k3rt_dtype_size(t->dtype);
    void *raw = malloc(bytes);
    double *v = malloc((size_t)n * sizeof *v);
    TU_OK(k3rt_memcpy(b->s, raw, K3RT_DEVICE_CPU, t->data, t->device, bytes, &err), err);
    TU_OK(k3rt_stream_sync(b->s, &err), err);
    TU_OK(k3rt_convert(v, K3RT_F64, raw, t->dtype, n, &err), err);
    free(raw);
    return v;
}

/* Shakespeare bytes: a real batch, not zeros. */
static void batch(int32_t *tok, int32_t *tgt)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", tu_source_dir());
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: cannot open", path);
    unsigned char buf[B * T + 1];
    ck_assert_int_eq(fseek(f, 4096, SEEK_SET), 0);
    ck_assert_uint_eq(fread(buf, 1, sizeof buf, f), sizeof buf);
    fclose(f);
    for (int i = 0; i < B * T; i++) {
        tok[i] = buf[i];
        tgt[i] = buf[i + 1];
    }
}

static void compare_step(int gpu_dtype, double grad_tol, double loss_tol)
{
    built cpu, gpu;
    k3rt_error err = {0};
    build(&cpu, K3RT_DEVICE_CPU, K3RT_F32);
    build(&gpu, 0, gpu_dtype);
    ck_assert_int_eq(cpu.m.n_params, gpu.m.n_params);
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt);
    double lc, lg;
    model_zero_grads(&cpu.m);
    model_zero_grads(&gpu.m);
    TU_OK(model_train_step(&cpu.m, tok, tgt, 1.0 / (B * T), 0.0, &lc, &err), err);
    TU_OK(model_train_step(&gpu.m, tok, tgt, 1.0 / (B * T), 0.0, &lg, &err), err);
    lc /= B * T;
    lg /= B * T;
    printf("%s step: loss cpu %.7f gpu %.7f (diff %.2e)\n", k3rt_dtype_name(gpu_dtype), lc, lg,
           fabs(lc - lg));
    ck_assert_msg(lc > 4.0 && lc < 7.0, "loss %g of an untrained byte model", lc);
    ck_assert_msg(fabs(lc - lg) <= loss_tol, "loss: cpu %.7f gpu %.7f", lc, lg);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < cpu.m.n_params; i++) {
        const param_slot *pc = &cpu.m.params[i], *pg = &gpu.m.params[i];
        ck_assert_str_eq(pc->name, pg->name);
        double *gc = host_values(&cpu, &pc->grad), *gg = host_values(&gpu, &pg->grad);
        ck_assert_int_eq(pg->grad.dtype, K3RT_F32);
        double e = tu_rel_rms(gc, gg, pc->numel);
        if (!(e <= grad_tol))
            ck_abort_msg("%s gradient: rel rms %.3e > %.1e (%s)", pc->name, e, grad_tol,
                         k3rt_dtype_name(gpu_dtype));
        if (e > worst) {
            worst = e;
            worst_name = pc->name;
        }
        if (gpu_dtype == K3RT_BF16) {
            /* The compute copy is the master rounded to bf16. */
            double *master = host_values(&gpu, &pg->master), *copy = host_values(&gpu, &pg->param);
            for (int64_t k = 0; k < pc->numel; k++) {
                uint16_t h;
                double r;
                TU_OK(k3rt_convert(&h, K3RT_BF16, &master[k], K3RT_F64, 1, &err), err);
                TU_OK(k3rt_convert(&r, K3RT_F64, &h, K3RT_BF16, 1, &err), err);
                ck_assert_msg(r == copy[k], "%s[%lld]: bf16 copy %g, master %g", pc->name,
                              (long long)k, copy[k], master[k]);
            }
            free(master);
            free(copy);
        }
        free(gc);
        free(gg);
    }
    printf("%s step: %d gradients, worst rel rms %.3e (%s)\n", k3rt_dtype_name(gpu_dtype),
           cpu.m.n_params, worst, worst_name);
    release(&cpu);
    release(&gpu);
}

START_TEST(fp32_step_matches_cpu) { compare_step(K3RT_F32, 1e-4, 1e-5); }
END_TEST

START_TEST(bf16_step_matches_cpu) { compare_step(K3RT_BF16, 5e-2, 2e-2); }
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("train_step");
    TCase *t = tcase_create("tiny_dense");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, fp32_step_matches_cpu);
    tcase_add_test(t, bf16_step_matches_cpu);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    if (k3rt_cuda_device_count() > 0 && !tu_dense_plugins_have_cuda())
        return 77;
    return tu_run_gpu_suite(suite, NULL);
}
