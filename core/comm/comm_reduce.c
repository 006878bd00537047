/* Rank-ordered reductions shared by the backends (comm_reduce.h). */
#include "comm/comm_reduce.h"

#include <stdlib.h>
#include <string.h>

#define REDUCE_LOOP(T)                                                       \
    do {                                                                     \
        T *a = acc;                                                          \
        const T *b = src;                                                    \
        for (int64_t i = 0; i < count; i++) {                                \
            if (op == K3RT_REDUCE_MAX)                                       \
                a[i] = b[i] > a[i] ? b[i] : a[i];                            \
            else if (op == K3RT_REDUCE_MIN)                                  \
                a[i] = b[i] < a[i] ? b[i] : a[i];                            \
            else                                                             \
                a[i] += b[i];                                                \
        }                                                                    \
    } while (0)

int comm_reduce_into(void *acc, const void *src, int64_t count, int dtype, int op,
                     k3rt_error *err)
{
    if (op < K3RT_REDUCE_SUM || op > K3RT_REDUCE_AVG)
        return k3rt_fail(err, K3RT_ERR_INVALID, "reduce: unknown op %d", op);
    switch (dtype) {
    case K3RT_F32: REDUCE_LOOP(float); break;
    case K3RT_F64: REDUCE_LOOP(double); break;
    case K3RT_I32: REDUCE_LOOP(int32_t); break;
    case K3RT_I64: REDUCE_LOOP(int64_t); break;
    default:
        return k3rt_fail(err, K3RT_ERR_INVALID, "reduce: dtype %s cannot be reduced on the "
                         "CPU backends (f32, f64, i32, i64)", k3rt_dtype_name(dtype));
    }
    return K3RT_OK;
}

int comm_reduce_finish(void *acc, int64_t count, int dtype, int op, int ranks,
                       k3rt_error *err)
{
    if (op != K3RT_REDUCE_AVG)
        return K3RT_OK;
    if (dtype == K3RT_F32)
        for (int64_t i = 0; i < count; i++)
            ((float *)acc)[i] /= (float)ranks;
    else if (dtype == K3RT_F64)
        for (int64_t i = 0; i < count; i++)
            ((double *)acc)[i] /= ranks;
    else
        return k3rt_fail(err, K3RT_ERR_INVALID, "reduce: AVG needs a float dtype");
    return K3RT_OK;
}

/* Elements per pass: bounds the temporary buffers at about 2 x 32 MiB of f64 whatever the
 * count. */
#define DET_SEGMENT ((int64_t)1 << 22)

typedef struct det_plan {
    int64_t *sc, *sd, *rc, *rd;  /* all_to_all_v counts and displacements, size each */
} det_plan;

static int plan_alloc(det_plan *p, int size, k3rt_error *err)
{
    p->sc = calloc((size_t)size * 4, sizeof *p->sc);
    if (!p->sc)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "reduce: out of memory");
    p->sd = p->sc + size;
    p->rc = p->sd + size;
    p->rd = p->rc + size;
    return K3RT_OK;
}

/* Sums the size slices of `parts` (slice q at q * n) in rank order into out. */
static int sum_slices(k3rt_comm *c, const char *parts, int64_t n, int dtype, int op,
                      void *out, k3rt_error *err)
{
    size_t es = k3rt_dtype_size(dtype);
    memcpy(out, parts, (size_t)n * es);
    for (int q = 1; q < c->size; q++)
        K3RT_TRY(comm_reduce_into(out, parts + (size_t)q * (size_t)n * es, n, dtype, op, err));
    return comm_reduce_finish(out, n, dtype, op, c->size, err);
}

/* One segment of all_reduce: rank q reduces the q-th part of [0, n) and sends it to all. */
static int all_reduce_segment(k3rt_comm *c, const char *send, char *recv, int64_t n,
                              int dtype, int op, det_plan *p, char *parts, char *mine,
                              k3rt_error *err)
{
    int size = c->size;
    int64_t base = n / size, extra = n % size, off = 0, my_n = base + (c->rank < extra);
    for (int q = 0; q < size; q++) {
        p->sc[q] = base + (q < extra);
        p->sd[q] = off;
        off += p->sc[q];
        p->rc[q] = my_n;
        p->rd[q] = (int64_t)q * my_n;
    }
    K3RT_TRY(c->ops->all_to_all_v(c, send, p->sc, p->sd, parts, p->rc, p->rd, dtype, err));
    K3RT_TRY(sum_slices(c, parts, my_n, dtype, op, mine, err));
    /* second exchange: this rank's reduced part to every rank, every rank's into place */
    for (int q = 0; q < size; q++) {
        p->rc[q] = p->sc[q];
        p->rd[q] = p->sd[q];
        p->sc[q] = my_n;
        p->sd[q] = 0;
    }
    return c->ops->all_to_all_v(c, mine, p->sc, p->sd, recv, p->rc, p->rd, dtype, err);
}

