/* The `mpi` backend: one rank per process through Open MPI (mpirun, or srun with PMIx).
 * Data movement maps onto MPI's own calls (Alltoallv, Allgather, Bcast, Send/Recv, Barrier);
 * reductions do not use MPI_Allreduce, whose summation order may depend on the algorithm
 * the library picks for the message size and process count: they run through
 * comm_det_* (comm_reduce.h) over MPI_Alltoallv, the same rank-ordered sums as the `local`
 * backend, so results are bit-identical on every rank and to the threads of `local`.
 * Errors come back (MPI_ERRORS_RETURN) as k3rt errors naming the call. */
#include "comm/comm_mpi.h"
#include "comm/comm_reduce.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <mpi.h>

typedef struct mpi_impl {
    MPI_Comm comm;
    int owns;  /* MPI_Comm_free at destroy (every communicator but MPI_COMM_WORLD) */
} mpi_impl;

static MPI_Comm comm_of(k3rt_comm *c) { return ((mpi_impl *)c->impl)->comm; }

static int mpi_check(k3rt_comm *c, int rc, const char *what, k3rt_error *err)
{
    if (rc == MPI_SUCCESS)
        return K3RT_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", rc);
    return k3rt_fail(err, K3RT_ERR_COMM, "mpi backend: %s failed on rank %d of %d: %s", what,
                     c->rank, c->size, msg);
}

#define MPI_TRY(c, call, what) K3RT_TRY(mpi_check((c), (call), (what), err))

/* MPI counts are int: byte counts above INT_MAX are refused by name. */
static int bytes_of(k3rt_comm *c, int64_t count, int dtype, const char *what, int *out,
                    k3rt_error *err)
{
    int64_t b = count * (int64_t)k3rt_dtype_size(dtype);
    if (b > INT_MAX)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "mpi backend: %s of %lld bytes on rank %d: "
                         "above MPI's int count (%d)", what, (long long)b, c->rank, INT_MAX);
    *out = (int)b;
    return K3RT_OK;
}

static int mpi_all_gather(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                          k3rt_error *err)
{
    int b = 0;
    K3RT_TRY(bytes_of(c, count * c->size, dtype, "all_gather", &b, err));
    b /= c->size;
    MPI_TRY(c, MPI_Allgather(send == recv ? MPI_IN_PLACE : send, b, MPI_BYTE, recv, b, MPI_BYTE,
                             comm_of(c)), "MPI_Allgather (all_gather)");
    return K3RT_OK;
}

static int mpi_all_to_all_v(k3rt_comm *c, const void *send, const int64_t *send_counts,
                            const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                            const int64_t *recv_displs, int dtype, k3rt_error *err)
{
    int n = c->size, *v = malloc((size_t)n * 4 * sizeof *v);
    if (!v)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "all_to_all_v: out of memory");
    const int64_t *src[4] = {send_counts, send_displs, recv_counts, recv_displs};
    int rc = K3RT_OK;
    for (int k = 0; k < 4 && !rc; k++)
        for (int q = 0; q < n && !rc; q++)
            rc = bytes_of(c, src[k][q], dtype, "all_to_all_v", &v[k * n + q], err);
    if (!rc)
        rc = mpi_check(c, MPI_Alltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n,
                                        MPI_BYTE, comm_of(c)),
                       "MPI_Alltoallv (all_to_all_v)", err);
    free(v);
    return rc;
}

static int mpi_send(k3rt_comm *c, const void *buf, int64_t count, int dtype, int peer,
                    k3rt_error *err)
{
    int b = 0;
    K3RT_TRY(bytes_of(c, count, dtype, "send", &b, err));
    MPI_TRY(c, MPI_Send(buf, b, MPI_BYTE, peer, 0, comm_of(c)), "MPI_Send (send)");
    return K3RT_OK;
}

