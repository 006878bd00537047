/* The `tcp` backend: a full mesh of TCP connections between the processes of a job, one per
 * pair of ranks. Every collective is an exchange of length-prefixed messages with the peers
 * it involves, driven by poll() so that no pair can deadlock on full socket buffers;
 * reductions are comm_det_* (comm_reduce.h) over that exchange, the same rank-ordered sums as
 * the other backends.
 *
 * A rank that dies closes its sockets (the kernel does it even on SIGKILL), so every rank
 * that next talks to it gets an error naming it — its rank and pid — within the collective,
 * never a hang. A rank that fails with an error shuts its sockets down the same way
 * (comm_abort).
 *
 * Why k3rt has a transport of its own at all: Open MPI cannot join processes that mpirun did
 * not start, and torchrun, srun and `k3rt launch` start them (launch does so to see each
 * rank's pid and exit signal first-hand). This backend is for CPU ranks — tests, small CPU
 * jobs — and for the rendezvous at MASTER_ADDR:MASTER_PORT; it is not a data path for GPUs,
 * whose collectives belong to NCCL, nor for many CPU hosts, which belong to `mpi`. */
#include "comm/comm_tcp.h"
#include "comm/comm_reduce.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCP_MAGIC 0x6b337274u /* "k3rt" */

typedef struct tcp_impl {
    int *fd;        /* by group rank; -1 for this rank; borrowed from the world by groups */
    int *pid;       /* the peers' process ids, for messages */
    int *world;     /* group rank -> world rank */
    int owns;       /* the world: closes the sockets */
} tcp_impl;

static tcp_impl *impl_of(k3rt_comm *c) { return c->impl; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int peer_gone(k3rt_comm *c, int q, const char *what, const char *how, k3rt_error *err)
{
    tcp_impl *t = impl_of(c);
    return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: rank %d (pid %d) %s during %s on rank "
                     "%d: it stopped (failed or was killed); this rank stops too",
                     t->world[q], t->pid[q], how, what, t->world[c->rank]);
}

/* One peer's side of an exchange: an 8-byte length, then the bytes, each way. */
typedef struct xfer {
    const char *out;
    uint64_t out_len, out_done;   /* out_done counts the header's 8 bytes first */
    char *in;
    uint64_t in_len, in_done, in_hdr;
    unsigned char hdr_out[8], hdr_in[8];
    int sending, receiving;
} xfer;

