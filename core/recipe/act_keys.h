/* The recipe's activation keys (plan.activations, plan.memory_budget): the policy names,
 * what a class pattern may contain, and the budget's forms. The schema validates with these;
 * the activation manager (model/actman.h) and the planner (plan/plan_act.h) read them. */
#ifndef K3RT_RECIPE_ACT_KEYS_H
#define K3RT_RECIPE_ACT_KEYS_H

typedef enum act_policy {
    ACT_KEEP = 0,       /* stays where the forward wrote it */
    ACT_RECOMPUTE = 1,  /* not stored: the module's forward runs again right before its backward */
    ACT_OFFLOAD = 2,    /* copied to a host arena after the forward, back before the backward */
    ACT_FP8 = 3,        /* stored as e4m3 with a scale per 1x128 tile (GEMM-only parts) */
    ACT_POLICIES = 4
} act_policy;

#define ACT_POLICY_LIST "keep|recompute|offload|fp8"

const char *act_policy_name(int policy);
/* -1 for a name outside ACT_POLICY_LIST. */
int act_policy_parse(const char *name);
/* 1 when a pattern is non-empty and uses only class-name characters (letters, digits, '_',
 * '.', '*', '?'). */
int act_glob_valid(const char *pattern);

/* plan.memory_budget as a string: "60%" (of the device's memory) or a size with a unit
 * ("96GB", "96 GiB", "512MB", "512MiB"); a number is bytes. Returns 0 and sets exactly one of
 * *bytes (> 0) or *fraction (in (0, 1]); -1 when the text is neither. */
int act_budget_parse(const char *text, double *bytes, double *fraction);

#endif
