/* What `k3rt plan` reports about a recipe (plan.h): filled by plan.c (the plan, parameters,
 * FLOPs) and plan_memory.c (memory and communication), printed by plan_print.c. */
#ifndef K3RT_PLAN_REPORT_H
#define K3RT_PLAN_REPORT_H

#include <stdint.h>
#include <k3rt/k3rt.h>

#define PLAN_MAX_COMPONENTS 32
#define PLAN_MAX_CP 8
#define PLAN_MAX_ACT_CLASSES 64
/* The planner's name for the engine's own per-sublayer inputs (keep or offload; offloading
 * them is planned only: the runtime keeps them). */
#define PLAN_SUBLAYER_INPUTS "engine.sublayer_inputs"

typedef struct plan_component {
    char name[96];                 /* "mixer K (kda)", "ffn (latent_moe): routed experts" */
    int instances;                 /* modules holding it (layers) */
    int64_t total, active;
    int expert;                    /* routed-expert matrices (sharded by ep) */
} plan_component;

/* The optimizer state one parameter element costs, by role, as the optimizer plugin sizes it
 * (measured on a small probe parameter of that role). */
typedef struct plan_role_state {
    int64_t numel;                 /* parameters of this role in the model */
    double values;                 /* fp32 state values per parameter element */
} plan_role_state;

/* Context parallelism of a stateful token mixer (KDA): the affine summary (M, B) every rank
 * all-gathers per layer. */
typedef struct plan_cp_state {
    char name[96];                 /* "mixer K (kda)" */
    int layers;
    int64_t m_elems, b_elems;      /* one rank's summary per micro-batch */
    double send_bytes;             /* fp32 (M, B) of one rank, per layer and micro-batch */
    double gather_bytes;           /* what one rank receives from the other cp - 1 */
} plan_cp_state;

/* Activation bytes of one part of the model for one micro-batch on one rank (f32 counts). */
typedef struct plan_act_part {
    char name[96];                 /* "mixer K (kda)", "model buffers", "largest workspace" */
    double bytes;
} plan_act_part;

/* One saved-tensor class as the activation planner placed it (plan_policy.c). */
typedef struct plan_act_class {
    char name[96];                 /* "mixer.K.activations" */
    int policy;                    /* act_policy */
    int fixed;                     /* set by plan.activations */
    int instances;
    double bytes;                  /* bf16 bytes of all instances when kept */
    double mem, extra_s;           /* as placed */
} plan_act_class;

typedef struct plan_report {
    char recipe[1024];
    int n_layers;
    int64_t d, vocab;
    char pattern[1024];            /* mixer letters, truncated with "..." when longer */
    int64_t total, active;
    plan_component comps[PLAN_MAX_COMPONENTS];
    int n_comps;
    /* FLOPs, from the plugins' counts at micro_batch x seq_len */
    double fwd_token, bwd_token;
    int64_t tokens_per_step, steps;
    double flops_per_step;         /* every micro-batch of every rank */
    /* the plan */
    int gpus, dp, ep, cp, pp, node_gpus, shard_optimizer, shard_gradients;
    /* pipeline (plan_memory.c): the largest stage's layers, micro-batches in flight on stage
     * 0 under 1F1B, the bubble, and one boundary's activations per micro-batch (bf16) */
    int stage_layers, in_flight;
    double bubble, pp_bytes;
    /* predicted step (plan_policy.c) */
    double step_compute_s, step_s, mfu;
    int64_t micro_batch, seq_len, grad_accum;
    /* memory per GPU, bytes */
    char optimizer[64];
    plan_role_state roles[K3RT_ROLE_COUNT_];
    double rank_params;            /* parameters one GPU holds */
    double mem_weights, mem_master, mem_grads, mem_optimizer, mem_activations, mem_total;
    double act_f32_bytes;          /* the plugins' f32 count for one micro-batch on one rank */
    plan_act_part acts[PLAN_MAX_COMPONENTS];
    int n_acts;
    double gpu_mem;
    int fits;
    /* activation policies (plan_policy.c) */
    plan_act_class act_cls[PLAN_MAX_ACT_CLASSES];
    int n_act_cls;
    double act_budget;             /* bytes the classes may use (budget minus the rest) */
    double act_kept_bytes;         /* the classes' bytes with everything kept */
    double act_peak, act_extra_s, act_pcie_s, act_min_budget;
    double mem_budget;             /* plan.memory_budget in bytes (gpu_mem when unset) */
    int act_solved;
    int act_runtime, act_no_fp8;   /* set from plan_options before plan_policies */
    char act_msg[512];             /* the planner's refusal, when it refused */
    /* expert parallelism (routed MoE layers) */
    int moe_layers, experts, top_k;
    int64_t dispatch_width, combine_width;
    double a2a_bytes;              /* per MoE layer, rank and micro-batch, forward (dispatch +
                                      combine, bf16); the backward moves as much again */
    double a2a_off_rank, a2a_off_node;  /* shares of it that leave the GPU / the node */
    /* context parallelism */
    plan_cp_state cps[PLAN_MAX_CP];
    int n_cps;
} plan_report;

#endif