static void put64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static int step_send(k3rt_comm *c, int q, xfer *x, const char *what, k3rt_error *err)
{
    int fd = impl_of(c)->fd[q];
    const char *p = x->out_done < 8 ? (const char *)x->hdr_out + x->out_done
                                    : x->out + (x->out_done - 8);
    size_t left = x->out_done < 8 ? 8 - x->out_done : x->out_len - (x->out_done - 8);
    ssize_t n = send(fd, p, left, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return K3RT_OK;
    if (n < 0)
        return peer_gone(c, q, what, "closed its connection", err);
    x->out_done += (uint64_t)n;
    if (x->out_done == x->out_len + 8)
        x->sending = 0;
    return K3RT_OK;
}

static int step_recv(k3rt_comm *c, int q, xfer *x, const char *what, k3rt_error *err)
{
    int fd = impl_of(c)->fd[q];
    char *p = x->in_hdr < 8 ? (char *)x->hdr_in + x->in_hdr : x->in + x->in_done;
    size_t left = x->in_hdr < 8 ? 8 - x->in_hdr : x->in_len - x->in_done;
    ssize_t n = recv(fd, p, left, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return K3RT_OK;
    if (n <= 0)
        return peer_gone(c, q, what, "closed its connection", err);
    if (x->in_hdr < 8) {
        x->in_hdr += (uint64_t)n;
        if (x->in_hdr == 8 && get64(x->hdr_in) != x->in_len)
            return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: %s: rank %d sent %llu bytes, "
                             "rank %d expected %llu", what, impl_of(c)->world[q],
                             (unsigned long long)get64(x->hdr_in), impl_of(c)->world[c->rank],
                             (unsigned long long)x->in_len);
    } else {
        x->in_done += (uint64_t)n;
    }
    if (x->in_hdr == 8 && x->in_done == x->in_len)
        x->receiving = 0;
    return K3RT_OK;
}

/* Sends out[q] (out_len[q] bytes, or nothing where out_len[q] < 0) to each peer q and receives
 * in_len[q] bytes (nothing where < 0) from it, all at once. The self entry is copied. */
static int exchange(k3rt_comm *c, const char *const *out, const int64_t *out_len,
                    char *const *in, const int64_t *in_len, const char *what, k3rt_error *err)
{
    int n = c->size, me = c->rank;
    xfer *x = calloc((size_t)n, sizeof *x);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    int *who = calloc((size_t)n, sizeof *who);
    int rc = x && pf && who ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory",
                                                  what);
    for (int q = 0; q < n && !rc; q++) {
        if (q == me) {
            if (out_len[q] >= 0 && in_len[q] > 0)  /* an empty entry may carry no buffer */
                memmove(in[q], out[q], (size_t)in_len[q]);
            continue;
        }
        if (out_len[q] >= 0) {
            x[q].out = out[q];
            x[q].out_len = (uint64_t)out_len[q];
            put64(x[q].hdr_out, x[q].out_len);
            x[q].sending = 1;
        }
        if (in_len[q] >= 0) {
            x[q].in = in[q];
            x[q].in_len = (uint64_t)in_len[q];
            x[q].receiving = 1;
        }
    }
    while (!rc) {
        int k = 0;
        for (int q = 0; q < n; q++)
            if (x[q].sending || x[q].receiving) {
                pf[k].fd = impl_of(c)->fd[q];
                pf[k].events = (short)((x[q].sending ? POLLOUT : 0) |
                                       (x[q].receiving ? POLLIN : 0));
                pf[k].revents = 0;
                who[k++] = q;
            }
        if (k == 0)
            break;
        if (poll(pf, (nfds_t)k, 1000) < 0 && errno != EINTR) {
            rc = k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: %s: poll: %s", what,
                           strerror(errno));
            break;
        }
        for (int i = 0; i < k && !rc; i++) {
            int q = who[i];
            if ((pf[i].revents & (POLLIN | POLLHUP | POLLERR)) && x[q].receiving)
                rc = step_recv(c, q, &x[q], what, err);
            else if (pf[i].revents & (POLLHUP | POLLERR))
                rc = peer_gone(c, q, what, "closed its connection", err);
            if (!rc && (pf[i].revents & POLLOUT) && x[q].sending)
                rc = step_send(c, q, &x[q], what, err);
        }
    }
    free(x), free(pf), free(who);
    return rc;
}

typedef struct tcp_bufs {
    const char **out;
    char **in;
    int64_t *out_len, *in_len;
} tcp_bufs;

static int bufs_alloc(tcp_bufs *b, int n, k3rt_error *err)
{
    b->out = calloc((size_t)n, sizeof *b->out);
    b->in = calloc((size_t)n, sizeof *b->in);
    b->out_len = calloc((size_t)n * 2, sizeof *b->out_len);
    if (!b->out || !b->in || !b->out_len) {
        free(b->out), free(b->in), free(b->out_len);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "tcp backend: out of memory");
    }
    b->in_len = b->out_len + n;
    for (int q = 0; q < 2 * n; q++)
        b->out_len[q] = -1;
    return K3RT_OK;
}

static void bufs_free(tcp_bufs *b) { free(b->out), free(b->in), free(b->out_len); }

static int tcp_all_to_all_v(k3rt_comm *c, const void *send, const int64_t *send_counts,
                            const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                            const int64_t *recv_displs, int dtype, k3rt_error *err)
{
    size_t es = k3rt_dtype_size(dtype);
    tcp_bufs b;
    K3RT_TRY(bufs_alloc(&b, c->size, err));
    for (int q = 0; q < c->size; q++) {
        b.out[q] = (const char *)send + (size_t)send_displs[q] * es;
        b.out_len[q] = send_counts[q] * (int64_t)es;
        b.in[q] = (char *)recv + (size_t)recv_displs[q] * es;
        b.in_len[q] = recv_counts[q] * (int64_t)es;
    }
    int rc = exchange(c, b.out, b.out_len, b.in, b.in_len, "all_to_all_v", err);
    bufs_free(&b);
    return rc;
}

static int tcp_all_gather(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                          k3rt_error *err)
{
    int64_t bytes = count * (int64_t)k3rt_dtype_size(dtype);
    /* recv may hold send: keep a copy of it while the others' parts land */
    char *mine = malloc((size_t)bytes + 1);
    tcp_bufs b;
    int rc = mine ? bufs_alloc(&b, c->size, err)
                  : k3rt_fail(err, K3RT_ERR_NOMEM, "all_gather: out of memory");
    if (rc) {
        free(mine);
        return rc;
    }
    memcpy(mine, send, (size_t)bytes);
    for (int q = 0; q < c->size; q++) {
        b.out[q] = mine;
        b.out_len[q] = bytes;
        b.in[q] = (char *)recv + (size_t)q * (size_t)bytes;
        b.in_len[q] = bytes;
    }
    rc = exchange(c, b.out, b.out_len, b.in, b.in_len, "all_gather", err);
    bufs_free(&b);
    free(mine);
    return rc;
}

