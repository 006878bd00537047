/* Validation loss over a whole split (or its first windows). */
#include <stdlib.h>

#include "train/train_internal.h"

int set_window_documents(model *m, const token_stream *s, const int64_t *starts, int64_t B,
                         int64_t T, k3rt_error *err)
{
    int32_t *offsets = malloc((size_t)(B * T + 1) * sizeof *offsets);
    if (!offsets)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = model_set_documents(m, offsets, data_window_docs(s, starts, B, T, offsets), err);
    free(offsets);
    return rc;
}

/* The documents of the validation windows w0 .. w0 + B - 1 (those past W padding rows). */
static int set_val_documents(model *m, const token_stream *s, int64_t w0, int64_t W, int64_t B,
                             int64_t T, k3rt_error *err)
{
    int64_t *starts = malloc((size_t)B * sizeof *starts);
    if (!starts)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < B; b++)
        starts[b] = w0 + b < W ? (w0 + b) * T : -1;
    int rc = set_window_documents(m, s, starts, B, T, err);
    free(starts);
    return rc;
}

int eval_windows(model *m, const token_stream *s, int64_t B, int64_t T, int rank, int ranks,
                 int64_t max_windows, int packed, double acc[2], k3rt_error *err)
{
    int64_t W = data_val_windows(s, T), N = B * T;
    if (max_windows > 0 && max_windows < W)
        W = max_windows;
    K3RT_TRY(model_set_shape(m, B, T, err));
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    if (!in || !tg) {
        free(in), free(tg);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    acc[0] = acc[1] = 0;
    int rc = K3RT_OK;
    /* Rank r takes batches of windows r*B, (r + ranks)*B, ...; the last batch is padded
     * with ignored targets. */
    for (int64_t w0 = (int64_t)rank * B; w0 < W && !rc; w0 += B * ranks) {
        for (int64_t b = 0; b < B && !rc; b++) {
            if (w0 + b < W) {
                rc = data_val_window(s, w0 + b, T, in + b * T, tg + b * T, err);
                continue;
            }
            for (int64_t t = 0; t < T; t++) {
                in[b * T + t] = 0;
                tg[b * T + t] = -1;
            }
        }
        double ls = 0;
        int64_t cnt = 0;
        if (!rc && packed)
            rc = set_val_documents(m, s, w0, W, B, T, err);
        if (!rc)
            rc = model_eval(m, in, tg, &ls, &cnt, err);
        acc[0] += ls;
        acc[1] += (double)cnt;
    }
    free(in);
    free(tg);
    if (packed)
        model_set_documents(m, NULL, 0, NULL);
    return rc;
}

int eval_split(rank_ctx *c, const token_stream *s, int64_t max_windows, double *mean,
               k3rt_error *err)
{
    run *r = c->r;
    double acc[2];
    K3RT_TRY(eval_windows(&c->m, s, r->B, r->T, c->rank, r->dp, max_windows, r->packed, acc,
                          err));
    if (r->dp > 1)
        K3RT_TRY(k3rt_all_reduce(c->dp, c->stream, acc, acc, 2, K3RT_F64, K3RT_REDUCE_SUM, err));
    if (!(acc[1] > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "evaluation: no validation target was scored "
                         "(a split of %lld tokens)", (long long)s->n);
    *mean = acc[0] / acc[1];
    return K3RT_OK;
}
