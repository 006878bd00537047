/* The plan as text (with its assumptions) and as JSON. */
#include "plan/plan.h"
#include "recipe/act_keys.h"

#include <math.h>
#include <string.h>

void plan_human(double n, char *buf, size_t len)
{
    double a = fabs(n);
    if (a >= 1e12)
        snprintf(buf, len, "%.2fT", n / 1e12);
    else if (a >= 1e9)
        snprintf(buf, len, "%.2fB", n / 1e9);
    else if (a >= 1e6)
        snprintf(buf, len, "%.2fM", n / 1e6);
    else if (a >= 1e3)
        snprintf(buf, len, "%.1fK", n / 1e3);
    else
        snprintf(buf, len, "%.0f", n);
}

void plan_bytes(double b, char *buf, size_t len)
{
    if (b >= 1e9)
        snprintf(buf, len, "%.1f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, len, "%.1f MB", b / 1e6);
    else
        snprintf(buf, len, "%.1f KB", b / 1e3);
}

/* FLOPs with an SI prefix: "640.0 G". */
static void flops_str(double f, char *buf, size_t len)
{
    const char *unit[] = {"", "K", "M", "G", "T", "P", "E", "Z", "Y"};
    int u = 0;
    while (fabs(f) >= 1000 && u < 8) {
        f /= 1000;
        u++;
    }
    snprintf(buf, len, "%.1f %s", f, unit[u]);
}

static void print_params(FILE *f, const plan_report *r)
{
    char t[32], a[32];
    fprintf(f, "\nparameters (total: every parameter; active: per token, LM head counted, "
               "embedding lookup not, top-k of the routed experts)\n");
    fprintf(f, "  %-44s %8s %12s %12s\n", "component", "modules", "total", "active");
    for (int i = 0; i < r->n_comps; i++) {
        const plan_component *c = &r->comps[i];
        char inst[16] = "-";
        if (c->instances)
            snprintf(inst, sizeof inst, "%d", c->instances);
        plan_human((double)c->total, t, sizeof t);
        plan_human((double)c->active, a, sizeof a);
        fprintf(f, "  %-44s %8s %12s %12s\n", c->name, inst, t, a);
    }
    plan_human((double)r->total, t, sizeof t);
    plan_human((double)r->active, a, sizeof a);
    fprintf(f, "  %-44s %8s %12s %12s\n", "total", "", t, a);
    fprintf(f, "  (exactly %lld total, %lld active)\n", (long long)r->total,
            (long long)r->active);
}

static void print_flops(FILE *f, const plan_report *r)
{
    char fw[32], bw[32], tot[32], six[32], step[32], run[32], tok[32];
    flops_str(r->fwd_token, fw, sizeof fw);
    flops_str(r->bwd_token, bw, sizeof bw);
    flops_str(r->fwd_token + r->bwd_token, tot, sizeof tot);
    flops_str(6.0 * (double)r->active, six, sizeof six);
    flops_str(r->flops_per_step, step, sizeof step);
    flops_str(r->flops_per_step * (double)r->steps, run, sizeof run);
    plan_human((double)r->tokens_per_step, tok, sizeof tok);
    fprintf(f, "\nFLOPs per token at seq_len %lld (the plugins' own counts + LM head): forward "
               "%sFLOP, backward %sFLOP, total %sFLOP (6 x active = %sFLOP)\n",
            (long long)r->seq_len, fw, bw, tot, six);
    fprintf(f, "training: %s tokens per step (micro_batch %lld x seq_len %lld x grad_accum %lld "
               "x dp %d x ep %d), %sFLOP per step, %sFLOP for train.steps = %lld\n",
            tok, (long long)r->micro_batch, (long long)r->seq_len, (long long)r->grad_accum,
            r->dp, r->ep, step, run, (long long)r->steps);
}

static void print_comm(FILE *f, const plan_report *r)
{
    char b[32], hb[32];
    if (r->moe_layers) {
        int64_t width = r->top_k * r->dispatch_width;
        fprintf(f, "\nexpert parallelism: %d routed MoE layers, %d experts, top-%d, %d per ep "
                   "rank\n", r->moe_layers, r->experts, r->top_k, r->experts / r->ep);
        fprintf(f, "  dispatch per token: top_k %d x width %lld = %lld values = %.4g x d_model "
                   "%lld", r->top_k, (long long)r->dispatch_width, (long long)width,
                (double)width / (double)r->d, (long long)r->d);
        if (width % r->d == 0)
            fprintf(f, ": the width top-%lld experts at full width would dispatch",
                    (long long)(width / r->d));
        fprintf(f, "\n");
        plan_bytes(r->a2a_bytes, b, sizeof b);
        fprintf(f, "  all-to-all per MoE layer, rank and micro-batch: %s forward (dispatch "
                   "%lld + combine %lld values per routed token, bf16), as much again in the "
                   "backward; %.1f%% leaves the GPU, %.1f%% the node\n", b,
                (long long)r->dispatch_width, (long long)r->combine_width,
                100 * r->a2a_off_rank, 100 * r->a2a_off_node);
    }
    for (int i = 0; i < r->n_cps; i++) {
        const plan_cp_state *s = &r->cps[i];
        plan_bytes(s->send_bytes, b, sizeof b);
        plan_bytes(s->gather_bytes, hb, sizeof hb);
        fprintf(f, "%scontext-parallel state (cp = %d): %s, %d layers: each rank all-gathers "
                   "its fp32 summary M (%lld values) + B (%lld) = %s per layer and "
                   "micro-batch", i ? "" : "\n", r->cp, s->name, s->layers,
                (long long)s->m_elems, (long long)s->b_elems, b);
        if (r->cp > 1)
            fprintf(f, ", and receives %s from the other %d ranks\n", hb, r->cp - 1);
        else
            fprintf(f, " (exchanged only when cp > 1)\n");
    }
}

/* The activation planner's choice per saved-tensor class (plan_policy.c). */
void plan_print_policies(FILE *f, const plan_report *r)
{
    char b[32], k[32], bud[32];
    plan_bytes(r->mem_budget, bud, sizeof bud);
    fprintf(f, "  activation policies (budget %s per GPU%s):\n", bud,
            r->act_solved ? "" : "; none fits");
    for (int i = 0; i < r->n_act_cls; i++) {
        const plan_act_class *c = &r->act_cls[i];
        plan_bytes(c->bytes, k, sizeof k);
        plan_bytes(c->mem, b, sizeof b);
        fprintf(f, "    %-30s x%-4d %-10s %s kept -> %s on the GPU, +%.1f ms per micro-batch%s\n",
                c->name, c->instances, act_policy_name(c->policy), k, b, 1e3 * c->extra_s,
                c->fixed ? " (recipe)" : "");
    }
    if (r->act_solved) {
        plan_bytes(r->act_peak, b, sizeof b);
        fprintf(f, "    saved activations at the peak %s (staging window included), extra time "
                "%.1f ms per micro-batch, PCIe busy %.1f ms\n", b, 1e3 * r->act_extra_s,
                1e3 * r->act_pcie_s);
    } else {
        fprintf(f, "    %s\n", r->act_msg);
    }
}

static void print_memory(FILE *f, const plan_report *r)
{
    char b[32], p[32];
    plan_human(r->rank_params, p, sizeof p);
    fprintf(f, "\nmemory per GPU (plan dp %d x ep %d x cp %d x pp %d = %d GPU%s, "
            "shard_optimizer = %s, shard_gradients = %s)\n", r->dp, r->ep, r->cp, r->pp,
            r->gpus, r->gpus > 1 ? "s" : "", r->shard_optimizer ? "true" : "false",
            r->shard_gradients ? "true" : "false");
    fprintf(f, "  parameters held            %s\n", p);
    const char *label[] = {"weights (bf16)", "master weights (fp32)", "gradients (fp32)",
                           "optimizer states (fp32)", "activations (bf16)"};
    double v[] = {r->mem_weights, r->mem_master, r->mem_grads, r->mem_optimizer,
                  r->mem_activations};
    for (int i = 0; i < 5; i++) {
        plan_bytes(v[i], b, sizeof b);
        fprintf(f, "  %-26s %s\n", label[i], b);
    }
    fprintf(f, "  activations by part (bf16):");
    for (int i = 0; i < r->n_acts; i++) {
        plan_bytes(0.5 * r->acts[i].bytes, b, sizeof b);
        fprintf(f, "%s %s %s", i ? "," : "", r->acts[i].name, b);
    }
    fprintf(f, "\n");
    fprintf(f, "  optimizer (%s) state per parameter, by role:", r->optimizer);
    for (int role = 1; role < K3RT_ROLE_COUNT_; role++)
        if (r->roles[role].numel)
            fprintf(f, " %s %.3g", k3rt_role_name(role), r->roles[role].values);
    fprintf(f, " (fp32 values)\n");
    plan_print_policies(f, r);
    char g[32];
    plan_bytes(r->mem_total, b, sizeof b);
    plan_bytes(r->gpu_mem, g, sizeof g);
    fprintf(f, "  %-26s %s of %s: %s\n", "total", b, g,
            r->fits ? "fits" : "does NOT fit");
}

/* The pipeline, the predicted step and MFU, and what of the plan k3rt can run today. */
static void print_step(FILE *f, const plan_report *r)
{
    char b[32];
    if (r->pp > 1) {
        plan_bytes(r->pp_bytes, b, sizeof b);
        fprintf(f, "\npipeline: %d stages of up to %d layers, 1F1B over %lld micro-batches: %d in "
                "flight on stage 0, bubble (p-1)/(m+p-1) = %.1f%%; each stage boundary sends %s "
                "per micro-batch forward and as much backward (bf16 [mb, seq/cp, d_model])\n",
                r->pp, r->stage_layers, (long long)r->grad_accum, r->in_flight,
                100 * r->bubble, b);
    }
    fprintf(f, "\npredicted step: compute %.2f s, step %.2f s, MFU %.1f%% of 725 TFLOP/s "
            "(assumptions below)\n", r->step_compute_s, r->step_s, 100 * r->mfu);
    int hs_moved = 0;
    for (int i = 0; i < r->n_act_cls; i++)
        hs_moved |= !strcmp(r->act_cls[i].name, PLAN_SUBLAYER_INPUTS) &&
                    r->act_cls[i].policy != ACT_KEEP;
    int today = r->pp == 1 && !r->shard_gradients && r->ep == 1 && r->cp == 1 && !hs_moved;
    fprintf(f, "runs in k3rt today: %s", today ? "yes" : "no —");
    if (r->pp > 1)
        fprintf(f, " no pipeline execution (plan.pp > 1 is planned only);");
    if (r->shard_gradients)
        fprintf(f, " gradients are not sharded (plan.shard_gradients is planned only);");
    if (hs_moved)
        fprintf(f, " the engine keeps every sublayer input on the device (offloading %s is "
                "planned only);", PLAN_SUBLAYER_INPUTS);
    if (r->ep > 1 || r->cp > 1)
        fprintf(f, " expert and context parallelism do not train across ranks yet (plan.ep, "
                "plan.cp);");
    fprintf(f, "\n");
}

static void print_assumptions(FILE *f, const plan_report *r)
{
    fprintf(f,
            "\nassumptions\n"
            "  - ranks = dp x ep x cp x pp = --gpus; each (dp, ep) pair trains its own "
            "micro-batches, cp splits each sequence, pp splits the layers into stages (the "
            "largest stage is sized, charged the embedding, head and final norm as well)\n"
            "  - every GPU of a stage holds the stage's non-expert parameters (no tensor "
            "parallelism); routed-expert matrices are split across the ep ranks and replicated "
            "across dp x cp\n"
            "  - bf16 weights (2 B), fp32 master weights (4 B), fp32 gradients (4 B), fp32 "
            "optimizer states as the optimizer plugin sizes them per role\n"
            "  - shard_optimizer = %s: master weights and optimizer states are %ssplit across "
            "the GPUs holding the same parameters (all %d of a stage for non-expert, dp x cp = %d "
            "for expert parameters); gradients too under shard_gradients (ZeRO-2): %s\n"
            "  - activations: the model's buffers, the plugins' saved bytes and the largest "
            "workspace for one micro-batch of %lld x %lld tokens, counted in f32 by the CPU "
            "plugins (%.1f GB kept) and halved for bf16; each saved-tensor class kept, "
            "recomputed (at 40%% of 725 TFLOP/s), offloaded (PCIe 50 GB/s each way, hidden "
            "behind the module's forward and backward) or stored in fp8, as the planner "
            "chooses within plan.memory_budget (default: the GPU's memory)\n"
            "  - all-to-all: uniform routing, bf16 tokens, ep the fastest axis of the rank "
            "layout (%d GPUs per node)\n"
            "  - step: compute at 40%% of 725 TFLOP/s on the largest stage plus the activation "
            "planner's extra time, over (1 - bubble); half the expert all-to-all exposed "
            "(off-node 50 GB/s, on-node 400 GB/s per GPU); data-parallel reductions and "
            "pipeline sends overlapped\n"
            "  - not counted: CUDA context, NCCL buffers, allocator fragmentation, the "
            "optimizer's scratch, the KDA conv halo and MLA's context-parallel key/value "
            "gather\n",
            r->shard_optimizer ? "true" : "false", r->shard_optimizer ? "" : "not ",
            r->gpus / r->pp, r->dp * r->cp, r->shard_gradients ? "true" : "false", (long long)r->micro_batch, (long long)(r->seq_len / r->cp),
            r->act_f32_bytes / 1e9, r->node_gpus);
}

void plan_print(FILE *f, const plan_report *r)
{
    fprintf(f, "k3rt plan: %s on %d GPU%s\n", r->recipe, r->gpus, r->gpus > 1 ? "s" : "");
    fprintf(f, "model: %d layers (pattern %s), d_model %lld, vocab %lld\n", r->n_layers,
            r->pattern, (long long)r->d, (long long)r->vocab);
    print_params(f, r);
    print_flops(f, r);
    print_comm(f, r);
    print_memory(f, r);
    print_step(f, r);
    print_assumptions(f, r);
}

void plan_act_json_into(json_t *into, const plan_report *r)
{
    json_t *policies = json_array();
    for (int i = 0; i < r->n_act_cls; i++)
        json_array_append_new(policies, json_pack("{s:s, s:s, s:b, s:i, s:f, s:f, s:f}", "class",
                                                  r->act_cls[i].name,
                                                  "policy", act_policy_name(r->act_cls[i].policy),
                                                  "recipe", r->act_cls[i].fixed, "instances",
                                                  r->act_cls[i].instances, "kept_bytes",
                                                  r->act_cls[i].bytes, "device_bytes",
                                                  r->act_cls[i].mem, "extra_s",
                                                  r->act_cls[i].extra_s));
    json_object_set_new(into, "activation_policies", policies);
    json_object_set_new(into, "activation_plan",
                        json_pack("{s:b, s:f, s:f, s:f, s:f, s:f, s:f, s:s}", "solved",
                                  r->act_solved, "budget", r->mem_budget, "total",
                                  r->mem_total, "peak", r->act_peak, "extra_s",
                                  r->act_extra_s, "pcie_s", r->act_pcie_s, "min_budget",
                                  r->act_min_budget, "message", r->act_msg));
}

json_t *plan_json(const plan_report *r)
{
    json_t *comps = json_array(), *cps = json_array(), *roles = json_object();
    for (int i = 0; i < r->n_comps; i++)
        json_array_append_new(comps, json_pack("{s:s, s:i, s:I, s:I, s:b}", "name",
                                               r->comps[i].name, "modules", r->comps[i].instances,
                                               "total", (json_int_t)r->comps[i].total, "active",
                                               (json_int_t)r->comps[i].active, "expert",
                                               r->comps[i].expert));
    for (int i = 0; i < r->n_cps; i++)
        json_array_append_new(cps, json_pack("{s:s, s:i, s:I, s:I, s:f, s:f}", "name",
                                             r->cps[i].name, "layers", r->cps[i].layers, "m",
                                             (json_int_t)r->cps[i].m_elems, "b",
                                             (json_int_t)r->cps[i].b_elems, "send_bytes",
                                             r->cps[i].send_bytes, "gather_bytes",
                                             r->cps[i].gather_bytes));
    for (int role = 1; role < K3RT_ROLE_COUNT_; role++)
        if (r->roles[role].numel)
            json_object_set_new(roles, k3rt_role_name(role), json_real(r->roles[role].values));
    json_t *acts = json_object();
    for (int i = 0; i < r->n_acts; i++)
        json_object_set_new(acts, r->acts[i].name, json_real(0.5 * r->acts[i].bytes));
    json_t *memory = json_pack(
        "{s:f, s:f, s:f, s:f, s:f, s:f, s:o, s:f, s:f, s:b, s:s, s:o}", "parameters",
        r->rank_params,
        "weights", r->mem_weights, "master", r->mem_master, "gradients", r->mem_grads,
        "optimizer", r->mem_optimizer, "activations", r->mem_activations, "activation_parts",
        acts, "total",
        r->mem_total, "gpu", r->gpu_mem, "fits", r->fits, "optimizer_plugin", r->optimizer,
        "state_values_per_param", roles);
    json_t *moe = json_pack("{s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:f}", "layers", r->moe_layers,
                            "experts", r->experts, "top_k", r->top_k, "dispatch_width",
                            (json_int_t)r->dispatch_width, "combine_width",
                            (json_int_t)r->combine_width, "a2a_bytes", r->a2a_bytes,
                            "off_rank", r->a2a_off_rank, "off_node", r->a2a_off_node);
    json_t *plan = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:b, s:b}", "gpus",
                             r->gpus, "dp", r->dp, "ep", r->ep, "cp", r->cp, "pp", r->pp,
                             "node_gpus", r->node_gpus, "micro_batch",
                             (json_int_t)r->micro_batch, "seq_len", (json_int_t)r->seq_len,
                             "grad_accum", (json_int_t)r->grad_accum, "shard_optimizer",
                             r->shard_optimizer, "shard_gradients", r->shard_gradients);
    plan_act_json_into(memory, r);
    json_t *step = json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "stage_layers",
                             r->stage_layers, "in_flight", r->in_flight, "bubble", r->bubble,
                             "stage_boundary_bytes", r->pp_bytes, "compute_s", r->step_compute_s,
                             "step_s", r->step_s, "mfu", r->mfu);
    return json_pack("{s:s, s:i, s:I, s:I, s:s, s:I, s:I, s:o, s:f, s:f, s:I, s:f, s:I, s:o, "
                     "s:o, s:o, s:o, s:o}",
                     "recipe", r->recipe, "layers", r->n_layers, "d_model", (json_int_t)r->d,
                     "vocab", (json_int_t)r->vocab, "pattern", r->pattern, "total",
                     (json_int_t)r->total, "active", (json_int_t)r->active, "components", comps,
                     "forward_flops_per_token", r->fwd_token, "backward_flops_per_token",
                     r->bwd_token, "tokens_per_step", (json_int_t)r->tokens_per_step,
                     "flops_per_step", r->flops_per_step, "steps", (json_int_t)r->steps,
                     "plan", plan, "memory", memory, "moe", moe, "context_parallel", cps,
                     "predicted_step", step);
}
