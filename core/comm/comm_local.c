/* The `local` backend: N ranks as threads of one process, exchanging through shared memory.
 * Each collective publishes every rank's buffers, meets at a barrier, lets each rank compute
 * its own result from all inputs (reductions in rank order, so all ranks get the same bits),
 * and meets again before anyone may reuse its buffers. */
#include "comm/comm_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL_MAX_RANKS 64

typedef struct local_world {
    int size;
    pthread_barrier_t barrier;
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

static void meet(k3rt_comm *c) { pthread_barrier_wait(&world_of(c)->barrier); }

static int local_all_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, int op, k3rt_error *err)
{
    local_world *w = world_of(c);
    size_t bytes = (size_t)count * k3rt_dtype_size(dtype);
    void *acc = malloc(bytes ? bytes : 1);
    if (!acc)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "all_reduce: out of memory");
    w->send[c->rank] = send;
    meet(c);
    memcpy(acc, w->send[0], bytes);
    int rc = K3RT_OK;
    for (int r = 1; r < c->size && !rc; r++)
        rc = comm_reduce_into(acc, w->send[r], count, dtype, op, err);
    if (!rc && op == K3RT_REDUCE_AVG) {
        double inv = 1.0 / c->size;
        if (dtype == K3RT_F32)
            for (int64_t i = 0; i < count; i++)
                ((float *)acc)[i] = (float)(((float *)acc)[i] * inv);
        else if (dtype == K3RT_F64)
            for (int64_t i = 0; i < count; i++)
                ((double *)acc)[i] *= inv;
        else
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "all_reduce: AVG needs a float dtype");
    }
    meet(c);  /* everyone has read every send buffer: recv may now overwrite one */
    if (!rc)
        memcpy(recv, acc, bytes);
    free(acc);
    meet(c);
    return rc;
}

static int local_all_gather(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, k3rt_error *err)
{
    (void)err;
    local_world *w = world_of(c);
    size_t bytes = (size_t)count * k3rt_dtype_size(dtype);
    char *tmp = malloc(bytes * (size_t)c->size + 1);
    if (!tmp)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "all_gather: out of memory");
    w->send[c->rank] = send;
    meet(c);
    for (int r = 0; r < c->size; r++)
        memcpy(tmp + (size_t)r * bytes, w->send[r], bytes);
    meet(c);
    memcpy(recv, tmp, bytes * (size_t)c->size);
    free(tmp);
    meet(c);
    return K3RT_OK;
}

static int local_reduce_scatter(k3rt_comm *c, const void *send, void *recv, int64_t count,
                                int dtype, int op, k3rt_error *err)
{
    local_world *w = world_of(c);
    size_t es = k3rt_dtype_size(dtype), bytes = (size_t)count * es;
    void *acc = malloc(bytes ? bytes : 1);
    if (!acc)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "reduce_scatter: out of memory");
    w->send[c->rank] = send;
    meet(c);
    size_t offset = (size_t)c->rank * bytes;
    memcpy(acc, (const char *)w->send[0] + offset, bytes);
    int rc = K3RT_OK;
    for (int r = 1; r < c->size && !rc; r++)
        rc = comm_reduce_into(acc, (const char *)w->send[r] + offset, count, dtype,
                              op == K3RT_REDUCE_AVG ? K3RT_REDUCE_SUM : op, err);
    if (!rc && op == K3RT_REDUCE_AVG) {
        if (dtype == K3RT_F32)
            for (int64_t i = 0; i < count; i++)
                ((float *)acc)[i] /= (float)c->size;
        else if (dtype == K3RT_F64)
            for (int64_t i = 0; i < count; i++)
                ((double *)acc)[i] /= c->size;
    }
    meet(c);
    if (!rc)
        memcpy(recv, acc, bytes);
    free(acc);
    meet(c);
    return rc;
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
    (void)err;
    local_world *w = world_of(c);
    pthread_mutex_lock(&w->lock);
    while (w->mail[c->rank][peer])
        pthread_cond_wait(&w->changed, &w->lock);
    w->mail[c->rank][peer] = buf;
    w->mail_bytes[c->rank][peer] = count * (int64_t)k3rt_dtype_size(dtype);
    pthread_cond_broadcast(&w->changed);
    while (w->mail[c->rank][peer] == buf)
        pthread_cond_wait(&w->changed, &w->lock);
    pthread_mutex_unlock(&w->lock);
    return K3RT_OK;
}

static int local_recv(k3rt_comm *c, void *buf, int64_t count, int dtype, int peer,
                      k3rt_error *err)
{
    local_world *w = world_of(c);
    int64_t want = count * (int64_t)k3rt_dtype_size(dtype);
    pthread_mutex_lock(&w->lock);
    while (!w->mail[peer][c->rank])
        pthread_cond_wait(&w->changed, &w->lock);
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
    (void)err;
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
    (void)err;
    meet(c);
    return K3RT_OK;
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
};

static local_world *world_new(int size)
{
    local_world *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->size = size;
    pthread_barrier_init(&w->barrier, NULL, (unsigned)size);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->changed, NULL);
    return w;
}

static void world_free(local_world *w)
{
    if (!w)
        return;
    pthread_barrier_destroy(&w->barrier);
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
