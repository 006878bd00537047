/* `k3rt check-plugin`: the conformance harness shared by its per-kind files.
 *
 * Every check prints one line (PASS / FAIL / SKIP, its name, what was measured) and is counted;
 * the command exits non-zero when any check failed. Each group of checks runs in a child
 * process (unless --no-fork), so a plugin that crashes or hangs fails that group with the
 * signal named instead of taking the report down. */
#ifndef K3RT_CLI_CHECK_H
#define K3RT_CLI_CHECK_H

#include <stdio.h>

#include <jansson.h>
#include <k3rt/k3rt.h>

#include "check/fdcheck.h"
#include "plugin/registry.h"
#include "plugin/rig.h"

enum { CK_PASS = 0, CK_FAIL = 1, CK_SKIP = 2 };

typedef struct check_ctx {
    const plugin_entry *e;
    const json_t *config;      /* --config: the plugin's options (validated by the host) */
    int64_t B, T, d, vocab;    /* shapes of the checks */
    int layers;                /* residual: decoder layers of the toy stack */
    int experts, top_k;        /* balancer: the simulated MoE layer */
    uint64_t seed;
    double tol;                /* finite differences: largest relative error */
    double fd_eps;             /* finite differences: step */
    double cuda_tol;           /* CPU vs CUDA: largest rms(cpu - cuda) / rms(cpu) */
    int samples;               /* finite differences: entries per tensor */
    int threads;               /* CPU threads of the checks' streams */
    k3rt_stream *cpu;          /* a CPU stream with `threads` threads, for the running group */
    int passed, failed, skipped;
} check_ctx;

/* Prints and counts one result. */
void ck_report(check_ctx *c, int status, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* FAIL with the error's message; returns 1 so callers can `return ck_error(...)`. */
int ck_error(check_ctx *c, const char *name, const k3rt_error *err);

/* rig_create with the shapes of c; the rest of the arguments are the caller's. A NULL
 * stream means c->cpu. */
int ck_create(check_ctx *c, rig *m, k3rt_create_args *a, int dtype, int device,
              k3rt_stream *s, k3rt_error *err);
/* Every CPU dtype the plugin declares, f64 first: K3RT_F64 and/or K3RT_F32. */
int ck_cpu_dtypes(const check_ctx *c, int dtypes[2]);
/* The CUDA check's verdict before it runs: 1 when it can run; otherwise reports the SKIP. */
int ck_cuda_ready(check_ctx *c, const char *name);

/* Host buffers of any dtype: allocation, random fill (N(0, scale^2)), conversion. */
void *ck_alloc(int dtype, int64_t n);
void ck_randn(void *x, int dtype, int64_t n, double scale, k3rt_rng *rng);
double ck_get(const void *x, int dtype, int64_t i);
/* rms(a - b) / rms(a) over n elements of two host buffers of the same dtype. */
double ck_rel_rms(const void *a, const void *b, int dtype, int64_t n);
/* 1 when every element of a float buffer is finite. */
int ck_finite(const void *x, int dtype, int64_t n);
/* Copies between host and a device buffer (either may be the CPU). */
int ck_copy(k3rt_stream *s, void *dst, int dst_device, const void *src, int src_device,
            size_t bytes, k3rt_error *err);

/* The parameters of an instance as host tensors of its dtype (gradients of its grad dtype),
 * initialised as declared (plus jitter for constant inits, so that their gradients are
 * exercised), mirrored on its device. */
typedef struct ck_params {
    int n, dtype, grad_dtype, device;
    k3rt_tensor *host, *dev, *grad_host, *grad_dev;
} ck_params;
int ck_params_make(check_ctx *c, rig *m, ck_params *p, k3rt_error *err);
void ck_params_free(ck_params *p);
/* Sends the host values to the device (no-op on the CPU) and zeroes the gradients. */
int ck_params_upload(ck_params *p, k3rt_stream *s, k3rt_error *err);
int ck_params_download_grads(ck_params *p, k3rt_stream *s, k3rt_error *err);

/* One instance of the checked plugin ready to call: created on `device` in `dtype` on the
 * context's CPU stream or, for a CUDA device, a stream of its own; its parameters made,
 * uploaded and bound; its saved parts and workspace allocated at the check's shape (guarded on
 * the CPU: rig_guards_ok tells whether a call wrote past them). Close frees what open got,
 * however far it got. */
typedef struct ck_module {
    k3rt_stream *s;
    int own_stream, created;
    rig m;
    ck_params p;
} ck_module;
int ck_module_open(check_ctx *c, int dtype, int device, ck_module *o, k3rt_error *err);
void ck_module_close(ck_module *o);

/* Finite-difference options at the check's shape, seed and tolerance; 0 after reporting the
 * "gradients" check skipped when the plugin has no double-precision CPU path. */
int ck_fd_options(check_ctx *c, fd_options *o);

/* Named host copies of a run's outputs, compared bitwise (determinism) or by relative rms
 * (CPU vs CUDA). */
typedef struct ck_blob {
    char name[160];
    int dtype;
    int64_t n;
    void *data;
} ck_blob;
typedef struct ck_blobs {
    ck_blob *b;
    int n, cap;
} ck_blobs;
int ck_blobs_add(ck_blobs *o, const char *name, int dtype, int64_t n, const void *src,
                 int src_device, k3rt_stream *s, k3rt_error *err);
void ck_blobs_free(ck_blobs *o);
const ck_blob *ck_blobs_find(const ck_blobs *o, const char *name);
/* 0 when equal bit for bit; else 1 and the first difference in `where`. */
int ck_blobs_differ(const ck_blobs *a, const ck_blobs *b, char *where, size_t len);
/* Largest rms(a - b) / rms(a) over float blobs; integer blobs must match exactly (else
 * INFINITY). `where` names the worst blob. */
double ck_blobs_worst(const ck_blobs *a, const ck_blobs *b, char *where, size_t len);
/* 0 when every float blob is finite; else 1 and its name in `where`. */
int ck_blobs_nonfinite(const ck_blobs *a, char *where, size_t len);

/* Copies every state() tensor of `from` into the same-named tensor of `to` (shapes and dtypes
 * must agree), then calls to's state_loaded(): what a checkpoint save and load do. *n receives
 * the number of tensors. */
int ck_state_copy(rig *from, rig *to, k3rt_stream *s, int *n, k3rt_error *err);

/* Checks common to every kind (check_common.c). */
void ck_descriptor(check_ctx *c);
void ck_config(check_ctx *c);
void ck_flops(check_ctx *c);
/* Per kind. */
void ck_mixer(check_ctx *c);       /* attention and moe (check_mixer.c) */
void ck_mixer_cuda(check_ctx *c);
void ck_decode(check_ctx *c);      /* attention: decoding against forward (check_decode.c) */
void ck_decode_cuda(check_ctx *c);
void ck_residual(check_ctx *c);    /* check_residual.c */
void ck_balancer(check_ctx *c);    /* check_balancer.c */
void ck_optimizer(check_ctx *c);   /* check_optimizer.c */

#endif