int comm_det_all_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                        int op, k3rt_error *err)
{
    if (c->size == 1) {
        if (recv != send)
            memmove(recv, send, (size_t)count * k3rt_dtype_size(dtype));
        return comm_reduce_finish(recv, count, dtype, op, 1, err);
    }
    size_t es = k3rt_dtype_size(dtype);
    int64_t seg = count < DET_SEGMENT ? count : DET_SEGMENT;
    det_plan p = {0};
    K3RT_TRY(plan_alloc(&p, c->size, err));
    /* parts: size slices of one part; mine: this rank's reduced part; in: a copy of the
     * segment, as recv may alias send */
    int64_t part = seg / c->size + 1;
    char *parts = malloc((size_t)part * (size_t)c->size * es + 1);
    char *mine = malloc((size_t)part * es + 1), *in = malloc((size_t)seg * es + 1);
    int rc = parts && mine && in ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "all_reduce: out "
                                                        "of memory");
    for (int64_t at = 0; at < count && !rc; at += seg) {
        int64_t n = count - at < seg ? count - at : seg;
        memcpy(in, (const char *)send + (size_t)at * es, (size_t)n * es);
        rc = all_reduce_segment(c, in, (char *)recv + (size_t)at * es, n, dtype, op, &p, parts,
                                mine, err);
    }
    free(parts), free(mine), free(in), free(p.sc);
    if (rc)
        k3rt_error_prefix(err, "all_reduce: ");
    return rc;
}

int comm_det_reduce_scatter(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, int op, k3rt_error *err)
{
    size_t es = k3rt_dtype_size(dtype);
    det_plan p = {0};
    K3RT_TRY(plan_alloc(&p, c->size, err));
    char *parts = malloc((size_t)count * (size_t)c->size * es + 1);
    int rc = parts ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "reduce_scatter: out of memory");
    for (int q = 0; q < c->size; q++) {
        p.sc[q] = p.rc[q] = count;
        p.sd[q] = p.rd[q] = (int64_t)q * count;
    }
    if (!rc)
        rc = c->ops->all_to_all_v(c, send, p.sc, p.sd, parts, p.rc, p.rd, dtype, err);
    if (!rc)
        rc = sum_slices(c, parts, count, dtype, op, recv, err);
    free(parts), free(p.sc);
    if (rc)
        k3rt_error_prefix(err, "reduce_scatter: ");
    return rc;
}

int comm_det_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                    int op, int root, k3rt_error *err)
{
    if (root < 0 || root >= c->size)
        return k3rt_fail(err, K3RT_ERR_INVALID, "reduce: bad root %d (%d ranks)", root,
                         c->size);
    if (c->size == 1)
        return comm_det_all_reduce(c, send, recv, count, dtype, op, err);
    size_t es = k3rt_dtype_size(dtype);
    int64_t seg = count < DET_SEGMENT ? count : DET_SEGMENT;
    det_plan p = {0};
    K3RT_TRY(plan_alloc(&p, c->size, err));
    /* only the root receives: every rank's segment, slice q from rank q, summed in rank order */
    char *parts = c->rank == root ? malloc((size_t)seg * (size_t)c->size * es + 1) : NULL;
    int rc = parts || c->rank != root ? K3RT_OK
                                      : k3rt_fail(err, K3RT_ERR_NOMEM, "reduce: out of memory");
    for (int64_t at = 0; at < count && !rc; at += seg) {
        int64_t n = count - at < seg ? count - at : seg;
        for (int q = 0; q < c->size; q++) {
            p.sc[q] = q == root ? n : 0;
            p.sd[q] = 0;
            p.rc[q] = c->rank == root ? n : 0;
            p.rd[q] = c->rank == root ? (int64_t)q * n : 0;
        }
        rc = c->ops->all_to_all_v(c, (const char *)send + (size_t)at * es, p.sc, p.sd, parts,
                                  p.rc, p.rd, dtype, err);
        if (!rc && c->rank == root)
            rc = sum_slices(c, parts, n, dtype, op, (char *)recv + (size_t)at * es, err);
    }
    free(parts), free(p.sc);
    if (rc)
        k3rt_error_prefix(err, "reduce: ");
    return rc;
}
