/* `k3rt plan`: what a recipe's model costs on N GPUs, computed from the plugins' own
 * declarations and counts without allocating a parameter, so that K3 (2.78T parameters) plans
 * on a laptop.
 *
 * Parameter counts come from the declared shapes (DESIGN.md: total = every parameter; active =
 * per token, the LM head counted, the embedding lookup not, top_k of the routed experts).
 * FLOPs come from each plugin's flops() plus the model's LM head. Memory per GPU follows the
 * recipe's parallel plan (plan_memory.c states every assumption it makes); communication is
 * the expert-parallel all-to-all and the context-parallel state summaries. */
#ifndef K3RT_PLAN_H
#define K3RT_PLAN_H

#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include <k3rt/k3rt.h>

#include "model/model.h"
#include "plugin/registry.h"

typedef struct plan_options {
    const char *recipe_path;
    const char *const *overrides;  /* "--set" strings */
    int n_overrides;
    const char *plugin_path;       /* extra plugin directories, ':'-separated */
    int gpus;                      /* N: must equal dp * ep * cp */
    double gpu_mem;                /* bytes per GPU */
    int node_gpus;                 /* GPUs per node */
} plan_options;

#define PLAN_MAX_COMPONENTS 32
#define PLAN_MAX_CP 8

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
    int gpus, dp, ep, cp, node_gpus, shard_optimizer;
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

/* Loads the recipe (with overrides), declares its model and fills r. Errors name what is
 * wrong: a plan whose dp * ep * cp is not N, an ep that does not divide the experts, a cp that
 * does not divide seq_len. */
int plan_compute(const plan_options *o, plan_report *r, k3rt_error *err);

/* plan_memory.c: optimizer probe, memory per GPU and communication volumes of a declared
 * model (model.h) under r's plan; the registry resolves the optimizer spec. */
int plan_memory(model *m, const json_t *doc, registry *reg, plan_report *r, k3rt_error *err);

/* "mixer K (kda)", "ffn (latent_moe)", "dense ffn (dense_glu)", "residual (block_attnres)" */
void plan_module_name(const model *m, int module_index, char *buf, size_t len);

/* plan_print.c */
void plan_print(FILE *f, const plan_report *r);
json_t *plan_json(const plan_report *r);
/* "2.78T", "104.2B", "335.3M" */
void plan_human(double n, char *buf, size_t len);
/* "141.0 GB" (10^9 bytes, as GPU memory is quoted) */
void plan_bytes(double b, char *buf, size_t len);

#endif
