/* `k3rt train`: setup, the data-parallel ranks as threads, the dry run (train_main). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/actman.h"
#include "train/train_internal.h"
#include "util/log.h"

static int print_parameters(rank_ctx *c, k3rt_error *err)
{
    model *m = &c->m;
    printf("%-44s %-18s %-14s %s\n", "PARAMETER", "SHAPE", "ROLE", "RULE");
    for (int i = 0; i < m->n_params; i++) {
        char shape[64], rule[96] = "-";
        k3rt_tensor_shape_str(&m->params[i].param, shape, sizeof shape);
        rig_describe(&c->opt, i, rule, sizeof rule);
        printf("%-44s %-18s %-14s %s\n", m->params[i].name, shape,
               k3rt_role_name(m->params[i].decl.role), rule);
    }
    k3rt_memory om;
    K3RT_TRY(rig_memory(&c->opt, 0, 0, &om, err));
    printf("memory: parameters %.2f MiB, gradients %.2f MiB, optimizer state %.2f MiB, "
           "activations per micro-batch %.2f MiB\n",
           (double)m->total_numel * (double)(m->master_elem + (m->compute_buf ? m->elem : 0)) /
               (1 << 20),
           (double)m->total_numel * (double)m->master_elem / (1 << 20),
           (double)om.state_bytes / (1 << 20), (double)m->act_bytes / (1 << 20));
    actman_print(m->am, stdout);
    return K3RT_OK;
}

static int dry_run(run *r, k3rt_error *err)
{
    rank_ctx c;
    memset(&c, 0, sizeof c);
    c.r = r;
    int rc = rank_build(&c, err);
    if (rc == K3RT_ERR_NOMEM) {
        /* A dry run builds the model here, arena and all: say which command sizes it without
         * allocating, for a recipe meant for a larger machine. */
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (--dry-run builds the model and its "
                 "activations on this machine; `k3rt plan RECIPE --gpus N` sizes it without "
                 "allocating)");
    }
    if (!rc)
        rc = train_print_header(&c, err);
    if (!rc)
        rc = print_parameters(&c, err);
    rank_free(&c);
    return rc;
}

/* This process's ranks: threads of the local backend, or the one rank of a multi-process
 * job. */
static int run_ranks(run *r, k3rt_error *err)
{
    int n = r->job.n_local, first = r->job.first_rank;
    rank_ctx *ctx = calloc((size_t)n, sizeof *ctx);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!ctx || !th) {
        free(ctx), free(th);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        ctx[i].r = r;
        ctx[i].rank = first + i;
    }
    status_open(r, first);
    r->t_start = time_now();
    if (n == 1) {
        rank_main(&ctx[0]);
    } else {
        for (int i = 0; i < n; i++)
            pthread_create(&th[i], NULL, rank_main, &ctx[i]);
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
    }
    /* Report the rank that failed first-hand, not one stopped by the abort it caused. */
    int rc = K3RT_OK, pick = -1;
    for (int i = 0; i < n; i++)
        if (ctx[i].rc && (pick < 0 || (ctx[pick].rc == K3RT_ERR_COMM &&
                                       ctx[i].rc != K3RT_ERR_COMM)))
            pick = i;
    if (pick >= 0) {
        rc = ctx[pick].rc;
        *err = ctx[pick].err;
        if (r->dp > 1)
            k3rt_error_prefix(err, "rank %d: ", first + pick);
    }
    for (int i = 0; i < n; i++)
        rank_free(&ctx[i]);
    status_close(r);
    free(ctx);
    free(th);
    return rc;
}

/* A process of a multi-process job that fails must not leave the others waiting in a
 * collective: it says why, then breaks the job (mpi: MPI_Abort ends every process; tcp: its
 * peers see its connections close). */
static void fail_job(run *r, const k3rt_error *err)
{
    if (!r->multi_process || !r->job.comms || !r->job.comms[0])
        return;
    if (!strcmp(r->job.backend, "mpi"))  /* MPI_Abort does not return: print it first */
        fprintf(stderr, "k3rt train: %s\n", err->msg);
    comm_abort(r->job.comms[0]);
}

int train_main(const train_options *o, train_result *result, k3rt_error *err)
{
    run *r = calloc(1, sizeof *r);
    if (!r)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = run_setup(r, o, err);
    if (!rc && o->dry_run) {
        /* the other processes of a job: rank 0 prints the plan */
        if (r->job.first_rank == 0)
            rc = dry_run(r, err);
    } else if (!rc) {
        rc = run_ranks(r, err);
    }
    if (rc)
        fail_job(r, err);
    r->result.rank = r->job.first_rank;
    if (result)
        *result = r->result;
    loss_history_free(&r->history);
    run_free(r);
    free(r);
    return rc;
}
