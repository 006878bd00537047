/* The `mpi` backend (comm_mpi.c), built when CMake finds MPI (option K3RT_MPI). */
#ifndef K3RT_COMM_MPI_H
#define K3RT_COMM_MPI_H

#include "comm/comm_impl.h"

/* This process's rank of the MPI job (MPI_Init on first use), with one sub-communicator per
 * plan axis (MPI_Comm_split). The job's size must be dp x ep x cp. */
int comm_mpi_create(const comm_mesh *mesh, k3rt_comm **out, k3rt_error *err);
/* Frees the communicators and finalises MPI. */
void comm_mpi_destroy(k3rt_comm *c);

#endif
