/* Memory per GPU and communication volumes of a declared model under a plan (plan_memory.c),
 * for plan.c. */
#ifndef K3RT_PLAN_MEMORY_H
#define K3RT_PLAN_MEMORY_H

#include <jansson.h>

#include "model/model.h"
#include "plan/plan_report.h"
#include "plugin/registry.h"

/* Optimizer probe, memory per GPU and communication volumes of a declared model (model.h)
 * under r's plan; the registry resolves the optimizer spec. */
int plan_memory(model *m, const json_t *doc, registry *reg, plan_report *r, k3rt_error *err);

/* A module's name in the report: "mixer K (kda)", "ffn (latent_moe)", "dense ffn (dense_glu)",
 * "residual (block_attnres)" */
void plan_module_name(const model *m, int module_index, char *buf, size_t len);

#endif
