/* The communicators of a job, whichever backend carries them (comm_open.c): `local` threads
 * when this process is the whole job, else one rank per process over `mpi` (started by
 * mpirun) or `tcp` (started by `k3rt launch`, torchrun or srun). */
#ifndef K3RT_COMM_OPEN_H
#define K3RT_COMM_OPEN_H

#include "comm/comm_env.h"
#include "comm/comm_impl.h"

typedef struct comm_job {
    comm_world world;      /* the launcher's view: which process of how many */
    const char *backend;   /* "local", "mpi" or "tcp" */
    int first_rank;        /* the rank of this process's first communicator */
    int n_local;           /* communicators (rank threads) in this process */
    k3rt_comm **comms;     /* [n_local] */
} comm_job;

/* want: plan.comm ("auto", "local", "mpi", "tcp", "nccl"). The job's size must be
 * dp x ep x cp (the local backend: this process runs all of them as threads). */
int comm_open_job(const char *want, const comm_mesh *mesh, comm_job *job, k3rt_error *err);
void comm_close_job(comm_job *job);

#endif
