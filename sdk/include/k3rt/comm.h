/* k3rt/comm.h — collective communication between ranks.
 *
 * A communicator has a rank and a size and hands out sub-groups of the parallel plan (dp, ep,
 * cp). Every collective runs on a stream; buffers live on that stream's device. Backends:
 * `local` (N ranks as threads of one process, CPU memory; reductions are summed in rank order,
 * so every rank gets bit-identical results) and `nccl` (one process per GPU).
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

typedef enum k3rt_group {
    K3RT_GROUP_WORLD = 0,
    K3RT_GROUP_DP = 1,
    K3RT_GROUP_EP = 2,
    K3RT_GROUP_CP = 3
} k3rt_group;

K3RT_API int k3rt_comm_rank(const k3rt_comm *c);
K3RT_API int k3rt_comm_size(const k3rt_comm *c);
K3RT_API const char *k3rt_comm_backend(const k3rt_comm *c);  /* "local", "nccl" */
/* The sub-communicator of a plan axis; the world itself for K3RT_GROUP_WORLD. Owned by c. */
K3RT_API k3rt_comm *k3rt_comm_group(k3rt_comm *c, int group);

/* In-place is allowed where send == recv. Counts are in elements of dtype. */
K3RT_API int k3rt_all_reduce(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                             int64_t count, int dtype, int op, k3rt_error *err);
/* recv holds count elements; send holds count * size. */
K3RT_API int k3rt_reduce_scatter(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                                 int64_t count, int dtype, int op, k3rt_error *err);
/* send holds count elements; recv holds count * size, rank-major. */
K3RT_API int k3rt_all_gather(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                             int64_t count, int dtype, k3rt_error *err);
/* Counts and displacements per peer, in elements. */
K3RT_API int k3rt_all_to_all_v(k3rt_comm *c, k3rt_stream *s, const void *send,
                               const int64_t *send_counts, const int64_t *send_displs, void *recv,
                               const int64_t *recv_counts, const int64_t *recv_displs, int dtype,
                               k3rt_error *err);
K3RT_API int k3rt_send(k3rt_comm *c, k3rt_stream *s, const void *buf, int64_t count, int dtype,
                       int peer, k3rt_error *err);
K3RT_API int k3rt_recv(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype,
                       int peer, k3rt_error *err);
K3RT_API int k3rt_broadcast(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype,
                            int root, k3rt_error *err);
K3RT_API int k3rt_barrier(k3rt_comm *c, k3rt_stream *s, k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