static int tcp_point(k3rt_comm *c, const void *out, void *in, int64_t bytes, int peer,
                     const char *what, k3rt_error *err)
{
    tcp_bufs b;
    K3RT_TRY(bufs_alloc(&b, c->size, err));
    if (out) {
        b.out[peer] = out;
        b.out_len[peer] = bytes;
    } else {
        b.in[peer] = in;
        b.in_len[peer] = bytes;
    }
    int rc = exchange(c, b.out, b.out_len, b.in, b.in_len, what, err);
    bufs_free(&b);
    return rc;
}

static int tcp_send(k3rt_comm *c, const void *buf, int64_t count, int dtype, int peer,
                    k3rt_error *err)
{
    return tcp_point(c, buf, NULL, count * (int64_t)k3rt_dtype_size(dtype), peer, "send", err);
}

static int tcp_recv(k3rt_comm *c, void *buf, int64_t count, int dtype, int peer,
                    k3rt_error *err)
{
    return tcp_point(c, NULL, buf, count * (int64_t)k3rt_dtype_size(dtype), peer, "recv", err);
}

static int tcp_broadcast(k3rt_comm *c, void *buf, int64_t count, int dtype, int root,
                         k3rt_error *err)
{
    int64_t bytes = count * (int64_t)k3rt_dtype_size(dtype);
    tcp_bufs b;
    K3RT_TRY(bufs_alloc(&b, c->size, err));
    for (int q = 0; q < c->size; q++) {
        if (c->rank == root && q != root) {
            b.out[q] = buf;
            b.out_len[q] = bytes;
        }
    }
    if (c->rank != root) {
        b.in[root] = buf;
        b.in_len[root] = bytes;
    }
    int rc = exchange(c, b.out, b.out_len, b.in, b.in_len, "broadcast", err);
    bufs_free(&b);
    return rc;
}

static int tcp_barrier(k3rt_comm *c, k3rt_error *err)
{
    char none = 0;
    tcp_bufs b;
    K3RT_TRY(bufs_alloc(&b, c->size, err));
    for (int q = 0; q < c->size; q++) {
        b.out[q] = &none;
        b.in[q] = &none;
        b.out_len[q] = b.in_len[q] = q == c->rank ? -1 : 0;
    }
    int rc = exchange(c, b.out, b.out_len, b.in, b.in_len, "barrier", err);
    bufs_free(&b);
    return rc;
}

static void tcp_abort(k3rt_comm *c)
{
    tcp_impl *t = impl_of(c);
    for (int q = 0; q < c->size; q++)
        if (t->fd[q] >= 0)
            shutdown(t->fd[q], SHUT_RDWR);
}

static const comm_ops tcp_ops = {
    .name = "tcp",
    .all_reduce = comm_det_all_reduce,
    .all_gather = tcp_all_gather,
    .reduce_scatter = comm_det_reduce_scatter,
    .all_to_all_v = tcp_all_to_all_v,
    .send = tcp_send,
    .recv = tcp_recv,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .abort = tcp_abort,
};

/* ---- start-up --------------------------------------------------------------------------- */

/* What every rank tells the one it connects to. */
typedef struct hello {
    uint32_t magic, rank, size, pid, port, addr;  /* port, addr: where this rank listens */
} hello;

static int full_io(int fd, void *buf, size_t len, int writing, double deadline)
{
    char *p = buf;
    while (len) {
        struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0)
            return -1;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int listen_on(uint32_t addr, int port, int *fd_out, int *port_out, k3rt_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = addr;
    sa.sin_port = htons((uint16_t)port);
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int e = errno;
        close(fd);
        return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: cannot listen on %s:%d: %s",
                         inet_ntoa(*(struct in_addr *)&addr), port, strerror(e));
    }
    *fd_out = fd;
    *port_out = ntohs(sa.sin_port);
    return K3RT_OK;
}

static int accept_one(int lfd, double deadline)
{
    struct pollfd pf = {lfd, POLLIN, 0};
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0)
        return -1;
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

