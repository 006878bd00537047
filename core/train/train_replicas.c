/* Data-parallel replicas must hold the same weights: every rank applies the same reduced
 * gradients, so any difference is a bug (a rank-dependent kernel, a missed reduction) that
 * checkpoints written by rank 0 alone would hide. Checked at each checkpoint with a 64-bit
 * FNV-1a hash of the master weights, gathered over the data-parallel group. */
#include <stdlib.h>
#include <string.h>

#include "train/train_internal.h"

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int replicas_agree(rank_ctx *c, int64_t step, k3rt_error *err)
{
    run *r = c->r;
    model *m = &c->m;
    if (r->dp == 1)
        return K3RT_OK;
    size_t bytes = (size_t)m->total_numel * (size_t)m->master_elem;
    const unsigned char *w = m->param_buf;
    unsigned char *host = NULL;
    if (m->opt.device != K3RT_DEVICE_CPU) {
        if (!(host = malloc(bytes + 1)))
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        int rc = k3rt_memcpy(c->stream, host, K3RT_DEVICE_CPU, m->param_buf, m->opt.device,
                             bytes, err);
        if (!rc)
            rc = k3rt_stream_sync(c->stream, err);
        if (rc) {
            free(host);
            return rc;
        }
        w = host;
    }
    int64_t mine = (int64_t)fnv1a(w, bytes);
    free(host);
    int64_t *all = calloc((size_t)r->dp, sizeof *all);
    if (!all)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = k3rt_all_gather(c->dp, c->stream, &mine, all, 1, K3RT_I64, err);
    for (int q = 1; q < r->dp && !rc; q++)
        if (all[q] != all[0])
            rc = k3rt_fail(err, K3RT_ERR_NUMERIC, "step %lld: the data-parallel replicas "
                           "diverged: rank %d's weights (checksum %016llx) differ from rank "
                           "0's (%016llx); the checkpoint is not written", (long long)step, q,
                           (unsigned long long)all[q], (unsigned long long)all[0]);
    free(all);
    return rc;
}
