/* The `tcp` backend (comm_tcp.c): one rank per process, for jobs started without mpirun
 * (`k3rt launch`, torchrun, srun) on the CPU. */
#ifndef K3RT_COMM_TCP_H
#define K3RT_COMM_TCP_H

#include "comm/comm_env.h"
#include "comm/comm_impl.h"

/* Rank w->rank of w->size: rank 0 listens at MASTER_ADDR:MASTER_PORT, the others connect to
 * it (retrying for up to timeout_s seconds), learn each other's addresses from it and connect
 * pairwise. The job's size must be dp x ep x cp. */
int comm_tcp_create(const comm_world *w, const comm_mesh *mesh, double timeout_s,
                    k3rt_comm **out, k3rt_error *err);
void comm_tcp_destroy(k3rt_comm *c);

#endif
