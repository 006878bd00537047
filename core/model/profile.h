/* The timer behind `k3rt train --profile`: time per part of a training step (each module
 * instance's forward and backward, the engine's own pieces) from timed events recorded on the
 * compute stream around each call.
 *
 * On a GPU nothing waits inside a step: the events are read once, after the stream sync that
 * ends a profiled step (profile_step_end). On the CPU, whose stream runs inline, an event reads
 * the host clock as it is recorded. Spans may nest (a balancer's calls inside an FFN's
 * forward, an all-reduce inside the statistics): the inner one pauses the outer, so every
 * part's time is its own and the parts never overlap; what they leave uncovered of the step's
 * wall time is the gap (launches, host work, synchronisation).
 *
 * The hooks take the model's `prof` pointer, NULL in every step not profiled: one pointer
 * test is all a normal run pays. */
#ifndef K3RT_MODEL_PROFILE_H
#define K3RT_MODEL_PROFILE_H

#include <stdint.h>
#include <k3rt/host.h>

/* The engine's own parts; module instance mi has rows PROF_MODULES + 2 mi (forward; a
 * balancer's every call) and + 1 (backward). */
enum {
    PROF_DATA,          /* the batch read on the host (and what the stream waits for it) */
    PROF_EMBED_FWD,     /* token copy and embedding lookup */
    PROF_EMBED_BWD,
    PROF_NORM_FWD,      /* the engine's RMSNorms (pre-norms a residual does not fuse, final) */
    PROF_NORM_BWD,      /* their backward and the pre-norm recomputed for it */
    PROF_HEAD_FWD,      /* LM head and cross-entropy, the loss read back */
    PROF_HEAD_BWD,
    PROF_STATS,         /* gradient zeroing, module statistics, routed counts */
    PROF_GRAD_NORM,     /* the gradient norm (a sync) and clipping */
    PROF_OPTIMIZER,     /* the optimizer step and the compute copies of the weights */
    PROF_COMM,          /* data-parallel all-reduces (none with one rank) */
    PROF_MODULES
};

#define PROF_DEPTH 4

typedef struct profile {
    k3rt_stream *stream;
    int device;
    k3rt_event **ev;        /* two per span, created in the first profiled step, reused */
    int n_ev;
    int *span_row;          /* this step's spans (ev[2i], ev[2i+1]) */
    int n_span, cap_span;
    int stack[PROF_DEPTH], depth;
    int n_rows;
    double *ms;             /* per row, summed over the counted steps */
    int64_t *calls;
    int64_t steps;          /* counted steps */
    double wall_ms;         /* their wall time, summed */
    double t0;
    int64_t waits;          /* k3rt_host_wait_count's growth in the counted steps */
    int64_t waits0;         /* the count when this step began */
} profile;

int profile_create(profile **out, k3rt_stream *s, int device, k3rt_error *err);
void profile_free(profile *p);
/* Starts a step of a model with n_mods modules: waits for the stream, so the step's wall time
 * holds its own work only. */
int profile_step_begin(profile *p, int n_mods, k3rt_error *err);
/* Ends it (waits for the stream, reads the events); count = 0 drops it (warm-up). */
int profile_step_end(profile *p, int count, k3rt_error *err);
int profile_begin(profile *p, int row, k3rt_error *err);
int profile_end(profile *p, k3rt_error *err);

static inline int profile_module_row(int module, int backward)
{
    return PROF_MODULES + 2 * module + (backward != 0);
}

/* The hooks: nothing but a pointer test when p is NULL. */
static inline int prof_begin(profile *p, int row, k3rt_error *err)
{
    return p ? profile_begin(p, row, err) : K3RT_OK;
}
static inline int prof_end(profile *p, k3rt_error *err)
{
    return p ? profile_end(p, err) : K3RT_OK;
}
/* CALL (an int expression of `err`) timed as part `row`; returns its error. */
#define PROF_TRY(p, row, CALL)                 \
    do {                                       \
        K3RT_TRY(prof_begin((p), (row), err)); \
        K3RT_TRY(CALL);                        \
        K3RT_TRY(prof_end((p), err));          \
    } while (0)

#endif
