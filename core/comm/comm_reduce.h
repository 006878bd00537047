/* Reductions every backend shares, so that all of them give the same bits:
 * comm_reduce_into folds one rank's buffer into an accumulator (the `local` backend sums the
 * ranks' buffers in rank order with it), and comm_det_* build reduce_scatter and all_reduce
 * from a backend's all_to_all_v alone: each rank receives its slice from every rank and sums
 * the slices in rank order 0, 1, ..., size-1, then (all_reduce) every rank's result is
 * exchanged again. The order never depends on timing or on the network, so every rank and
 * every backend (local threads, MPI processes, TCP processes) gets bit-identical results. */
#ifndef K3RT_COMM_REDUCE_H
#define K3RT_COMM_REDUCE_H

#include "comm/comm_impl.h"

/* acc = acc op src over count elements (AVG folds as SUM; comm_reduce_finish divides). */
int comm_reduce_into(void *acc, const void *src, int64_t count, int dtype, int op,
                     k3rt_error *err);
/* AVG: acc /= ranks (a no-op for the other ops; an error for AVG of integers). */
int comm_reduce_finish(void *acc, int64_t count, int dtype, int op, int ranks,
                       k3rt_error *err);

int comm_det_all_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                        int op, k3rt_error *err);
int comm_det_reduce_scatter(k3rt_comm *c, const void *send, void *recv, int64_t count,
                            int dtype, int op, k3rt_error *err);
/* The sum (op) of every rank's send in rank order, into the root's recv only (other ranks'
 * recv is left alone): the same bits all_reduce gives, for half its traffic and no copy on
 * the other ranks (ZeRO-1 reduces each gradient to the rank owning its optimizer state). */
int comm_det_reduce(k3rt_comm *c, const void *send, void *recv, int64_t count, int dtype,
                    int op, int root, k3rt_error *err);

#endif