/* Connects to addr:port, retrying until the deadline (the listener may not be up yet). */
static int connect_to(uint32_t addr, int port, double deadline)
{
    while (now_s() < deadline) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = addr;
        sa.sin_port = htons((uint16_t)port);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0)
            return fd;
        if (fd >= 0)
            close(fd);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int resolve(const char *host, uint32_t *addr, k3rt_error *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e || !res)
        return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: MASTER_ADDR = \"%s\": %s", host,
                         gai_strerror(e));
    *addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr;
    freeaddrinfo(res);
    return K3RT_OK;
}

static k3rt_comm *comm_alloc(int size)
{
    k3rt_comm *c = calloc(1, sizeof *c);
    tcp_impl *t = calloc(1, sizeof *t);
    if (t) {
        t->fd = malloc((size_t)size * sizeof *t->fd);
        t->pid = calloc((size_t)size, sizeof *t->pid);
        t->world = calloc((size_t)size, sizeof *t->world);
    }
    if (!c || !t || !t->fd || !t->pid || !t->world) {
        if (t)
            free(t->fd), free(t->pid), free(t->world);
        free(t), free(c);
        return NULL;
    }
    for (int q = 0; q < size; q++)
        t->fd[q] = -1;
    c->ops = &tcp_ops;
    c->size = size;
    c->impl = t;
    return c;
}

static void comm_release(k3rt_comm *c)
{
    if (!c)
        return;
    tcp_impl *t = c->impl;
    for (int q = 0; t->owns && q < c->size; q++)
        if (t->fd[q] >= 0)
            close(t->fd[q]);
    free(t->fd), free(t->pid), free(t->world);
    free(t), free(c);
}

/* Rank 0: accepts every other rank, then tells each where all of them listen. */
static int rendezvous_root(k3rt_comm *c, int lfd, hello *table, double deadline,
                           k3rt_error *err)
{
    tcp_impl *t = impl_of(c);
    for (int joined = 1; joined < c->size; joined++) {
        int fd = accept_one(lfd, deadline);
        hello h;
        if (fd < 0)
            return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: rank 0 waited for %d ranks at "
                             "MASTER_PORT; %d joined before the time-out (are they all "
                             "started, with the same MASTER_ADDR and MASTER_PORT?)",
                             c->size - 1, joined - 1);
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        if (full_io(fd, &h, sizeof h, 0, deadline) || h.magic != TCP_MAGIC ||
            (int)h.size != c->size || h.rank == 0 || (int)h.rank >= c->size ||
            t->fd[h.rank] >= 0 || getpeername(fd, (struct sockaddr *)&sa, &len)) {
            close(fd);
            return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: rank 0: a process that joined "
                             "is not rank 1..%d of a %d-rank k3rt job (WORLD_SIZE differs, "
                             "a rank is started twice, or another program uses MASTER_PORT)",
                             c->size - 1, c->size);
        }
        tune(fd);
        h.addr = sa.sin_addr.s_addr;
        table[h.rank] = h;
        t->fd[h.rank] = fd;
    }
    for (int q = 1; q < c->size; q++)
        if (full_io(t->fd[q], table, sizeof *table * (size_t)c->size, 1, deadline))
            return peer_gone(c, q, "start-up", "closed its connection", err);
    return K3RT_OK;
}

/* The other ranks: join rank 0, learn the table, connect to lower ranks, accept higher ones. */
static int rendezvous_peer(k3rt_comm *c, const comm_world *w, int lfd, hello *table,
                           double deadline, k3rt_error *err)
{
    tcp_impl *t = impl_of(c);
    uint32_t master;
    K3RT_TRY(resolve(w->addr, &master, err));
    int fd = connect_to(master, w->port, deadline);
    if (fd < 0)
        return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: rank %d could not reach rank 0 at "
                         "MASTER_ADDR:MASTER_PORT = %s:%d before the time-out", c->rank,
                         w->addr, w->port);
    tune(fd);
    t->fd[0] = fd;
    if (full_io(fd, &table[c->rank], sizeof *table, 1, deadline) ||
        full_io(fd, table, sizeof *table * (size_t)c->size, 0, deadline))
        return peer_gone(c, 0, "start-up", "closed its connection", err);
    for (int q = 1; q < c->rank; q++) {
        /* rank 0 saw q's address as its peer address; q listens there */
        int pfd = connect_to(table[q].addr, (int)table[q].port, deadline);
        if (pfd < 0 || full_io(pfd, &table[c->rank], sizeof *table, 1, deadline)) {
            if (pfd >= 0)
                close(pfd);
            return peer_gone(c, q, "start-up", "could not be reached", err);
        }
        tune(pfd);
        t->fd[q] = pfd;
    }
    for (int k = c->rank + 1; k < c->size; k++) {
        hello h;
        int pfd = accept_one(lfd, deadline);
        if (pfd < 0 || full_io(pfd, &h, sizeof h, 0, deadline) || h.magic != TCP_MAGIC ||
            (int)h.rank <= c->rank || (int)h.rank >= c->size || t->fd[h.rank] >= 0) {
            if (pfd >= 0)
                close(pfd);
            return k3rt_fail(err, K3RT_ERR_COMM, "tcp backend: rank %d: the higher ranks did "
                             "not all connect before the time-out", c->rank);
        }
        tune(pfd);
        t->fd[h.rank] = pfd;
    }
    return K3RT_OK;
}

