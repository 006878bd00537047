/* The activation planner: one policy per saved-tensor class under a memory budget, as a
 * multiple-choice knapsack (minimise the extra step time; device bytes within the budget;
 * offload copies within the PCIe time there is).
 *
 * For class i with b bytes per instance and n instances resident at the peak (layers of the
 * rank's stage times the micro-batches in flight):
 *   keep       n b bytes, no time
 *   fp8        n b (1 + 4/128) / elem bytes, 3 n b / HBM bandwidth (quantise, dequantise);
 *              GEMM-only classes
 *   offload    0 bytes; n (max(0, 2 b / PCIe - overlap)) s, 2 n b / PCIe of the PCIe capacity
 *   recompute  0 bytes, n recompute_s
 * plus a fixed staging window once anything leaves the device (its bytes are given). Solved
 * exactly by dynamic programming over memory in budget/4096 units, for a Lagrange multiplier
 * on PCIe time bisected until the copies fit the capacity. */
#ifndef K3RT_PLAN_ACT_H
#define K3RT_PLAN_ACT_H

#include <k3rt/k3rt.h>

#include "recipe/act_keys.h"

typedef struct act_cost {
    char name[96];
    double bytes;        /* one instance, device bytes when kept */
    double elem_bytes;   /* element size (fp8 saves 1 - (1 + 4/128) / elem_bytes) */
    int instances;       /* resident at the peak */
    int fp8_ok;
    double recompute_s;  /* one instance */
    double overlap_s;    /* compute an offload copy of one instance can hide behind */
    int fixed;           /* -1: the planner chooses; else the policy the recipe set */
    int no_recompute;    /* kept or moved only (the engine's own buffers) */
    int no_move;         /* kept or recomputed only */
    /* the solution */
    int policy;
    double mem, time, pcie;
} act_cost;

typedef struct act_plan {
    act_cost *cls;
    int n;
    double budget;       /* device bytes for the activations (everything else subtracted) */
    double window;       /* staging bytes once any class is not kept */
    double hbm_bw, pcie_bw;
    double pcie_capacity_s;
    /* the solution */
    double peak, extra_s, pcie_s;
    double min_budget;   /* the smallest budget any choice fits (set also on failure) */
} act_plan;

/* Fills policy/mem/time/pcie of every class and the totals. Fails (K3RT_ERR_INVALID) when
 * nothing fits, naming the smallest budget that works. */
int act_plan_solve(act_plan *p, k3rt_error *err);

#endif
