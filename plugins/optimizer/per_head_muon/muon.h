/* per_head_muon: the instance, the view of each parameter as blocks, and the functions shared
 * by plugin.c (options, state), route.c (role -> rule, block layout, describe), step.c (one
 * optimizer step) and the CPU kernels written once over REAL (ns.inc.c, block.inc.c). */
#ifndef K3RT_PLUGIN_PER_HEAD_MUON_H
#define K3RT_PLUGIN_PER_HEAD_MUON_H

#include <k3rt/k3rt.h>

/* Keller Jordan's quintic Newton-Schulz coefficients, pinned: p(x) = a x + b x^3 + c x^5
 * applied ns_steps times to singular values normalised by the Frobenius norm. */
#define MUON_NS_A 3.4445
#define MUON_NS_B (-4.7750)
#define MUON_NS_C 2.0315
/* Added to ||X||_F before the normalisation, so a zero gradient gives a zero update. */
#define MUON_NS_EPS 1e-7

enum { MUON_RULE_MUON = 1, MUON_RULE_ADAMW = 2 };

/* A parameter (or one expert of it) seen as `count` sub-matrices of rows x cols: block b
 * starts at element b * stride, and its rows are `ld` elements apart. */
typedef struct muon_view {
    int64_t count, rows, cols, ld, stride;
} muon_view;

typedef struct muon_param {
    char *name;        /* full name, for state names and messages */
    int rule;          /* MUON_RULE_* */
    int role, head_axis;  /* as declared */
    int decayed;
    int64_t n;         /* elements */
    muon_view view;    /* Muon: the blocks orthogonalised one by one */
    int qk_clip;       /* k3rt_qk_clip when clipping is on, else K3RT_QK_NONE */
    muon_view heads;   /* qk_clip: one block per head, whatever per_head says */
    void *state;       /* Muon: momentum [n]; AdamW: m [n] then v (one allocation) */
    void *v;
} muon_param;

/* One Newton-Schulz problem: block `block` of Muon parameter `param`. */
typedef struct muon_job {
    int32_t param;
    int32_t owner;     /* scratch slot that runs it; -1: alone, with every thread */
    int64_t block;
    double cost;       /* FLOPs of its Newton-Schulz iterations */
} muon_job;

struct muon_gpu;

typedef struct muon {
    int device;
    int dtype;                     /* of every parameter (f32, or f64 in tests) */
    double momentum;
    int nesterov, ns_steps, per_head, qk_clip;
    int ns_bf16;                   /* Newton-Schulz in bf16 (ns_precision, "auto" resolved) */
    double scale, weight_decay, qk_tau;
    double beta1, beta2, eps, adamw_weight_decay;
    int32_t n;
    muon_param *p;
    muon_job *jobs;                /* every Muon block, most expensive first */
    int64_t n_jobs;
    int planned_slots;             /* slot count the owners were assigned for (0: none yet) */
    int64_t slot_elems;            /* scratch per slot: 2 R C + 2 m^2 of the largest block */
    void *scratch;                 /* slots * slot_elems elements */
    int scratch_slots;
    int64_t step;                  /* steps taken; host i64, checkpointed as "step" */
    /* The AdamW group as k3rt_adamw_step_multi takes it (host arrays, n_adamw entries): which
     * parameter each entry is, its moments, length and decay, fixed at create; weights and
     * gradients refreshed at every step. */
    int32_t n_adamw, *adamw_index;
    void **aw_w, **aw_m, **aw_v;
    const void **aw_g;
    int64_t *aw_n;
    double *aw_wd;
    struct muon_gpu *gpu;          /* CUDA: the step's tables and arenas (cuda.c) */
} muon;

/* The one stride-addressed block of a parameter in each Muon job. */
typedef struct muon_block_args {
    const muon *o;
    const muon_param *p;
    void *param, *grad;            /* of the whole parameter */
    int64_t block;
    double lr;
} muon_block_args;

/* route.c */
int muon_route(muon *o, const k3rt_param_ref *ref, muon_param *p, k3rt_error *err);
int muon_plan_jobs(muon *o, k3rt_error *err);
int muon_describe(void *self, int32_t index, char *buf, size_t len);

/* step.c */
int muon_cpu_step(muon *o, const k3rt_optimizer_step *a, k3rt_error *err);
/* The AdamW group's tables (at create) and its one multi-tensor step (CPU and CUDA). */
int muon_adamw_plan(muon *o, k3rt_error *err);
int muon_adamw_group(muon *o, const k3rt_optimizer_step *a, k3rt_error *err);

/* cuda.c (CUDA builds): the whole step on the device. create plans the blocks, groups and
 * arenas; step runs momentum, Newton-Schulz, the update, the AdamW group and QK-clip on the
 * step's stream without synchronising. */
int muon_gpu_create(muon *o, k3rt_stream *s, k3rt_error *err);
void muon_gpu_destroy(muon *o);
int64_t muon_gpu_workspace_bytes(const muon *o);
int muon_gpu_step(muon *o, const k3rt_optimizer_step *a, k3rt_error *err);

/* The CPU kernels, per dtype. newton_schulz orthogonalises x (rows x cols, contiguous) in
 * place using y (rows x cols) and s, p (m x m, m = min(rows, cols)) as scratch; bf16 rounds
 * every stored result to bf16 (the device's tensor-core arithmetic, emulated). */
int muon_newton_schulz_f32(k3rt_stream *s, float *x, float *y, float *sq, float *p,
                           int64_t rows, int64_t cols, int steps, int bf16, k3rt_error *err);
int muon_newton_schulz_f64(k3rt_stream *s, double *x, double *y, double *sq, double *p,
                           int64_t rows, int64_t cols, int steps, int bf16, k3rt_error *err);
int muon_block_f32(k3rt_stream *s, const muon_block_args *a, float *scratch, k3rt_error *err);
int muon_block_f64(k3rt_stream *s, const muon_block_args *a, double *scratch, k3rt_error *err);
void muon_scale_block_f32(float *w, const muon_view *v, int64_t block, double factor);
void muon_scale_block_f64(double *w, const muon_view *v, int64_t block, double factor);

#endif
