/* Compute efficiency against a base curve (efficiency.h). */
#include "ablate/efficiency.h"

#include <math.h>

int eff_fit(const double *C, const double *L, int n, power_law *out, k3rt_error *err)
{
    double cmax = 0;
    for (int i = 0; i < n; i++)
        cmax = C[i] > cmax ? C[i] : cmax;
    /* The late part of the curve: points at or past half the final compute; the last two
     * when that leaves fewer. */
    int first = n - 2 < 0 ? 0 : n - 2;
    for (int i = 0; i < n; i++)
        if (C[i] >= cmax / 2) {
            first = i < first ? i : first;
            break;
        }
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (int i = first; i < n; i++) {
        if (!(C[i] > 0) || !(L[i] > 0) || !isfinite(C[i]) || !isfinite(L[i]))
            continue;
        double x = log(C[i]), y = log(L[i]);
        sx += x, sy += y, sxx += x * x, sxy += x * y;
        m++;
    }
    double den = m * sxx - sx * sx;
    if (m < 2 || !(fabs(den) > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "power-law fit: the base curve has %d usable "
                         "points with distinct FLOPs in its second half (2 needed)", m);
    double slope = (m * sxy - sx * sy) / den;
    out->alpha = -slope;
    out->A = exp((sy - slope * sx) / m);
    out->points = m;
    if (!(out->alpha > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "power-law fit: the base's validation loss "
                         "does not fall with compute in its second half (alpha = %g)",
                         out->alpha);
    return K3RT_OK;
}

/* Beyond the curve: the fitted exponent, anchored at the base's best point (below it) or at
 * its first point (above it), so the extrapolation continues the curve the base actually ran
 * instead of a fit that may pass above or below its ends. */
static int extrapolate(const double *C, const double *L, int n, double target, double *flops,
                       k3rt_error *err)
{
    power_law p;
    K3RT_TRY(eff_fit(C, L, n, &p, err));
    int first = -1, best = -1;
    for (int i = 0; i < n; i++) {
        if (!(C[i] > 0) || !(L[i] > 0))
            continue;
        first = first < 0 ? i : first;
        best = best < 0 || L[i] < L[best] ? i : best;
    }
    int a = target < L[best] ? best : first;
    *flops = C[a] * pow(L[a] / target, 1.0 / p.alpha);
    return K3RT_OK;
}

int eff_base_flops(const double *C, const double *L, int n, double target, double *flops,
                   int *extrapolated, k3rt_error *err)
{
    *extrapolated = 0;
    if (n < 1 || !(target > 0) || !isfinite(target))
        return k3rt_fail(err, K3RT_ERR_INVALID, "efficiency: %d base points, target loss %g",
                         n, target);
    /* The first point where the best loss so far reaches the target; between the previous
     * best (bc, bl) and it, interpolate log C linearly in log L. */
    double bc = NAN, bl = INFINITY;
    for (int i = 0; i < n; i++) {
        if (!(L[i] > 0) || !(C[i] > 0))
            continue;
        if (L[i] <= target) {
            if (isnan(bc)) /* already below at the first point: before the curve starts */
                break;
            double u = (log(target) - log(bl)) / (log(L[i]) - log(bl));
            *flops = exp(log(bc) + u * (log(C[i]) - log(bc)));
            return K3RT_OK;
        }
        if (L[i] < bl)
            bl = L[i], bc = C[i];
    }
    *extrapolated = 1;
    return extrapolate(C, L, n, target, flops, err);
}
