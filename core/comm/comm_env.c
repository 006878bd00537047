/* The launcher's variables (comm_env.h). */
#include "comm/comm_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* v: the value of `name` as an int in [lo, hi]; absent: def. */
static int env_int(const char *name, int def, int lo, int hi, int *v, k3rt_error *err)
{
    const char *s = getenv(name);
    if (!s || !*s) {
        *v = def;
        return K3RT_OK;
    }
    char *end;
    long x = strtol(s, &end, 10);
    if (*end || x < lo || x > hi)
        return k3rt_fail(err, K3RT_ERR_INVALID, "environment: %s = \"%s\": expected an integer "
                         "in [%d, %d]", name, s, lo, hi);
    *v = (int)x;
    return K3RT_OK;
}

typedef struct launcher {
    const char *source, *rank, *size, *local_rank, *local_size;
} launcher;

static const launcher launchers[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

int comm_world_detect(comm_world *w, k3rt_error *err)
{
    memset(w, 0, sizeof *w);
    w->size = w->local_size = 1;
    const launcher *l = NULL;
    for (size_t i = 0; i < sizeof launchers / sizeof *launchers && !l; i++)
        if (getenv(launchers[i].size) && *getenv(launchers[i].size))
            l = &launchers[i];
    if (l) {
        K3RT_TRY(env_int(l->size, 1, 1, 1 << 20, &w->size, err));
        K3RT_TRY(env_int(l->rank, 0, 0, w->size - 1, &w->rank, err));
        K3RT_TRY(env_int(l->local_rank, w->rank, 0, w->size - 1, &w->local_rank, err));
        /* SLURM_NTASKS_PER_NODE may read "2(x3)" on heterogeneous allocations: then the
         * local size is unknown and every rank keeps all the threads it is given. */
        const char *ls = getenv(l->local_size);
        if (ls && strchr(ls, '('))
            w->local_size = 1;
        else
            K3RT_TRY(env_int(l->local_size, w->size, 1, w->size, &w->local_size, err));
        w->source = w->size > 1 ? l->source : NULL;
    }
    const char *addr = getenv("MASTER_ADDR");
    snprintf(w->addr, sizeof w->addr, "%s", addr ? addr : "");
    return env_int("MASTER_PORT", 0, 1, 65535, &w->port, err);
}
