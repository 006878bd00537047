/* Finite-difference gradient checks of a plugin through its vtable, in double precision.
 * The loss is L = sum(y * dy) (+ sum(state_out * d_state_out) for stateful mixers) with random
 * x, dy and parameters; the plugin's backward is compared with central differences on a
 * random sample of entries of every input and parameter. Used by the plugin tests and by
 * `k3rt check-plugin`. */
#ifndef K3RT_CHECK_FDCHECK_H
#define K3RT_CHECK_FDCHECK_H

#include <jansson.h>
#include <k3rt/plugin.h>

#include "plugin/registry.h"

typedef struct fd_options {
    int64_t batch, seq, d_model, vocab;
    int n_layers, layer;
    uint64_t seed;
    int samples;         /* entries checked per tensor (default 10) */
    double eps;          /* central-difference step (default 1e-6) */
    double tol;          /* pass when every relative error <= tol (default 1e-6) */
    double jitter;       /* N(0, jitter^2) added to parameters initialised to a constant, so
                            zero-initialised ones are exercised too (default 0.1) */
    double x_scale;      /* std of the random input (default 1) */
    int threads;         /* CPU threads (default 1) */
    int stencil;         /* 2 (default): central difference, error O(eps^2); 4: the five-point
                            stencil, O(eps^4), for gradient entries too small for 2 to resolve */
} fd_options;

typedef struct fd_result {
    int n_checked;
    double worst;          /* largest relative error seen */
    char worst_what[256];  /* "grad.q_proj.weight[17]: analytic ... numeric ..." */
} fd_result;

/* Fills defaults into o (fields left zero). */
void fd_options_defaults(fd_options *o);
/* attention and moe plugins */
int fd_check_module(const plugin_entry *e, const json_t *config, const fd_options *o,
                    fd_result *r, k3rt_error *err);
/* residual plugins: a toy stack of 2 * n_layers sublayers y = tanh(a_s * x_s) */
int fd_check_residual(const plugin_entry *e, const json_t *config, const fd_options *o,
                      fd_result *r, k3rt_error *err);

#endif