/* The sub-communicator of `group` over the world's sockets. */
static k3rt_comm *make_group(k3rt_comm *w, const comm_mesh *mesh, int group)
{
    int color, key, n = 0;
    comm_mesh_split(mesh, w->rank, group, &color, &key);
    k3rt_comm *g = comm_alloc(w->size);
    if (!g)
        return NULL;
    tcp_impl *gt = impl_of(g), *wt = impl_of(w);
    for (int k = 0; k < w->size; k++)  /* ranks of this colour, by key: key order = rank order */
        for (int r = 0; r < w->size; r++) {
            int cr, kr;
            comm_mesh_split(mesh, r, group, &cr, &kr);
            if (cr == color && kr == k) {
                if (r == w->rank)
                    g->rank = n;
                gt->fd[n] = wt->fd[r];
                gt->pid[n] = wt->pid[r];
                gt->world[n++] = r;
            }
        }
    g->size = n;
    return g;
}

int comm_tcp_create(const comm_world *w, const comm_mesh *mesh, double timeout_s,
                    k3rt_comm **out, k3rt_error *err)
{
    int world = mesh->dp * mesh->ep * mesh->cp;
    if (w->size != world)
        return k3rt_fail(err, K3RT_ERR_INVALID, "the job has %d processes (%s) but plan.dp x "
                         "plan.ep x plan.cp = %d x %d x %d = %d: start %d processes or change "
                         "the plan", w->size, w->source ? w->source : "one process", mesh->dp,
                         mesh->ep, mesh->cp, world, world);
    if (w->size > 1 && (!w->addr[0] || !w->port))
        return k3rt_fail(err, K3RT_ERR_INVALID, "tcp backend: a %d-process job (%s) needs "
                         "MASTER_ADDR and MASTER_PORT (where rank 0 listens)", w->size,
                         w->source ? w->source : "?");
    k3rt_comm *c = comm_alloc(w->size);
    hello *table = calloc((size_t)w->size, sizeof *table);
    if (!c || !table) {
        comm_release(c);
        free(table);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "tcp backend: out of memory");
    }
    tcp_impl *t = impl_of(c);
    t->owns = 1;
    c->rank = w->rank;
    int lfd = -1, port = 0, rc = K3RT_OK;
    double deadline = now_s() + timeout_s;
    uint32_t any = htonl(INADDR_ANY);
    if (w->size > 1) {
        if (w->rank == 0) {
            uint32_t at;
            rc = resolve(w->addr, &at, err);
            if (!rc)
                rc = listen_on(at, w->port, &lfd, &port, err);
        } else {
            rc = listen_on(any, 0, &lfd, &port, err);
        }
    }
    table[w->rank] = (hello){TCP_MAGIC, (uint32_t)w->rank, (uint32_t)w->size,
                             (uint32_t)getpid(), (uint32_t)port, 0};
    if (!rc && w->size > 1)
        rc = w->rank == 0 ? rendezvous_root(c, lfd, table, deadline, err)
                          : rendezvous_peer(c, w, lfd, table, deadline, err);
    if (lfd >= 0)
        close(lfd);
    for (int q = 0; q < w->size; q++) {
        t->pid[q] = (int)table[q].pid;
        t->world[q] = q;
    }
    free(table);
    c->groups[K3RT_GROUP_WORLD] = c;
    c->owns_groups = 1;
    for (int g = K3RT_GROUP_DP; g <= K3RT_GROUP_CP && !rc; g++)
        if (!(c->groups[g] = make_group(c, mesh, g)))
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "tcp backend: out of memory");
    if (rc) {
        comm_tcp_destroy(c);
        return rc;
    }
    *out = c;
    return K3RT_OK;
}

void comm_tcp_destroy(k3rt_comm *c)
{
    if (!c)
        return;
    for (int g = K3RT_GROUP_DP; g <= K3RT_GROUP_CP; g++)
        if (c->groups[g] && c->groups[g] != c)
            comm_release(c->groups[g]);
    comm_release(c);
}
