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
 * both give the same bits; the other ranks' copies of a tensor's gradient are left partial. A checkpoint gathers the state to rank 0 and writes it in the unsharded layout
 * (parameter order), so the file does not depend on the plan. */
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

/* ---- gathering the state for a checkpoint ------------------------------------------------ */

/* One state tensor on the wire: the fixed header, then the name, then the bytes. */
typedef struct wire_item {
    int32_t name_len, dtype, ndim, pad;
    int64_t shape[K3RT_MAX_DIMS];
    int64_t bytes;
} wire_item;

/* This rank's optimizer state (but the shared "step") as one host buffer. */
static int pack(rank_ctx *c, char **out, int64_t *len, k3rt_error *err)
{
    struct k3rt_tensor_sink s;
    K3RT_TRY(rig_state(&c->opt, &s, err));
    int64_t total = 0;
    for (int i = 0; i < s.n; i++)
        total += (int64_t)sizeof(wire_item) + (int64_t)strlen(s.items[i].name) +
                 k3rt_tensor_numel(&s.items[i].t) *
                     (int64_t)k3rt_dtype_size(s.items[i].t.dtype);
    char *buf = malloc((size_t)total + 1), *at = buf;
    int rc = buf ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s.n && !rc; i++) {
        const tensor_sink_item *it = &s.items[i];
        if (!strcmp(it->name, "step"))
            continue;
        wire_item w = {(int32_t)strlen(it->name), it->t.dtype, it->t.ndim, 0, {0}, 0};
        memcpy(w.shape, it->t.shape, sizeof w.shape);
        w.bytes = k3rt_tensor_numel(&it->t) * (int64_t)k3rt_dtype_size(it->t.dtype);
        memcpy(at, &w, sizeof w);
        memcpy(at + sizeof w, it->name, (size_t)w.name_len);
        at += sizeof w + (size_t)w.name_len;
        rc = k3rt_memcpy(c->stream, at, K3RT_DEVICE_CPU, it->t.data, it->t.device,
                         (size_t)w.bytes, err);
        at += w.bytes;
    }
    if (!rc)
        rc = k3rt_stream_sync(c->stream, err);
    tensor_sink_free(&s);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = at - buf;
    return K3RT_OK;
}

/* The parameter a state item belongs to: its name less the last ".suffix". */
static int param_of(const model *m, const char *item)
{
    const char *dot = strrchr(item, '.');
    size_t n = dot ? (size_t)(dot - item) : strlen(item);
    for (int i = 0; i < m->n_params; i++)
        if (strlen(m->params[i].name) == n && !strncmp(m->params[i].name, item, n))
            return i;
    return -1;
}

typedef struct item_ref {
    int param, seq;
    char name[128];
    k3rt_tensor t;
} item_ref;

static int by_param(const void *a, const void *b)
{
    const item_ref *x = a, *y = b;
    return x->param != y->param ? (x->param > y->param) - (x->param < y->param)
                                : (x->seq > y->seq) - (x->seq < y->seq);
}

/* Counts the items of one blob. */
static int count_items(const char *blob, int64_t len)
{
    int n = 0;
    for (const char *at = blob; at < blob + len; n++) {
        wire_item w;
        memcpy(&w, at, sizeof w);
        at += sizeof w + (size_t)w.name_len + (size_t)w.bytes;
    }
    return n;
}

/* Rank 0: every rank's items (blobs[q], rank 0's own too) in parameter order, then "step". */
static int assemble(rank_ctx *c, char **blobs, const int64_t *lens, k3rt_tensor_sink *out,
                    k3rt_error *err)
{
    int total = 0, n = 0, rc = K3RT_OK;
    for (int q = 0; q < c->r->dp; q++)
        total += count_items(blobs[q], lens[q]);
    item_ref *items = calloc((size_t)total + 1, sizeof *items);
    if (!items)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int q = 0; q < c->r->dp && !rc; q++)
        for (char *at = blobs[q]; at < blobs[q] + lens[q] && !rc; n++) {
            wire_item w;
            memcpy(&w, at, sizeof w);
            item_ref *it = &items[n];
            snprintf(it->name, sizeof it->name, "%.*s", (int)w.name_len, at + sizeof w);
            it->param = param_of(&c->m, it->name);
            it->seq = n;
            it->t = (k3rt_tensor){at + sizeof w + w.name_len, w.dtype, K3RT_DEVICE_CPU, w.ndim,
                                  0, {0}};
            memcpy(it->t.shape, w.shape, sizeof w.shape);
            if (it->param < 0)
                rc = k3rt_fail(err, K3RT_ERR_INVALID, "shard_optimizer: optimizer state %s "
                               "names no parameter", it->name);
            at += sizeof w + (size_t)w.name_len + (size_t)w.bytes;
        }
    qsort(items, (size_t)n, sizeof *items, by_param);
    memset(out, 0, sizeof *out);
    for (int k = 0; k < n && !rc; k++)
        rc = k3rt_tensor_sink_add(out, items[k].name, items[k].t, K3RT_STAT_LOCAL, err);
    free(items);
    if (rc)
        return rc;
    /* the step counter is the same on every rank: rank 0's */
    struct k3rt_tensor_sink own;
    K3RT_TRY(rig_state(&c->opt, &own, err));
    for (int i = 0; i < own.n && !rc; i++)
        if (!strcmp(own.items[i].name, "step"))
            rc = k3rt_tensor_sink_add(out, "step", own.items[i].t, K3RT_STAT_LOCAL, err);
    tensor_sink_free(&own);
    return rc;
}

int shard_gather_state(rank_ctx *c, k3rt_tensor_sink *out, char ***keep, k3rt_error *err)
{
    int dp = c->r->dp;
    char **blobs = calloc((size_t)dp, sizeof *blobs);
    int64_t *lens = calloc((size_t)dp, sizeof *lens);
    int rc = blobs && lens ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = pack(c, &blobs[c->rank], &lens[c->rank], err);
    for (int q = 1; q < dp && !rc; q++) {
        if (c->rank == q) {
            rc = k3rt_send(c->dp, c->stream, &lens[q], 1, K3RT_I64, 0, err);
            if (!rc)
                rc = k3rt_send(c->dp, c->stream, blobs[q], lens[q], K3RT_U8, 0, err);
        } else if (c->rank == 0) {
            rc = k3rt_recv(c->dp, c->stream, &lens[q], 1, K3RT_I64, q, err);
            if (!rc && !(blobs[q] = malloc((size_t)lens[q] + 1)))
                rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
            if (!rc)
                rc = k3rt_recv(c->dp, c->stream, blobs[q], lens[q], K3RT_U8, q, err);
        }
    }
    if (!rc && c->rank == 0)
        rc = assemble(c, blobs, lens, out, err);
    if (rc || c->rank != 0) {
        for (int q = 0; blobs && q < dp; q++)
            free(blobs[q]);
        free(blobs);
        blobs = NULL;
    }
    free(lens);
    *keep = blobs;  /* rank 0: the buffers out's tensors point into (free with shard_release) */
    return rc;
}

void shard_release(rank_ctx *c, k3rt_tensor_sink *s, char **keep)
{
    tensor_sink_free(s);
    for (int q = 0; keep && q < c->r->dp; q++)
        free(keep[q]);
    free(keep);
}
