/* The communicator object behind k3rt/comm.h: a backend's function table plus rank, size and
 * the plan's sub-groups. */
#ifndef K3RT_COMM_IMPL_H
#define K3RT_COMM_IMPL_H

#include <k3rt/host.h>

typedef struct comm_ops {
    const char *name;
    int (*all_reduce)(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                      int op, k3rt_error *err);
    int (*all_gather)(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                      k3rt_error *err);
    int (*reduce_scatter)(k3rt_comm *c, const void *send, void *recv, int64_t count,
                          int dtype, int op, k3rt_error *err);
    int (*all_to_all_v)(k3rt_comm *c, const void *send, const int64_t *send_counts,
                        const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                        const int64_t *recv_displs, int dtype, k3rt_error *err);
    int (*send)(k3rt_comm *c, const void *buf, int64_t count, int dtype, int peer,
                k3rt_error *err);
    int (*recv)(k3rt_comm *c, void *buf, int64_t count, int dtype, int peer, k3rt_error *err);
    int (*broadcast)(k3rt_comm *c, void *buf, int64_t count, int dtype, int root,
                     k3rt_error *err);
    int (*barrier)(k3rt_comm *c, k3rt_error *err);
    /* A rank failed: make every rank's current and later collectives fail (local, tcp) or
     * end the job (mpi: MPI_Abort does not return). */
    void (*abort)(k3rt_comm *c);
} comm_ops;

struct k3rt_comm {
    const comm_ops *ops;
    int rank, size;
    void *impl;
    k3rt_comm *groups[4];  /* k3rt_group -> communicator (world at 0) */
    int owns_groups;
};

/* The plan's mesh: world = dp x ep x cp ranks, cp the fastest axis, then ep, then dp (as
 * Megatron orders them), so rank = (dp_i * ep + ep_i) * cp + cp_i. */
typedef struct comm_mesh {
    int dp, ep, cp;
} comm_mesh;

/* The colour (the other axes' coordinates) and key (this axis' coordinate) that put `rank`
 * into its group of K3RT_GROUP_DP, _EP or _CP (comm_mesh.c). */
void comm_mesh_split(const comm_mesh *m, int rank, int group, int *color, int *key);

/* `local`: size communicators for size threads of this process; comms[r] belongs to the
 * thread of rank r. Sub-groups: dp = the world, ep = cp = the rank alone (ep = cp = 1 until
 * expert and context parallelism land). */
int comm_local_create(int size, k3rt_comm ***comms, k3rt_error *err);
void comm_local_destroy(k3rt_comm **comms, int size);
/* A rank failed: c->ops->abort(c) (local: every current and later collective of c's world
 * returns an error). */
void comm_abort(k3rt_comm *c);

#endif
