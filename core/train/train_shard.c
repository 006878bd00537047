/* ZeRO-1 (plan.shard_optimizer): the optimizer state is split across the data-parallel
 * ranks by whole tensors. Each parameter has one owner, assigned greedily, largest tensor
 * first, to the rank holding the fewest bytes so far (ties: the lower index, the lower rank),
 * the same on every rank. Each gradient is reduced to its owner only (comm_det_reduce: the
 * rank-ordered sum all_reduce does, half the traffic); a rank creates its optimizer over the
 * tensors it owns only, steps them, and each owner then broadcasts its updated tensors.
 * Every parameter sees exactly the arithmetic it would see unsharded (the same reduced
 * gradient, the same rule, its own state), so the run is bitwise the same as without
 * sharding. With dp > 1, sharded or not, the gradient norm is the sum in parameter order of
 * each tensor's sum of squares, computed by its owner (one number per tensor exchanged), so
 * both give the same bits; the other ranks' copies of a tensor's gradient are left partial.
 * At a checkpoint each rank writes its own share of the state (ckpt_shard.c). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_reduce.h"
#include "plugin/sinks.h"
#include "train/train_internal.h"
#include "util/log.h"

int shard_on(const run *r)
{
    const json_t *plan = json_object_get(r->doc, "plan");
    return r->dp > 1 && !r->opt.dry_run &&
           json_is_true(json_object_get(plan, "shard_optimizer"));
}

/* The smallest (sign -1) or largest (sign 1) of v[0..n). */
static int64_t extreme(const int64_t *v, int n, int sign)
{
    int64_t best = v[0];
    for (int i = 1; i < n; i++)
        if ((sign < 0 && v[i] < best) || (sign > 0 && v[i] > best))
            best = v[i];
    return best;
}

int shard_setup(rank_ctx *c, k3rt_error *err)
{
    model *m = &c->m;
    int n = m->n_params, dp = c->r->dp;
    c->owner = calloc((size_t)n + 1, sizeof *c->owner);
    c->own = calloc((size_t)n + 1, sizeof *c->own);
    c->own_refs = calloc((size_t)n + 1, sizeof *c->own_refs);
    int *order = calloc((size_t)n + 1, sizeof *order);
    int64_t *load = calloc((size_t)dp, sizeof *load);
    if (!c->owner || !c->own || !c->own_refs || !order || !load) {
        free(order), free(load);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        order[i] = i;
    /* insertion sort by bytes, descending, stable (parameter counts are small) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && m->params[order[j]].numel > m->params[order[j - 1]].numel; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int sharded = shard_on(c->r);
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int q = 1; q < dp; q++)
            if (load[q] < load[best])
                best = q;
        c->owner[order[k]] = sharded ? best : c->rank;
        load[best] += m->params[order[k]].numel;
    }
    c->n_own = 0;
    for (int i = 0; i < n; i++)
        if (c->owner[i] == c->rank)
            c->own[c->n_own++] = i;
    c->sharded = sharded;
    if (sharded && c->rank == 0 && !c->r->opt.quiet)
        log_info("shard_optimizer: rank 0 holds the optimizer state of %d of %d parameters "
                 "(%.1f%% of the elements; ranks hold %lld to %lld elements)", c->n_own, n,
                 100.0 * (double)load[0] / (double)(m->total_numel ? m->total_numel : 1),
                 (long long)extreme(load, dp, -1), (long long)extreme(load, dp, 1));
    free(order), free(load);
    return K3RT_OK;
}

const k3rt_param_ref *shard_refs(rank_ctx *c)
{
    for (int k = 0; k < c->n_own; k++)
        c->own_refs[k] = c->refs[c->own[k]];
    return c->own_refs;
}

int shard_publish(rank_ctx *c, k3rt_error *err)
{
    model *m = &c->m;
    for (int i = 0; i < m->n_params; i++)
        K3RT_TRY(k3rt_broadcast(c->dp, c->stream, m->params[i].master.data,
                                m->params[i].numel, m->master_dtype, c->owner[i], err));
    return K3RT_OK;
}

int shard_reduce_grads(rank_ctx *c, k3rt_error *err)
{
    model *m = &c->m;
    for (int i = 0; i < m->n_params; i++)
        K3RT_TRY(comm_det_reduce(c->dp, m->params[i].grad.data, m->params[i].grad.data,
                                 m->params[i].numel, m->master_dtype, K3RT_REDUCE_AVG,
                                 c->owner[i], err));
    return K3RT_OK;
}

int shard_grad_sum_squares(rank_ctx *c, double *ss, k3rt_error *err)
{
    model *m = &c->m;
    if (c->r->dp == 1)
        return k3rt_sum_squares(c->stream, m->master_dtype, m->grad_buf, m->total_numel, ss,
                                err);
    double *part = calloc((size_t)m->n_params + 1, sizeof *part);
    if (!part)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = K3RT_OK;
    for (int i = 0; i < m->n_params && !rc; i++)
        if (c->owner[i] == c->rank)
            rc = k3rt_sum_squares(c->stream, m->master_dtype, m->params[i].grad.data,
                                  m->params[i].numel, &part[i], err);
    /* the other ranks hold 0 for a tensor they do not own, and x + 0 is x: the exchange is
     * exact, so every rank gets the owners' partial sums */
    if (!rc && c->sharded)
        rc = k3rt_all_reduce(c->dp, c->stream, part, part, m->n_params, K3RT_F64,
                             K3RT_REDUCE_SUM, err);
    *ss = 0.0;
    for (int i = 0; i < m->n_params && !rc; i++)
        *ss += part[i];
    free(part);
    return rc;
}

void shard_free(rank_ctx *c)
{
    free(c->owner), free(c->own), free(c->own_refs);
    c->owner = c->own = NULL;
    c->own_refs = NULL;
}