static int mpi_recv(k3rt_comm *c, void *buf, int64_t count, int dtype, int peer,
                    k3rt_error *err)
{
    int b = 0, got = 0;
    K3RT_TRY(bytes_of(c, count, dtype, "recv", &b, err));
    MPI_Status st;
    MPI_TRY(c, MPI_Recv(buf, b, MPI_BYTE, peer, 0, comm_of(c), &st), "MPI_Recv (recv)");
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != b)
        return k3rt_fail(err, K3RT_ERR_COMM, "recv: rank %d sent %d bytes, rank %d expected %d",
                         peer, got, c->rank, b);
    return K3RT_OK;
}

static int mpi_broadcast(k3rt_comm *c, void *buf, int64_t count, int dtype, int root,
                         k3rt_error *err)
{
    int b = 0;
    K3RT_TRY(bytes_of(c, count, dtype, "broadcast", &b, err));
    MPI_TRY(c, MPI_Bcast(buf, b, MPI_BYTE, root, comm_of(c)), "MPI_Bcast (broadcast)");
    return K3RT_OK;
}

static int mpi_barrier(k3rt_comm *c, k3rt_error *err)
{
    MPI_TRY(c, MPI_Barrier(comm_of(c)), "MPI_Barrier (barrier)");
    return K3RT_OK;
}

/* A rank that fails must take the job down: the others may be inside a collective that
 * would never complete. mpirun then stops every process. */
static void mpi_abort(k3rt_comm *c)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(comm_of(c), 1);
}

static const comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = comm_det_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = comm_det_reduce_scatter,
    .all_to_all_v = mpi_all_to_all_v,
    .send = mpi_send,
    .recv = mpi_recv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
};

static k3rt_comm *wrap(MPI_Comm mc, int owns)
{
    k3rt_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c), free(m);
        return NULL;
    }
    m->comm = mc;
    m->owns = owns;
    c->ops = &mpi_ops;
    c->impl = m;
    MPI_Comm_rank(mc, &c->rank);
    MPI_Comm_size(mc, &c->size);
    return c;
}

static void unwrap(k3rt_comm *c)
{
    if (!c)
        return;
    mpi_impl *m = c->impl;
    if (m && m->owns)
        MPI_Comm_free(&m->comm);
    free(m);
    free(c);
}

int comm_mpi_create(const comm_mesh *mesh, k3rt_comm **out, k3rt_error *err)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        /* Only the thread that created the communicator calls MPI (OpenMP workers never do). */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return k3rt_fail(err, K3RT_ERR_COMM, "mpi backend: MPI_Init_thread failed");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    k3rt_comm *w = wrap(MPI_COMM_WORLD, 0);
    if (!w)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "mpi backend: out of memory");
    int world = mesh->dp * mesh->ep * mesh->cp;
    if (w->size != world) {
        int size = w->size;
        unwrap(w);
        return k3rt_fail(err, K3RT_ERR_INVALID, "mpi backend: the job has %d processes but "
                         "plan.dp x plan.ep x plan.cp = %d x %d x %d = %d: start %d processes "
                         "or change the plan", size, mesh->dp, mesh->ep, mesh->cp, world, world);
    }
    w->groups[K3RT_GROUP_WORLD] = w;
    w->owns_groups = 1;
    int rc = K3RT_OK;
    for (int g = K3RT_GROUP_DP; g <= K3RT_GROUP_CP && !rc; g++) {
        int color, key;
        comm_mesh_split(mesh, w->rank, g, &color, &key);
        MPI_Comm sub;
        rc = mpi_check(w, MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub), "MPI_Comm_split",
                       err);
        if (!rc) {
            MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
            if (!(w->groups[g] = wrap(sub, 1)))
                rc = k3rt_fail(err, K3RT_ERR_NOMEM, "mpi backend: out of memory");
        }
    }
    if (rc) {
        comm_mpi_destroy(w);
        return rc;
    }
    *out = w;
    return K3RT_OK;
}

void comm_mpi_destroy(k3rt_comm *c)
{
    if (!c)
        return;
    for (int g = K3RT_GROUP_DP; g <= K3RT_GROUP_CP; g++)
        if (c->groups[g] != c)
            unwrap(c->groups[g]);
    unwrap(c);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Finalize();
}
