/* A ZeRO-1 checkpoint: every rank writes the optimizer state it owns, and the step commits
 * once, atomically, with all of them.
 *
 *   1. rank 0 creates step_N.tmp/ and tells every rank its path (the broadcast is the barrier);
 *   2. rank q writes optimizer.rank<q>.safetensors there (temp file, fsync, rename);
 *   3. every rank sends rank 0 its file's checksums, or that it failed;
 *   4. rank 0, only when every shard is on disk, writes the weights, the modules' state and the
 *      manifest (with "optimizer_shards": the files and each parameter's owner, and the shards'
 *      checksums), then DONE and the rename to step_N (ckpt_commit).
 * A crash or a failed rank before 4 leaves step_N.tmp, which readers ignore. */
#include <stdlib.h>
#include <string.h>

#include "train/ckpt_dir.h"
#include "train/ckpt_verify.h"
#include "train/train_internal.h"
#include "util/fault.h"
#include "util/fs.h"

/* Rank q's checksums (JSON text; "" when its write failed) to rank 0, into sums[file]. */
static int gather_sums(rank_ctx *c, const char *mine, json_t *sums, int *failed,
                       k3rt_error *err)
{
    for (int q = 0; q < c->r->dp; q++) {
        char name[64];
        ckpt_shard_name(q, name, sizeof name);
        int64_t len = (int64_t)strlen(mine);
        char *text = NULL;
        if (q == 0 && c->rank == 0) {
            text = strdup(mine);
        } else if (c->rank == q) {
            K3RT_TRY(k3rt_send(c->dp, c->stream, &len, 1, K3RT_I64, 0, err));
            K3RT_TRY(k3rt_send(c->dp, c->stream, mine, len, K3RT_U8, 0, err));
        } else if (c->rank == 0) {
            K3RT_TRY(k3rt_recv(c->dp, c->stream, &len, 1, K3RT_I64, q, err));
            if (len < 0 || len > ((int64_t)1 << 30) || !(text = calloc((size_t)len + 1, 1)))
                return k3rt_fail(err, K3RT_ERR_COMM, "checkpoint: rank %d sent a bad "
                                 "checksum list (%lld bytes)", q, (long long)len);
            K3RT_TRY(k3rt_recv(c->dp, c->stream, text, len, K3RT_U8, q, err));
        }
        if (c->rank != 0)
            continue;
        json_t *j = text && text[0] ? json_loads(text, 0, NULL) : NULL;
        free(text);
        if (!j)
            failed[q] = 1;
        else
            json_object_set_new(sums, name, j);
    }
    return K3RT_OK;
}

/* {"dp", "files", "owners"}: the index a resume (under any plan) finds the state by. */
static json_t *shard_index(const rank_ctx *c)
{
    json_t *files = json_array(), *owners = json_array();
    for (int q = 0; q < c->r->dp; q++) {
        char name[64];
        json_array_append_new(files, json_string(ckpt_shard_name(q, name, sizeof name)));
    }
    for (int i = 0; i < c->m.n_params; i++)
        json_array_append_new(owners, json_integer(c->owner[i]));
    return json_pack("{s:i, s:o, s:o}", "dp", c->r->dp, "files", files, "owners", owners);
}

int ckpt_save_sharded(rank_ctx *c, int64_t step, k3rt_error *err)
{
    run *r = c->r;
    char dir[1200] = {0}, name[64], path[1300];
    int64_t ok = 1;
    int rc = c->rank == 0 ? ckpt_begin(r->ckpt_root, step, dir, sizeof dir, err) : K3RT_OK;
    ok = rc == K3RT_OK;
    K3RT_TRY(k3rt_broadcast(c->dp, c->stream, &ok, 1, K3RT_I64, 0, err));
    K3RT_TRY(k3rt_broadcast(c->dp, c->stream, dir, sizeof dir, K3RT_U8, 0, err));
    if (!ok)
        return rc ? rc : k3rt_fail(err, K3RT_ERR_IO, "checkpoint of step %lld: rank 0 could "
                                   "not create its directory", (long long)step);
    dir[sizeof dir - 1] = 0;
    json_t *mine = NULL;
    rc = ckpt_write_state(c, fs_join(path, sizeof path, dir,
                                     ckpt_shard_name(c->rank, name, sizeof name)),
                          0, 1, &mine, err);
    fault_point("ckpt.shard", step);
    char *text = !rc && mine ? json_dumps(mine, JSON_COMPACT) : NULL;
    json_decref(mine);
    json_t *sums = json_object();
    int *failed = calloc((size_t)r->dp, sizeof *failed);
    int grc = sums && failed ? gather_sums(c, text ? text : "", sums, failed, err)
                             : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    free(text);
    for (int q = 0; c->rank == 0 && !rc && !grc && q < r->dp; q++)
        if (failed[q])
            rc = k3rt_fail(err, K3RT_ERR_IO, "checkpoint of step %lld: rank %d could not write "
                           "%s/%s (its message is in its log); the step is not committed",
                           (long long)step, q, dir, ckpt_shard_name(q, name, sizeof name));
    if (!rc)
        rc = grc;
    if (!rc && c->rank == 0) {
        json_t *index = shard_index(c);
        rc = index ? ckpt_save_run(c, step, dir, index, sums, err)
                   : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        json_decref(index);
    }
    json_decref(sums);
    free(failed);
    return rc;
}
