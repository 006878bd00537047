/* Quantile Balancing on CUDA: the instance's bias, histograms and required biases live on the
 * device and the kernels of bal_cuda.h compute what quantile.c computes on the CPU, so a step
 * reads nothing back to balance. Exact mode keeps every required bias of the step [ntok, E] in
 * doubles on the device and selects each column's quantile there; it serves one data-parallel
 * rank on CUDA (histogram mode is the distributed estimator). */
#include <math.h>
#include <string.h>

#include "quantile.h"
#include "bal_cuda.h"

int quantile_gpu_alloc(quantile_balancer *q, k3rt_error *err)
{
    if (q->E > BAL_CU_MAX_EXPERTS)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "quantile: on CUDA experts must be <= %d, "
                         "got %d", BAL_CU_MAX_EXPERTS, q->E);
    K3RT_TRY(bal_cu_enter(q->device, err));
    size_t hb = (size_t)(q->E * q->bins) * sizeof(int64_t);
    q->bias = k3rt_alloc(q->device, (size_t)q->E * sizeof(float), err);
    q->work = q->bias ? k3rt_alloc(q->device, (size_t)(q->E + 2) * sizeof(double), err) : NULL;
    if (!q->work)
        return err->code ? err->code : K3RT_ERR_NOMEM;
    if (q->mode == QB_HISTOGRAM && !(q->hist = k3rt_alloc(q->device, hb, err)))
        return err->code ? err->code : K3RT_ERR_NOMEM;
    void *st = k3rt_stream_native(q->stream);
    K3RT_TRY(bal_cu_zero(st, q->bias, (size_t)q->E * sizeof(float), err));
    if (q->hist)
        K3RT_TRY(bal_cu_zero(st, q->hist, hb, err));
    return K3RT_OK;
}

void quantile_gpu_free(quantile_balancer *q)
{
    void *bufs[] = {q->bias, q->hist, q->r, q->work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            k3rt_free(q->device, bufs[i]);
    q->bias = NULL, q->hist = NULL, q->r = NULL, q->work = NULL;
}

void quantile_gpu_reset(quantile_balancer *q)
{
    k3rt_error err = {0};
    q->ntok = 0;
    if (q->hist)
        bal_cu_zero(k3rt_stream_native(q->stream), q->hist,
                    (size_t)(q->E * q->bins) * sizeof(int64_t), &err);
}

/* Room for `rows` required-bias rows: a larger block, the old rows copied over on the stream. */
static int grow_rows(quantile_balancer *q, k3rt_stream *s, int64_t rows, k3rt_error *err)
{
    if (rows <= q->r_cap)
        return K3RT_OK;
    int64_t cap = q->r_cap * 2 > rows ? q->r_cap * 2 : rows;
    double *r = k3rt_alloc(q->device, (size_t)(cap * q->E) * sizeof(double), err);
    if (!r)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of device memory for %lld x %d "
                         "required biases (exact mode)", (long long)cap, q->E);
    if (q->r) {
        int rc = k3rt_memcpy(s, r, q->device, q->r, q->device,
                             (size_t)(q->ntok * q->E) * sizeof(double), err);
        k3rt_free(q->device, q->r); /* ordered after the copy on the same stream */
        if (rc) {
            k3rt_free(q->device, r);
            q->r = NULL, q->r_cap = 0;
            return rc;
        }
    }
    q->r = r;
    q->r_cap = cap;
    return K3RT_OK;
}

int quantile_gpu_observe(quantile_balancer *q, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err)
{
    int64_t N = r->batch * r->seq;
    void *st = k3rt_stream_native(s);
    K3RT_TRY(bal_cu_enter(q->device, err));
    if (q->mode == QB_EXACT)
        K3RT_TRY(grow_rows(q, s, q->ntok + N, err));
    K3RT_TRY(quantile_cu_window(st, q->bias, q->E, q->bins, q->work, err));
    double *rows = q->mode == QB_EXACT ? q->r + q->ntok * q->E : NULL;
    K3RT_TRY(quantile_cu_observe(st, r->scores.data, q->bias, N, q->E, q->k, q->work, q->bins, rows,
                           (unsigned long long *)q->hist, err));
    q->ntok += N;
    return K3RT_OK;
}

int quantile_gpu_update(quantile_balancer *q, k3rt_stream *s, k3rt_comm *dp, k3rt_error *err)
{
    void *st = k3rt_stream_native(s);
    double *bhat = q->work + 2;
    int ranks = k3rt_comm_size(dp);
    K3RT_TRY(bal_cu_enter(q->device, err));
    if (q->mode == QB_EXACT && ranks > 1)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "quantile: exact mode on CUDA serves one "
                         "data-parallel rank, got %d; use mode \"histogram\" (the distributed "
                         "estimator)", ranks);
    int64_t total = q->ntok;
    if (q->mode == QB_HISTOGRAM && ranks > 1) {
        /* the token count travels on the device too: the comm's buffers live there */
        int64_t *dn = (int64_t *)q->work;  /* the window is rebuilt below */
        K3RT_TRY(k3rt_memcpy(s, dn, q->device, &q->ntok, K3RT_DEVICE_CPU, sizeof(int64_t), err));
        K3RT_TRY(k3rt_all_reduce(dp, s, q->hist, q->hist, q->E * q->bins, K3RT_I64,
                                 K3RT_REDUCE_SUM, err));
        K3RT_TRY(k3rt_all_reduce(dp, s, dn, dn, 1, K3RT_I64, K3RT_REDUCE_SUM, err));
        K3RT_TRY(k3rt_memcpy(s, &total, K3RT_DEVICE_CPU, dn, q->device, sizeof(int64_t), err));
        K3RT_TRY(k3rt_stream_sync(s, err));
    }
    double tau = (double)total * q->k / q->E;
    /* fewer than one target token per expert (tau < 1): nothing to learn from, keep b */
    if (tau >= 1.0) {
        if (q->mode == QB_EXACT) {
            int64_t idx = (int64_t)floor(tau);
            K3RT_TRY(quantile_cu_select(st, q->r, total, q->E, idx < total ? idx : total - 1, bhat,
                                  err));
        } else {
            K3RT_TRY(quantile_cu_window(st, q->bias, q->E, q->bins, q->work, err));
            K3RT_TRY(quantile_cu_hist_quantiles(st, (const unsigned long long *)q->hist, q->E,
                                          q->bins, q->work, tau, bhat, err));
        }
        K3RT_TRY(quantile_cu_center(st, bhat, q->E, q->bias, err));
    }
    q->ntok = 0;
    if (q->hist)
        K3RT_TRY(k3rt_memset(s, q->hist, q->device, 0,
                             (size_t)(q->E * q->bins) * sizeof(int64_t), err));
    return K3RT_OK;
}
