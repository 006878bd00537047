/* check-plugin: one attention or moe instance on a device with everything a call needs, for
 * the checks that run the plugin (check_mixer.c). Inputs come from the check's seed, so two
 * runs of the same dtype see the same numbers whatever their device. */
#ifndef K3RT_CLI_CHECK_MIX_H
#define K3RT_CLI_CHECK_MIX_H

#include "cli/check.h"

typedef struct mix_run {
    check_ctx *c;
    int dtype, device, kind;
    int64_t B, T, d, n;          /* n = B * T * d */
    ck_module mod;               /* the instance (its rig), stream, parameters and buffers */
    void *x, *y, *dy, *dx;       /* on the device */
    int experts, top_k;
    float *bias;                 /* [experts] on the device */
    float *d_scores;             /* [tokens, experts] on the device, NULL when unused */
    int has_state;
    int64_t state_n;
    void *s_in, *s_out, *ds_out, *ds_in;
    int use_state;               /* pass state_in / d_state_out to the calls */
    k3rt_routing routing;        /* of the last forward */
} mix_run;

/* Creates the instance and its buffers; inputs are random (the bias zero). */
int mix_open(check_ctx *c, int dtype, int device, mix_run *r, k3rt_error *err);
void mix_close(mix_run *r);
/* The forward's arguments as mix_forward passes them to the rig. */
void mix_fwd_args(mix_run *r, int training, k3rt_fwd_args *a);
int mix_forward(mix_run *r, int training, k3rt_error *err);
/* Backward after a training forward; gradients accumulate into what the parameters hold. */
int mix_backward(mix_run *r, k3rt_error *err);
/* Zeroes the gradients (device) and poisons y, dx, saved and workspace with NaN bytes. */
int mix_reset(mix_run *r, k3rt_error *err);
/* Forward + backward from zeroed gradients, collecting y, dx, every gradient, the routing
 * and the state outputs. */
int mix_collect(mix_run *r, ck_blobs *out, k3rt_error *err);
/* Appends dx, the state gradient and every parameter gradient as they are now. */
int mix_add_grads(mix_run *r, ck_blobs *out, k3rt_error *err);
/* Sets a host buffer (of the run's dtype, or f32 for the bias) on the device. */
int mix_upload(mix_run *r, void *dev, const void *host, size_t bytes, k3rt_error *err);

#endif
