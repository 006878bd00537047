/* Compute efficiency of a variant against a base run (the "scaling efficiency" of the K3
 * report): the training FLOPs the base needs to reach the variant's final validation loss,
 * divided by the FLOPs the variant spent.
 *
 * The base's need C_base(L) is read off its (FLOPs, validation loss) curve, made monotone by
 * keeping the best loss reached so far, by linear interpolation in log-log space. When L lies
 * outside what the base reached, a power law L = A C^-alpha fitted to the base (least squares
 * of log L on log C over the points with C >= half the base's final FLOPs, at least two)
 * extrapolates — its exponent alpha, through the base's best point (or its first point for a
 * loss above the whole curve), so that a loss below the base's best always costs the base
 * more than it spent — and the result is marked extrapolated. */
#ifndef K3RT_ABLATE_EFFICIENCY_H
#define K3RT_ABLATE_EFFICIENCY_H

#include <k3rt/errors.h>

typedef struct power_law {
    double A, alpha;      /* L = A * C^-alpha */
    int points;           /* points fitted */
} power_law;

/* Fits the power law to points (C[i], L[i]), C increasing; fails when fewer than two points
 * are usable (C, L > 0) or the fitted loss does not fall with compute (alpha <= 0). */
int eff_fit(const double *C, const double *L, int n, power_law *out, k3rt_error *err);

/* C_base(target) on the base curve (C increasing, n >= 1); *extrapolated tells whether the
 * power law supplied it. */
int eff_base_flops(const double *C, const double *L, int n, double target, double *flops,
                   int *extrapolated, k3rt_error *err);

#endif
