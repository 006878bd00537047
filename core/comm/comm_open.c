/* Choosing and creating a job's communicators (comm_open.h). */
#include "comm/comm_open.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm_tcp.h"
#ifdef K3RT_HAVE_MPI
#include "comm/comm_mpi.h"
#endif

/* Seconds the ranks of a tcp job wait for each other at start-up. */
#define TCP_START_TIMEOUT 120.0

static const char *pick(const char *want, const comm_world *w)
{
    if (want && strcmp(want, "auto"))
        return want;
    if (w->size == 1)
        return "local";
    return w->source && !strcmp(w->source, "mpirun") ? "mpi" : "tcp";
}

int comm_open_job(const char *want, const comm_mesh *mesh, comm_job *job, k3rt_error *err)
{
    memset(job, 0, sizeof *job);
    K3RT_TRY(comm_world_detect(&job->world, err));
    const comm_world *w = &job->world;
    const char *b = pick(want, w);
    if (!strcmp(b, "local")) {
        if (w->size > 1)
            return k3rt_fail(err, K3RT_ERR_INVALID, "plan.comm = \"local\" runs the ranks as "
                             "threads of one process, but %s started %d processes: use "
                             "plan.comm = \"auto\"", w->source, w->size);
        job->backend = "local";
        job->n_local = mesh->dp;
        return comm_local_create(mesh->dp, &job->comms, err);
    }
    if (!strcmp(b, "nccl"))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.comm = \"nccl\": the nccl backend "
                         "(data parallelism across GPUs) is not in this k3rt yet; on the CPU "
                         "use \"auto\", \"tcp\" or \"mpi\"");
    if (strcmp(b, "mpi") && strcmp(b, "tcp"))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.comm = \"%s\": this build has the "
                         "backends auto, local, tcp%s", b,
#ifdef K3RT_HAVE_MPI
                         " and mpi"
#else
                         " (mpi: rebuild with MPI found, option K3RT_MPI)"
#endif
        );
    job->comms = calloc(1, sizeof *job->comms);
    if (!job->comms)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    job->n_local = 1;
    int rc;
    if (!strcmp(b, "tcp")) {
        job->backend = "tcp";
        rc = comm_tcp_create(w, mesh, TCP_START_TIMEOUT, &job->comms[0], err);
    } else {
#ifdef K3RT_HAVE_MPI
        job->backend = "mpi";
        rc = comm_mpi_create(mesh, &job->comms[0], err);
#else
        rc = k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: this k3rt was built without MPI (CMake "
                       "did not find it, or K3RT_MPI=OFF); start the ranks with k3rt launch "
                       "or torchrun (the tcp backend), or rebuild with MPI",
                       w->source && !strcmp(w->source, "mpirun") ? "started by mpirun"
                                                                   : "plan.comm = \"mpi\"");
#endif
    }
    if (!rc)
        job->first_rank = job->comms[0]->rank;
    return rc;
}

void comm_close_job(comm_job *job)
{
    if (!job->comms)
        return;
    if (!strcmp(job->backend ? job->backend : "", "local"))
        comm_local_destroy(job->comms, job->n_local);
    else if (!strcmp(job->backend ? job->backend : "", "tcp"))
        comm_tcp_destroy(job->comms[0]);
#ifdef K3RT_HAVE_MPI
    else if (!strcmp(job->backend ? job->backend : "", "mpi"))
        comm_mpi_destroy(job->comms[0]);
#endif
    if (job->backend && strcmp(job->backend, "local"))
        free(job->comms);
    job->comms = NULL;
}
