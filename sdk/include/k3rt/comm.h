/* k3rt/comm.h — collective communication between ranks, as a plugin uses it.
 *
 * A communicator has a rank and a size; the host hands a plugin the one it needs (the world
 * at create, the data-parallel group at a balancer's update) and owns the rest of the
 * collectives (k3rt/host.h). Every collective runs on a stream; buffers live on that stream's
 * device. Backends:
 * `local` (N ranks as threads of one process, CPU memory), `mpi` (one process per rank under
 * mpirun) and `tcp` (one process per rank under k3rt launch or torchrun); on all three
 * reductions are summed in rank order, so every rank, and every backend, gets bit-identical
 * results. `nccl` (one process per GPU) is planned.
 */
#ifndef K3RT_COMM_H
#define K3RT_COMM_H

#include <stdint.h>
#include "errors.h"
#include "tensor.h"
#include "stream.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3rt_comm k3rt_comm;

typedef enum k3rt_reduce_op {
    K3RT_REDUCE_SUM = 0,
    K3RT_REDUCE_MAX = 1,
    K3RT_REDUCE_MIN = 2,
    K3RT_REDUCE_AVG = 3
} k3rt_reduce_op;

K3RT_API int k3rt_comm_rank(const k3rt_comm *c);
K3RT_API int k3rt_comm_size(const k3rt_comm *c);
K3RT_API const char *k3rt_comm_backend(const k3rt_comm *c);  /* "local", "mpi", "tcp" */

/* In-place is allowed where send == recv. Counts are in elements of dtype. */
K3RT_API int k3rt_all_reduce(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                             int64_t count, int dtype, int op, k3rt_error *err);
/* send holds count elements; recv holds count * size, rank-major. */
K3RT_API int k3rt_all_gather(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                             int64_t count, int dtype, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
