/* Activation policies for `k3rt plan`: the model's saved-tensor classes (model/actman.h)
 * priced under stated assumptions and placed by the planner (plan_act.h) within
 * plan.memory_budget (or the GPU's memory), less everything that is not a saved activation. */
#ifndef K3RT_PLAN_POLICY_H
#define K3RT_PLAN_POLICY_H

#include <jansson.h>

#include "model/model.h"
#include "plan/plan_report.h"

/* Assumptions, printed by plan_print.c. */
#define PLAN_PEAK_FLOPS 725e12  /* measured bf16 GEMM peak of the project's H200 */
#define PLAN_MFU 0.4            /* the share of it recompute runs at */
#define PLAN_PCIE_BW 50e9       /* bytes/s each way, PCIe Gen5 x16 host link */
#define PLAN_HBM_BW 4.24e12     /* measured device copy bandwidth */
#define PLAN_NET_BW 50e9        /* bytes/s per GPU off the node (one 400 Gb/s NIC per GPU) */
#define PLAN_NVLINK_BW 400e9    /* bytes/s per GPU within the node */

/* Fills r->act_* after plan_memory: r->mem_activations and r->fits then reflect the plan. */
int plan_policies(model *m, const json_t *plan, plan_report *r, k3rt_error *err);

#endif
