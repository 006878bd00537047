/* The activation manager: every saved part a token mixer or FFN keeps from its forward for its
 * backward goes through it, placed by the policy of its class (model/act_policy.h).
 *
 *   keep       the part stays in the device region where the forward wrote it;
 *   recompute  the module's parts live in one scratch region shared by every recomputed
 *              module; right before the module's backward the engine runs its forward again on
 *              the same input (the engine keeps every sublayer input) — so when one class of a
 *              module is recomputed, all of that module's parts are;
 *   offload    the forward writes into a staging slot, the part is copied to a host arena and
 *              the slot poisoned (NaN bytes); in the backward it is loaded back into a slot,
 *              `prefetch` decoder layers ahead in backward order;
 *   fp8        like offload, but the copy is e4m3 codes with a scale per 1x128 tile, in device
 *              memory (parts the plugin flagged K3RT_SAVED_GEMM_ONLY, CPU only today).
 *
 * Copies are issued and waited for separately (store/load issue, wait) so a GPU copy stream
 * with events slots in; today they are enqueued on the compute stream, which orders them
 * (synchronous on the CPU). The residual plugin's saved parts are read by every sublayer and
 * are always kept. */
#ifndef K3RT_MODEL_ACTMAN_H
#define K3RT_MODEL_ACTMAN_H

#include <stdio.h>

#include <jansson.h>
#include <k3rt/k3rt.h>

#include "model/act_policy.h"

struct model;

typedef struct act_class {
    char name[96];           /* "mixer.K.activations" */
    int policy;              /* act_policy */
    int fixed;               /* chosen by plan.activations (else by the planner or keep) */
    int fp8_ok;              /* every part K3RT_SAVED_GEMM_ONLY with a float dtype */
    int module_kind;         /* K3RT_KIND_ATTENTION or K3RT_KIND_MOE */
    int instances;           /* layers holding it */
    int64_t bytes;           /* one instance, as declared (the largest instance) */
    double recompute_flops;  /* one instance: the module's forward */
} act_class;

typedef struct act_part {
    int module, index, cls, policy;
    int dtype;
    int64_t bytes;
    int64_t home;            /* keep: offset in the keep region; recompute: in the scratch;
                                offload / fp8: in a staging slot */
    int64_t copy;            /* offload: offset in the host arena; fp8: in the fp8 region */
} act_part;

typedef struct act_mod {
    int first, n;            /* its parts */
    int recompute;
    int moved;               /* index among modules with offload / fp8 parts, -1: none */
} act_mod;

typedef struct actman {
    act_class *cls;
    int n_cls;
    act_part *parts;
    int n_parts;
    act_mod *mods;           /* by model module index */
    int n_mods;
    int *moved_mod;          /* [n_moved] module index, in forward order */
    int n_moved, n_slots, prefetch, poison;
    int64_t keep_bytes, scratch_bytes, slot_bytes, fp8_bytes, host_bytes;
    char *dev;               /* keep | scratch | slots | fp8, inside the model's arena */
    char *host;              /* the offload arena (host memory) */
    int next_load;           /* backward: the next moved module (backward order) to load */
    /* counters of the current shape */
    int64_t stores, loads, recomputes;
    /* measured since actman_place: the most staging slots holding a module's parts at once,
     * and reloads whose load was issued only when their backward needed it (not prefetched
     * ahead: on a copy stream, the loads the backward would wait for) */
    int peak_slots;
    int64_t late_loads;
} actman;

/* The classes and parts of every token mixer and FFN at B x T, with the policies of
 * `policies` (plan.activations: {glob: policy}, may be NULL), and the region sizes. A
 * pattern that matches no class, fp8 on classes none of which may be stored in fp8, or fp8 on
 * a GPU run fail with a message naming the pattern and the classes. */
int actman_plan(struct model *m, int64_t B, int64_t T, const json_t *policies, actman *am,
                k3rt_error *err);
/* The same with the activation planner's choice for the classes `policies` leaves free
 * (`planned`: {exact class name: policy}, may be NULL; `k3rt train` under plan.memory_budget). */
int actman_plan_with(struct model *m, int64_t B, int64_t T, const json_t *policies,
                     const json_t *planned, actman *am, k3rt_error *err);
/* Device bytes of the regions (what the model's arena holds for the modules' saved parts). */
int64_t actman_device_bytes(const actman *am);
/* Binds every module to the region at dev and allocates the host arena. */
int actman_place(struct model *m, actman *am, void *dev, k3rt_error *err);
void actman_free(actman *am);

/* Around a module's calls (mi: the model's module index; modules outside the manager: no-op). */
int actman_before_forward(struct model *m, int mi, k3rt_error *err);
int actman_after_forward(struct model *m, int mi, int training, k3rt_error *err);
/* Start of the backward pass. */
void actman_begin_backward(struct model *m);
/* *recompute = 1: the caller runs the module's forward again before its backward. */
int actman_before_backward(struct model *m, int mi, int *recompute, k3rt_error *err);

/* The classes with their policies and the region sizes (`k3rt train --dry-run`). */
void actman_print(const actman *am, FILE *f);
/* Device bytes of the regions in use at the peak so far: kept parts, the recompute scratch
 * once a module recomputed, the staging slots that held parts at once, the fp8 copies. */
int64_t actman_peak_bytes(const actman *am);

#endif
