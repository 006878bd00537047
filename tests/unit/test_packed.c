/* Packed training on the CPU in double precision: a batch whose rows hold several documents,
 * with their boundaries (model_set_documents), gives the same loss and the same gradient of
 * every parameter as the documents run one by one — KDA restarts its state and short-conv
 * window at each document, MLA masks keys of other documents — and the same batch without
 * boundaries does not. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "testutil/testutil.h"

static const char *DOC =
    "{\"d_model\": 8, \"vocab\": 11, \"layers\": 2, \"pattern\": \"KM\", \"norm_eps\": 1e-5,"
    " \"init_std\": 0.3, \"dense_layers\": 0,"
    " \"mixers\": {"
    "   \"K\": {\"plugin\": \"kda\", \"kind\": \"attention\", \"path\": null,"
    "     \"config\": {\"heads\": 2, \"head_dim\": 4, \"max_documents\": 3, \"chunk_size\": 4,"
    "                 \"init_std\": 0.3}},"
    "   \"M\": {\"plugin\": \"mla\", \"kind\": \"attention\", \"path\": null,"
    "     \"config\": {\"heads\": 2, \"kv_rank\": 6, \"qk_nope_dim\": 4, \"qk_shared_dim\": 2,"
    "                 \"v_dim\": 3, \"init_std\": 0.3}}},"
    " \"ffn\": {\"plugin\": \"dense_glu\", \"kind\": \"moe\", \"path\": null,"
    "   \"config\": {\"hidden\": 12, \"init_std\": 0.3}},"
    " \"balancer\": {\"plugin\": \"none\", \"kind\": \"balancer\", \"path\": null, \"config\": {}},"
    " \"residual\": {\"plugin\": \"standard\", \"kind\": \"residual\", \"path\": null,"
    "   \"config\": {}}}";

enum { T = 12, N = 2 * T };

/* Row 0: documents A (5 tokens) and B (7); row 1: document C (12). */
static const int32_t OFFSETS[] = {0, 5, 12, 24};
static const int LEN[] = {5, 7, 12};

/* Gradients of every parameter, concatenated. */
static double *grads(const model *m, int64_t *n)
{
    *n = 0;
    for (int i = 0; i < m->n_params; i++)
        *n += m->params[i].numel;
    double *g = malloc((size_t)*n * sizeof *g), *at = g;
    for (int i = 0; i < m->n_params; i++) {
        memcpy(at, m->params[i].grad.data, (size_t)m->params[i].numel * sizeof *g);
        at += m->params[i].numel;
    }
    return g;
}

static double step(model *m, int64_t B, int64_t Tn, const int32_t *tok, const int32_t *tgt,
                   const int32_t *docs, int64_t n_docs)
{
    k3rt_error err = {0};
    TU_OK(model_set_shape(m, B, Tn, &err), err);
    TU_OK(model_set_documents(m, docs, n_docs, &err), err);
    double loss;
    TU_OK(model_train_step(m, tok, tgt, 1.0, 0.0, &loss, &err), err);
    return loss;
}

START_TEST(packed_equals_one_by_one)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    ck_assert_msg(registry_find(&reg, "kda", 0) && registry_find(&reg, "mla", 0) &&
                  registry_find(&reg, "dense_glu", 0), "kda, mla and dense_glu are built");
    k3rt_stream *s = tu_cpu_stream(1);
    json_t *doc = json_loads(DOC, 0, NULL);
    model m;
    model_options o = {K3RT_F64, K3RT_DEVICE_CPU, s, NULL, 11, 0, NULL, NULL};
    TU_OK(model_build(&m, doc, &reg, &o, &err), err);
    json_decref(doc);
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 7 + 3) % 11;
        tgt[i] = (i * 5 + 1) % 11;
    }
    for (int d = 0; d < 3; d++)
        tgt[OFFSETS[d + 1] - 1] = -1; /* a document's last token predicts nothing */

    model_zero_grads(&m);
    double packed = step(&m, 2, T, tok, tgt, OFFSETS, 3);
    int64_t n;
    double *g_packed = grads(&m, &n);

    model_zero_grads(&m);
    double alone = 0;
    for (int d = 0; d < 3; d++) {
        int32_t one[2] = {0, LEN[d]};
        alone += step(&m, 1, LEN[d], tok + OFFSETS[d], tgt + OFFSETS[d], one, 1);
    }
    double *g_alone = grads(&m, &n);
    ck_assert_msg(fabs(packed - alone) <= 1e-12 * fabs(alone), "packed loss %.17g, one by one "
                  "%.17g", packed, alone);
    ck_assert(packed > 10 && packed < 21 * log(11.0) * 2);
    double worst = 0, scale = 0;
    for (int64_t k = 0; k < n; k++) {
        worst = fmax(worst, fabs(g_packed[k] - g_alone[k]));
        scale = fmax(scale, fabs(g_alone[k]));
    }
    ck_assert_msg(scale > 1e-3 && worst <= 1e-11 * scale, "gradients differ by %.3g (largest "
                  "%.3g)", worst, scale);

    /* without the boundaries, row 0's document B sees document A */
    model_zero_grads(&m);
    double crossed = step(&m, 2, T, tok, tgt, NULL, 0);
    ck_assert_msg(fabs(crossed - packed) > 1e-6, "the boundaries change nothing: %.17g",
                  crossed);
    printf("packed loss %.15g, one by one %.15g, without boundaries %.15g; gradients differ by "
           "%.3g of %.3g\n", packed, alone, crossed, worst, scale);
    free(g_packed);
    free(g_alone);
    model_free(&m);
    k3rt_stream_destroy(s);
    registry_free(&reg);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("packed");
    TCase *tc = tcase_create("packed");
    tcase_add_test(tc, packed_equals_one_by_one);
    suite_add_tcase(su, tc);
    return tu_run_suite(su);
}
