/* Quantile Balancing: statistics per micro-batch and the bias update per step (spec §4).
 *
 * With the current bias b fixed for the whole step, token i's cutoff is the (k+1)-th largest
 * biased score alpha_i = (k+1)-th max_j (s_ij + b_j), and expert j beats it iff
 * b_j > r_ij = alpha_i - s_ij (its "required bias"). Over the step's global batch of M tokens,
 * expert j receives q = M k / E tokens when its bias is the q-th smallest r_:j (0-based), so
 *   b_hat_j = r_j,(floor q)        exact mode: a sort of every column
 *   b_hat_j ~ the same from a histogram of r_:j over [lo, hi] = [min b - 1, max b + 1]
 *             (every r lies there: alpha - s is within (min b, max b + 1) - (0, 1)), read with
 *             linear interpolation inside the bin that reaches q; error about one bin width
 * and b_next = b_hat - mean(b_hat), installed for the next step only (never the batch that
 * produced it). All selection statistics are in double from the f32 scores and bias.
 *
 * Data parallelism: histograms are integer counts summed across ranks, so every rank gets the
 * same bits and computes the same bias with no broadcast; exact mode gathers every rank's r. */
#include "quantile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void quantile_window(const quantile_balancer *q, double *lo, double *w)
{
    double mn = q->bias[0], mx = q->bias[0];
    for (int e = 1; e < q->E; e++) {
        mn = q->bias[e] < mn ? q->bias[e] : mn;
        mx = q->bias[e] > mx ? q->bias[e] : mx;
    }
    *lo = mn - 1.0;
    *w = (mx - mn + 2.0) / (double)q->bins;
}

/* The (k+1)-th largest of s + b: top[] keeps the k+1 largest seen, descending. */
static double cutoff(const float *s, const float *b, int E, int k, double *top)
{
    int n = 0, keep = k + 1;
    for (int e = 0; e < E; e++) {
        double v = (double)s[e] + (double)b[e];
        int at = n < keep ? n : keep;
        while (at > 0 && v > top[at - 1])
            at--;
        if (at >= keep)
            continue;
        for (int j = n < keep ? n : keep - 1; j > at; j--)
            top[j] = top[j - 1];
        top[at] = v;
        n += n < keep;
    }
    return top[k];
}

static int grow_rows(quantile_balancer *q, int64_t rows, k3rt_error *err)
{
    if (rows <= q->r_cap)
        return K3RT_OK;
    int64_t cap = q->r_cap * 2 > rows ? q->r_cap * 2 : rows;
    double *r = realloc(q->r, (size_t)cap * (size_t)q->E * sizeof(double));
    if (!r)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory for %lld x %d required "
                         "biases (exact mode)", (long long)cap, q->E);
    q->r = r;
    q->r_cap = cap;
    return K3RT_OK;
}

int quantile_observe(void *self, k3rt_stream *s, const k3rt_routing *r, k3rt_error *err)
{
    quantile_balancer *q = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (q->device != K3RT_DEVICE_CPU)
        return quantile_gpu_observe(q, s, r, err);
#endif
    (void)s;
    int64_t N = r->batch * r->seq;
    const float *sc = r->scores.data;
    double lo, w;
    quantile_window(q, &lo, &w);
    if (q->mode == QB_EXACT)
        K3RT_TRY(grow_rows(q, q->ntok + N, err));
    for (int64_t i = 0; i < N; i++) {
        const float *si = sc + i * q->E;
        double alpha = cutoff(si, q->bias, q->E, q->k, q->top);
        if (q->mode == QB_EXACT) {
            double *ri = q->r + (q->ntok + i) * q->E;
            for (int e = 0; e < q->E; e++)
                ri[e] = alpha - (double)si[e];
            continue;
        }
        for (int e = 0; e < q->E; e++) {
            double t = (alpha - (double)si[e] - lo) / w;
            int64_t bin = !(t >= 0) ? 0 : t >= (double)q->bins ? q->bins - 1 : (int64_t)t;
            q->hist[e * q->bins + bin]++;
        }
    }
    q->ntok += N;
    return K3RT_OK;
}

