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

typedef struct muon {
    int device;
    int dtype;                     /* of every parameter (f32, or f64 in tests) */
    double momentum;
    int nesterov, ns_steps, per_head, qk_clip;
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
int muon_step(void *self, const k3rt_optimizer_step *a, k3rt_error *err);

/* The CPU kernels, per dtype. newton_schulz orthogonalises x (rows x cols, contiguous) in
 * place using y (rows x cols) and s, p (m x m, m = min(rows, cols)) as scratch. */
int muon_newton_schulz_f32(k3rt_stream *s, float *x, float *y, float *sq, float *p,
                           int64_t rows, int64_t cols, int steps, k3rt_error *err);
int muon_newton_schulz_f64(k3rt_stream *s, double *x, double *y, double *sq, double *p,
                           int64_t rows, int64_t cols, int steps, k3rt_error *err);
int muon_block_f32(k3rt_stream *s, const muon_block_args *a, float *scratch, k3rt_error *err);
int muon_block_f64(k3rt_stream *s, const muon_block_args *a, double *scratch, k3rt_error *err);
void muon_scale_block_f32(float *w, const muon_view *v, int64_t block, double factor);
void muon_scale_block_f64(double *w, const muon_view *v, int64_t block, double factor);

#endif
