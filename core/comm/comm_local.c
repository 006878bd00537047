/* The `local` backend: N ranks as threads of one process, exchanging through shared memory.
 * Each collective publishes every rank's buffers, meets at a barrier, lets each rank compute
 * its own result from all inputs (reductions in rank order, so all ranks get the same bits),
 * and meets again before anyone may reuse its buffers. */
#include "comm/comm_reduce.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL_MAX_RANKS 64

typedef struct local_world {
    int size;
    /* A barrier that can be broken: a rank that fails aborts the world, and every rank waiting
     * in (or later entering) a collective returns an error instead of hanging. */
    int arrived, generation, aborted;
    const void *send[LOCAL_MAX_RANKS];
    const int64_t *send_counts[LOCAL_MAX_RANKS];
    const int64_t *send_displs[LOCAL_MAX_RANKS];
    /* point-to-point mailboxes: slot[src][dst] */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    const void *mail[LOCAL_MAX_RANKS][LOCAL_MAX_RANKS];
    int64_t mail_bytes[LOCAL_MAX_RANKS][LOCAL_MAX_RANKS];
} local_world;

static local_world *world_of(k3rt_comm *c) { return c->impl; }

static int meet_(k3rt_comm *c, k3rt_error *err)
{
    local_world *w = world_of(c);
    pthread_mutex_lock(&w->lock);
    int gen = w->generation;
    if (!w->aborted && ++w->arrived == w->size) {
        w->arrived = 0;
        w->generation++;
        pthread_cond_broadcast(&w->changed);
    }
    while (!w->aborted && gen == w->generation)
        pthread_cond_wait(&w->changed, &w->lock);
    int aborted = w->aborted;
    pthread_mutex_unlock(&w->lock);
    if (aborted)
        return k3rt_fail(err, K3RT_ERR_COMM, "local backend: another rank failed; rank %d "
                         "stops", c->rank);
    return K3RT_OK;
}

#define meet(c) K3RT_TRY(meet_((c), err))

/* acc = op over ranks (in rank order) of every rank's send buffer at byte `offset`. */
static int reduce_ranks(k3rt_comm *c, size_t offset, int64_t count, int dtype, int op,
                        void *acc, k3rt_error *err)
{
    local_world *w = world_of(c);
    memcpy(acc, (const char *)w->send[0] + offset, (size_t)count * k3rt_dtype_size(dtype));
    for (int r = 1; r < c->size; r++)
        K3RT_TRY(comm_reduce_into(acc, (const char *)w->send[r] + offset, count, dtype, op,
                                  err));
    return comm_reduce_finish(acc, count, dtype, op, c->size, err);
}

/* Publishes send, lets fill() build this rank's result in a private buffer, and copies it to
 * recv only after every rank has read every send buffer (recv may alias send). */
typedef int (*local_fill_fn)(k3rt_comm *c, void *tmp, const void *args, k3rt_error *err);

static int exchange(k3rt_comm *c, const void *send, void *recv, size_t out_bytes,
                    local_fill_fn fill, const void *args, k3rt_error *err)
{
    local_world *w = world_of(c);
    void *tmp = malloc(out_bytes ? out_bytes : 1);
    if (!tmp)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "local backend: out of memory");
    w->send[c->rank] = send;
    int rc = meet_(c, err), filled = K3RT_ERR_COMM;
    if (!rc)
        filled = fill(c, tmp, args, err);
    if (!rc)
        rc = meet_(c, err);
    if (!rc && !filled)
        memcpy(recv, tmp, out_bytes);
    free(tmp);
    if (!rc)
        rc = meet_(c, err);
    return rc ? rc : filled;
}

typedef struct reduce_args {
    int64_t count;
    int dtype, op, scatter;
} reduce_args;

