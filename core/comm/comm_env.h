/* Which rank of which job this process is, from the variables the usual launchers set
 * (comm_env.c): Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE),
 * torchrun and `k3rt launch` (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT) and Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
 * SLURM_NTASKS_PER_NODE; MASTER_ADDR and MASTER_PORT from the job script). */
#ifndef K3RT_COMM_ENV_H
#define K3RT_COMM_ENV_H

#include <k3rt/errors.h>

typedef struct comm_world {
    const char *source;      /* "mpirun", "torchrun", "slurm" or NULL (a single process) */
    int rank, size, local_rank, local_size;
    char addr[256];          /* MASTER_ADDR ("" when unset) */
    int port;                /* MASTER_PORT (0 when unset) */
} comm_world;

/* Fills w; size 1 and source NULL when no launcher variables are set. Malformed or
 * inconsistent values (RANK >= WORLD_SIZE, a port out of range) are errors naming them. */
int comm_world_detect(comm_world *w, k3rt_error *err);

#endif
