/* A direct AttnRes mixing op in double, written from spec §7 independently of the plugin:
 * per token, alpha = softmax_i(w . (gamma * v_i / rms(v_i))), h = sum_i alpha_i v_i, with
 * rms(v) = sqrt(mean(v^2) + eps). Shared by the block_attnres plugin and `k3rt op` tests. */
#ifndef K3RT_TESTS_ATTNRES_REF_H
#define K3RT_TESTS_ATTNRES_REF_H

#include <math.h>
#include <stdint.h>

/* h [N, d]; alpha [N, n] (may be NULL) receives the weights. */
static inline void attnres_ref(int n, const double *const *v, const double *w,
                               const double *gamma, double eps, int64_t N, int64_t d, double *h,
                               double *alpha)
{
    double logit[512], a[512];
    for (int64_t t = 0; t < N; t++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) {
            const double *x = v[i] + t * d;
            double ms = 0, z = 0;
            for (int64_t k = 0; k < d; k++)
                ms += x[k] * x[k];
            double r = 1.0 / sqrt(ms / (double)d + eps);
            for (int64_t k = 0; k < d; k++)
                z += w[k] * gamma[k] * x[k] * r;
            logit[i] = z;
            mx = fmax(mx, z);
        }
        for (int i = 0; i < n; i++)
            sum += a[i] = exp(logit[i] - mx);
        for (int64_t k = 0; k < d; k++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += a[i] / sum * v[i][t * d + k];
            h[t * d + k] = s;
        }
        for (int i = 0; alpha && i < n; i++)
            alpha[t * n + i] = a[i] / sum;
    }
}

#endif