static int fill_reduce(k3rt_comm *c, void *tmp, const void *args, k3rt_error *err)
{
    const reduce_args *a = args;
    size_t offset = a->scatter ? (size_t)c->rank * (size_t)a->count * k3rt_dtype_size(a->dtype)
                               : 0;
    return reduce_ranks(c, offset, a->count, a->dtype, a->op, tmp, err);
}

static int fill_gather(k3rt_comm *c, void *tmp, const void *args, k3rt_error *err)
{
    (void)err;
    size_t bytes = *(const size_t *)args;
    for (int r = 0; r < c->size; r++)
        memcpy((char *)tmp + (size_t)r * bytes, world_of(c)->send[r], bytes);
    return K3RT_OK;
}

static int local_all_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, int op, k3rt_error *err)
{
    reduce_args a = {count, dtype, op, 0};
    return exchange(c, send, recv, (size_t)count * k3rt_dtype_size(dtype), fill_reduce, &a,
                    err);
}

static int local_reduce_scatter(k3rt_comm *c, const void *send, void *recv, int64_t count,
                                int dtype, int op, k3rt_error *err)
{
    reduce_args a = {count, dtype, op, 1};
    return exchange(c, send, recv, (size_t)count * k3rt_dtype_size(dtype), fill_reduce, &a,
                    err);
}

static int local_all_gather(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, k3rt_error *err)
{
    size_t bytes = (size_t)count * k3rt_dtype_size(dtype);
    return exchange(c, send, recv, bytes * (size_t)c->size, fill_gather, &bytes, err);
}

static int local_all_to_all_v(k3rt_comm *c, const void *send, const int64_t *send_counts,
                              const int64_t *send_displs, void *recv,
                              const int64_t *recv_counts, const int64_t *recv_displs,
                              int dtype, k3rt_error *err)
{
    local_world *w = world_of(c);
    size_t es = k3rt_dtype_size(dtype);
    w->send[c->rank] = send;
    w->send_counts[c->rank] = send_counts;
    w->send_displs[c->rank] = send_displs;
    meet(c);
    int rc = K3RT_OK;
    for (int r = 0; r < c->size; r++) {
        int64_t n = w->send_counts[r][c->rank];
        if (n != recv_counts[r]) {
            rc = k3rt_fail(err, K3RT_ERR_COMM,
                           "all_to_all_v: rank %d sends %lld elements to rank %d, which "
                           "expects %lld", r, (long long)n, c->rank, (long long)recv_counts[r]);
            break;
        }
        if (n > 0)  /* a rank that receives nothing may pass no buffer (comm_det_reduce) */
            memcpy((char *)recv + (size_t)recv_displs[r] * es,
                   (const char *)w->send[r] + (size_t)w->send_displs[r][c->rank] * es,
                   (size_t)n * es);
    }
    meet(c);
    return rc;
}

/* Rendezvous: the sender posts its buffer and waits until the receiver has copied it. */
static int local_send(k3rt_comm *c, const void *buf, int64_t count, int dtype, int peer,
                      k3rt_error *err)
{
    local_world *w = world_of(c);
    pthread_mutex_lock(&w->lock);
    while (w->mail[c->rank][peer] && !w->aborted)
        pthread_cond_wait(&w->changed, &w->lock);
    w->mail[c->rank][peer] = buf;
    w->mail_bytes[c->rank][peer] = count * (int64_t)k3rt_dtype_size(dtype);
    pthread_cond_broadcast(&w->changed);
    while (w->mail[c->rank][peer] == buf && !w->aborted)
        pthread_cond_wait(&w->changed, &w->lock);
    int aborted = w->aborted;
    pthread_mutex_unlock(&w->lock);
    if (aborted)
        return k3rt_fail(err, K3RT_ERR_COMM, "send: another rank failed");
    return K3RT_OK;
}

