/* The activation planner (plan_act.h). */
#include "plan/plan_act.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { UNITS = 4096 };

static int allowed(const act_cost *c, int o)
{
    if (c->fixed >= 0)
        return o == c->fixed;
    if (c->no_recompute && o == ACT_RECOMPUTE)
        return 0;
    if (c->no_move && (o == ACT_OFFLOAD || o == ACT_FP8))
        return 0;
    return o != ACT_FP8 || c->fp8_ok;
}

/* Bytes, seconds and PCIe seconds of option o for all instances of class c. */
static void option(const act_plan *p, const act_cost *c, int o, double *mem, double *t,
                   double *pcie)
{
    double n = c->instances, b = c->bytes;
    *mem = *t = *pcie = 0;
    switch (o) {
    case ACT_KEEP: *mem = n * b; break;
    case ACT_FP8:
        *mem = n * b * (1 + 4.0 / 128) / (c->elem_bytes > 1 ? c->elem_bytes : 1);
        *t = 3 * n * b / p->hbm_bw;
        break;
    case ACT_OFFLOAD:
        *pcie = 2 * n * b / p->pcie_bw;
        *t = n * fmax(0, 2 * b / p->pcie_bw - c->overlap_s);
        break;
    default: *t = n * c->recompute_s;
    }
}

/* Exact DP over memory units for multiplier mu on PCIe seconds; the choice into policy. */
static int solve_dp(act_plan *p, double budget, double mu)
{
    double unit = budget / UNITS;
    double *best = malloc((size_t)(UNITS + 1) * sizeof *best);
    signed char *pick = malloc((size_t)p->n * (UNITS + 1));
    if (!best || !pick) {
        free(best);
        free(pick);
        return -1;
    }
    for (int u = 0; u <= UNITS; u++)
        best[u] = 0;
    /* best[u]: least cost of classes 0..i using at most u units; processed class by class
     * with the choice remembered for the walk back. */
    double *next = malloc((size_t)(UNITS + 1) * sizeof *next);
    if (!next) {
        free(best);
        free(pick);
        return -1;
    }
    for (int i = 0; i < p->n; i++) {
        for (int u = 0; u <= UNITS; u++) {
            next[u] = INFINITY;
            pick[(size_t)i * (UNITS + 1) + u] = -1;
        }
        for (int o = 0; o < ACT_POLICIES; o++) {
            if (!allowed(&p->cls[i], o))
                continue;
            double mem, t, pcie;
            option(p, &p->cls[i], o, &mem, &t, &pcie);
            /* memory rounds up: a plan the DP accepts fits for real */
            double need = unit > 0 ? ceil(mem / unit - 1e-9) : (mem > 0 ? INFINITY : 0);
            if (need > UNITS)
                continue;
            int w = (int)need;
            for (int u = w; u <= UNITS; u++) {
                double c = best[u - w] + t + mu * pcie;
                if (c < next[u]) {
                    next[u] = c;
                    pick[(size_t)i * (UNITS + 1) + u] = (signed char)o;
                }
            }
        }
        double *tmp = best;
        best = next;
        next = tmp;
    }
    int ok = isfinite(best[UNITS]);
    for (int i = p->n - 1, u = UNITS; ok && i >= 0; i--) {
        int o = pick[(size_t)i * (UNITS + 1) + u];
        double mem, t, pcie;
        option(p, &p->cls[i], o, &mem, &t, &pcie);
        p->cls[i].policy = o;
        u -= unit > 0 ? (int)ceil(mem / unit - 1e-9) : 0;
    }
    free(best);
    free(next);
    free(pick);
    return ok;
}

static void totals(act_plan *p)
{
    int moved = 0;
    p->peak = p->extra_s = p->pcie_s = 0;
    for (int i = 0; i < p->n; i++) {
        act_cost *c = &p->cls[i];
        option(p, c, c->policy, &c->mem, &c->time, &c->pcie);
        p->peak += c->mem;
        p->extra_s += c->time;
        p->pcie_s += c->pcie;
        moved |= c->policy != ACT_KEEP;
    }
    if (moved)
        p->peak += p->window;
}

int act_plan_solve(act_plan *p, k3rt_error *err)
{
    /* The smallest budget: every free class at its least memory, the window once. */
    int moved = 0;
    p->min_budget = 0;
    for (int i = 0; i < p->n; i++) {
        double least = INFINITY;
        for (int o = 0; o < ACT_POLICIES; o++) {
            double mem, t, pcie;
            if (!allowed(&p->cls[i], o))
                continue;
            option(p, &p->cls[i], o, &mem, &t, &pcie);
            least = fmin(least, mem);
            moved |= o != ACT_KEEP && mem < p->cls[i].bytes * p->cls[i].instances;
        }
        p->min_budget += least;
    }
    p->min_budget += moved ? p->window : 0;
    /* Everything kept, when it fits, costs nothing. */
    for (int i = 0; i < p->n; i++)
        p->cls[i].policy = p->cls[i].fixed >= 0 ? p->cls[i].fixed : ACT_KEEP;
    totals(p);
    if (p->peak <= p->budget && p->pcie_s <= p->pcie_capacity_s)
        return K3RT_OK;
    double room = p->budget - p->window;
    if (p->budget < p->min_budget || room <= 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "activations: a budget of %.2f GB cannot hold "
                         "them; the smallest that works is %.2f GB (every class the recipe "
                         "leaves free recomputed or offloaded, plus a %.2f GB staging window): "
                         "raise plan.memory_budget, shard more (dp, ep, pipeline stages) or "
                         "shrink plan.micro_batch", p->budget / 1e9, p->min_budget / 1e9,
                         p->window / 1e9);
    /* Bisect the PCIe multiplier: mu = 0 offloads freely; large mu never offloads. */
    double lo = 0, hi = 1;
    int r = solve_dp(p, room, 0);
    if (r < 0)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "activations: out of memory");
    totals(p);
    if (r && p->pcie_s <= p->pcie_capacity_s)
        return K3RT_OK;
    for (int k = 0; k < 60 && solve_dp(p, room, hi) == 1; k++) {
        totals(p);
        if (p->pcie_s <= p->pcie_capacity_s)
            break;
        lo = hi;
        hi *= 4;
    }
    for (int k = 0; k < 50; k++) {
        double mid = 0.5 * (lo + hi);
        if (solve_dp(p, room, mid) != 1)
            break;
        totals(p);
        if (p->pcie_s <= p->pcie_capacity_s)
            hi = mid;
        else
            lo = mid;
    }
    if (solve_dp(p, room, hi) != 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "activations: no choice fits %.2f GB within "
                         "the PCIe time; the smallest budget is %.2f GB", p->budget / 1e9,
                         p->min_budget / 1e9);
    totals(p);
    return K3RT_OK;
}
