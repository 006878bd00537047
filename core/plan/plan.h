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

#include "plan/plan_report.h"

typedef struct plan_options {
    const char *recipe_path;
    const char *const *overrides;  /* "--set" strings */
    int n_overrides;
    const char *plugin_path;       /* extra plugin directories, ':'-separated */
    int gpus;                      /* N: must equal dp * ep * cp */
    double gpu_mem;                /* bytes per GPU */
    int node_gpus;                 /* GPUs per node */
    int runtime;                   /* `k3rt train`: only what the runtime does (sublayer inputs
                                      kept; fp8 only where runtime_fp8) */
    int runtime_fp8;
} plan_options;

/* Loads the recipe (with overrides), declares its model and fills r. Errors name what is
 * wrong: a plan whose dp * ep * cp is not N, an ep that does not divide the experts, a cp that
 * does not divide seq_len. */
int plan_compute(const plan_options *o, plan_report *r, k3rt_error *err);
/* The same for a loaded, validated recipe document and its registry (`k3rt train` plans its
 * free activation classes with it; o->recipe_path only names the recipe in r). */
struct registry;
int plan_compute_doc(const json_t *doc, struct registry *reg, const plan_options *o,
                     plan_report *r, k3rt_error *err);

/* plan_print.c */
void plan_print(FILE *f, const plan_report *r);
json_t *plan_json(const plan_report *r);
/* The activation planner's part of both (`k3rt train` prints and records it too): the
 * per-class table, and "activation_policies" and "activation_plan" set into `into`. */
void plan_print_policies(FILE *f, const plan_report *r);
void plan_act_json_into(json_t *into, const plan_report *r);
/* "2.78T", "104.2B", "335.3M" */
void plan_human(double n, char *buf, size_t len);
/* "141.0 GB" (10^9 bytes, as GPU memory is quoted) */
void plan_bytes(double b, char *buf, size_t len);

#endif