/* NaN sorts last, so a broken score can never be picked before a finite one. */
static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* b_hat from every rank's required biases: one sorted column per expert. */
static int exact_quantiles(quantile_balancer *q, k3rt_stream *s, k3rt_comm *dp, double *bhat, int64_t *total,
                           k3rt_error *err)
{
    int ranks = k3rt_comm_size(dp), E = q->E;
    int64_t *rows = calloc((size_t)ranks, sizeof *rows), most = q->ntok;
    if (!rows)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
    int rc = K3RT_OK;
    double *all = q->r;
    if (ranks > 1) {
        /* ranks may hold different row counts: pad to the largest with +inf, which sorts
         * after every real value and never reaches the quantile index (< the real count) */
        rc = k3rt_all_gather(dp, s, &q->ntok, rows, 1, K3RT_I64, err);
        for (int i = 0; i < ranks && !rc; i++)
            most = rows[i] > most ? rows[i] : most;
        if (!rc)
            rc = grow_rows(q, most, err);
        for (int64_t i = q->ntok * E; !rc && i < most * E; i++)
            q->r[i] = INFINITY;
        all = rc ? NULL : malloc((size_t)(ranks * most * E) * sizeof(double));
        if (!rc && !all)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
        if (!rc)
            rc = k3rt_all_gather(dp, s, q->r, all, most * E, K3RT_F64, err);
    } else {
        rows[0] = q->ntok;
    }
    *total = 0;
    for (int i = 0; i < ranks; i++)
        *total += rows[i];
    int64_t n = ranks * most, idx = (int64_t)floor((double)*total * q->k / E);
    double *col = rc ? NULL : malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!rc && !col)
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
    for (int e = 0; e < E && !rc && *total > 0; e++) {
        for (int64_t i = 0; i < n; i++)
            col[i] = all[i * E + e];
        qsort(col, (size_t)n, sizeof(double), cmp_double);
        bhat[e] = col[idx < *total ? idx : *total - 1];
    }
    free(col);
    if (all != q->r)
        free(all);
    free(rows);
    return rc;
}

/* b_hat from the summed histograms: the first bin whose cumulative count reaches ceil(tau),
 * interpolated linearly inside it. */
static int histogram_quantiles(quantile_balancer *q, k3rt_stream *s, k3rt_comm *dp, double *bhat,
                               int64_t *total, k3rt_error *err)
{
    if (k3rt_comm_size(dp) > 1) {
        K3RT_TRY(k3rt_all_reduce(dp, s, q->hist, q->hist, q->E * q->bins, K3RT_I64,
                                 K3RT_REDUCE_SUM, err));
        K3RT_TRY(k3rt_all_reduce(dp, s, &q->ntok, &q->ntok, 1, K3RT_I64, K3RT_REDUCE_SUM, err));
    }
    *total = q->ntok;
    double lo, w, tau = (double)q->ntok * q->k / q->E, target = ceil(tau);
    quantile_window(q, &lo, &w);
    for (int e = 0; e < q->E; e++) {
        const int64_t *h = q->hist + e * q->bins;
        int64_t cum = 0, b = 0;
        /* every expert's column holds ntok >= ceil(tau) counts (k < E), so this stops */
        while (b < q->bins - 1 && (double)(cum + h[b]) < target)
            cum += h[b++];
        double frac = h[b] > 0 ? (tau - (double)cum) / (double)h[b] : 0.0;
        frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
        bhat[e] = lo + ((double)b + frac) * w;
    }
    return K3RT_OK;
}

int quantile_update(void *self, k3rt_stream *s, k3rt_comm *dp, int64_t step, k3rt_error *err)
{
    (void)step;
    quantile_balancer *q = self;
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (q->device != K3RT_DEVICE_CPU)
        return quantile_gpu_update(q, s, dp, err);
#endif
    double *bhat = calloc((size_t)q->E, sizeof *bhat);
    if (!bhat)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "quantile: out of memory");
    int64_t total = 0;
    int rc = q->mode == QB_EXACT ? exact_quantiles(q, s, dp, bhat, &total, err)
                                 : histogram_quantiles(q, s, dp, bhat, &total, err);
    /* fewer than one target token per expert (tau < 1): nothing to learn from, keep b */
    if (!rc && (double)total * q->k / q->E >= 1.0) {
        double mean = 0;
        for (int e = 0; e < q->E; e++)
            mean += bhat[e];
        mean /= q->E;
        for (int e = 0; e < q->E; e++)
            q->bias[e] = (float)(bhat[e] - mean);
    }
    free(bhat);
    q->ntok = 0;
    if (q->hist)
        memset(q->hist, 0, (size_t)(q->E * q->bins) * sizeof *q->hist);
    return rc;
}