static int local_recv(k3rt_comm *c, void *buf, int64_t count, int dtype, int peer,
                      k3rt_error *err)
{
    local_world *w = world_of(c);
    int64_t want = count * (int64_t)k3rt_dtype_size(dtype);
    pthread_mutex_lock(&w->lock);
    while (!w->mail[peer][c->rank] && !w->aborted)
        pthread_cond_wait(&w->changed, &w->lock);
    if (w->aborted) {
        pthread_mutex_unlock(&w->lock);
        return k3rt_fail(err, K3RT_ERR_COMM, "recv: another rank failed");
    }
    int64_t got = w->mail_bytes[peer][c->rank];
    int rc = K3RT_OK;
    if (got != want)
        rc = k3rt_fail(err, K3RT_ERR_COMM, "recv: rank %d sent %lld bytes, rank %d expected "
                       "%lld", peer, (long long)got, c->rank, (long long)want);
    else
        memcpy(buf, w->mail[peer][c->rank], (size_t)got);
    w->mail[peer][c->rank] = NULL;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
    return rc;
}

static int local_broadcast(k3rt_comm *c, void *buf, int64_t count, int dtype, int root,
                           k3rt_error *err)
{
    local_world *w = world_of(c);
    w->send[c->rank] = buf;
    meet(c);
    if (c->rank != root)
        memcpy(buf, w->send[root], (size_t)count * k3rt_dtype_size(dtype));
    meet(c);
    return K3RT_OK;
}

static int local_barrier(k3rt_comm *c, k3rt_error *err)
{
    meet(c);
    return K3RT_OK;
}

static void local_abort(k3rt_comm *c)
{
    local_world *w = world_of(c);
    pthread_mutex_lock(&w->lock);
    w->aborted = 1;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->lock);
}

static const comm_ops local_ops = {
    .name = "local",
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .all_to_all_v = local_all_to_all_v,
    .send = local_send,
    .recv = local_recv,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .abort = local_abort,
};

static local_world *world_new(int size)
{
    local_world *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->size = size;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
    return w;
}

static void world_free(local_world *w)
{
    if (!w)
        return;
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->changed);
    free(w);
}

static k3rt_comm *comm_new(local_world *w, int rank)
{
    k3rt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->ops = &local_ops;
    c->rank = rank;
    c->size = w->size;
    c->impl = w;
    return c;
}

int comm_local_create(int size, k3rt_comm ***out, k3rt_error *err)
{
    if (size < 1 || size > LOCAL_MAX_RANKS)
        return k3rt_fail(err, K3RT_ERR_INVALID, "local backend: %d ranks (1..%d supported)",
                         size, LOCAL_MAX_RANKS);
    k3rt_comm **comms = calloc((size_t)size, sizeof *comms);
    local_world *w = world_new(size);
    if (!comms || !w) {
        free(comms);
        world_free(w);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "local backend: out of memory");
    }
    for (int r = 0; r < size; r++) {
        comms[r] = comm_new(w, r);
        local_world *solo = world_new(1);
        k3rt_comm *self = solo ? comm_new(solo, 0) : NULL;
        if (!comms[r] || !self) {
            world_free(solo);
            comm_local_destroy(comms, r + 1);
            return k3rt_fail(err, K3RT_ERR_NOMEM, "local backend: out of memory");
        }
        comms[r]->groups[K3RT_GROUP_WORLD] = comms[r];
        comms[r]->groups[K3RT_GROUP_DP] = comms[r];
        comms[r]->groups[K3RT_GROUP_EP] = self;
        comms[r]->groups[K3RT_GROUP_CP] = self;
        comms[r]->owns_groups = 1;
    }
    *out = comms;
    return K3RT_OK;
}

void comm_local_destroy(k3rt_comm **comms, int size)
{
    if (!comms)
        return;
    local_world *w = NULL;
    for (int r = 0; r < size; r++) {
        k3rt_comm *c = comms[r];
        if (!c)
            continue;
        w = c->impl;
        k3rt_comm *self = c->groups[K3RT_GROUP_EP];
        if (c->owns_groups && self && self != c) {
            world_free(self->impl);
            free(self);
        }
        free(c);
    }
    world_free(w);
    free(comms);
}
