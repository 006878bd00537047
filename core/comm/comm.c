/* Public collective entry points (k3rt/comm.h): argument checks, then the backend. */
#include "comm/comm_impl.h"

#include <string.h>

int k3rt_comm_rank(const k3rt_comm *c) { return c ? c->rank : 0; }
int k3rt_comm_size(const k3rt_comm *c) { return c ? c->size : 1; }
const char *k3rt_comm_backend(const k3rt_comm *c) { return c ? c->ops->name : "none"; }

k3rt_comm *k3rt_comm_group(k3rt_comm *c, int group)
{
    if (!c || group < 0 || group > 3)
        return NULL;
    return c->groups[group] ? c->groups[group] : c;
}

static int check(k3rt_comm *c, int64_t count, int dtype, const char *what, k3rt_error *err)
{
    if (!c)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: no communicator", what);
    if (count < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: negative count", what);
    if (k3rt_dtype_size(dtype) == 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: invalid dtype", what);
    return K3RT_OK;
}

int k3rt_all_reduce(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv, int64_t count,
                    int dtype, int op, k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "all_reduce", err));
    return c->ops->all_reduce(c, send, recv, count, dtype, op, err);
}

int k3rt_reduce_scatter(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                        int64_t count, int dtype, int op, k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "reduce_scatter", err));
    return c->ops->reduce_scatter(c, send, recv, count, dtype, op, err);
}

int k3rt_all_gather(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv, int64_t count,
                    int dtype, k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "all_gather", err));
    return c->ops->all_gather(c, send, recv, count, dtype, err);
}

int k3rt_all_to_all_v(k3rt_comm *c, k3rt_stream *s, const void *send,
                      const int64_t *send_counts, const int64_t *send_displs, void *recv,
                      const int64_t *recv_counts, const int64_t *recv_displs, int dtype,
                      k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, 0, dtype, "all_to_all_v", err));
    return c->ops->all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts,
                                recv_displs, dtype, err);
}

int k3rt_send(k3rt_comm *c, k3rt_stream *s, const void *buf, int64_t count, int dtype,
              int peer, k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "send", err));
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return k3rt_fail(err, K3RT_ERR_INVALID, "send: bad peer %d (rank %d of %d)", peer,
                         c->rank, c->size);
    return c->ops->send(c, buf, count, dtype, peer, err);
}

int k3rt_recv(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype, int peer,
              k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "recv", err));
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return k3rt_fail(err, K3RT_ERR_INVALID, "recv: bad peer %d (rank %d of %d)", peer,
                         c->rank, c->size);
    return c->ops->recv(c, buf, count, dtype, peer, err);
}

int k3rt_broadcast(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype, int root,
                   k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, count, dtype, "broadcast", err));
    if (root < 0 || root >= c->size)
        return k3rt_fail(err, K3RT_ERR_INVALID, "broadcast: bad root %d", root);
    return c->ops->broadcast(c, buf, count, dtype, root, err);
}

int k3rt_barrier(k3rt_comm *c, k3rt_stream *s, k3rt_error *err)
{
    (void)s;
    K3RT_TRY(check(c, 0, K3RT_U8, "barrier", err));
    return c->ops->barrier(c, err);
}
