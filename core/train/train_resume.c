/* A run's output folder and where it starts (train_internal.h: output_prepare).
 *
 * Every run has an identity — recipe hash, seed and start time — recorded in each manifest
 * ("run"), and a resumed run keeps the identity of the run it continues. A fresh run in a
 * folder that holds checkpoints (another run's: a fresh run has a new identity) is refused:
 * --resume continues that run, --force removes its checkpoints first. --resume takes the
 * newest checkpoint that is usable (manifest, schema, checksums, finite values), says which
 * one it passed over and why, and says whose run it continues from which step; the metrics of
 * steps after that one (logged before the interruption) are dropped, so the replayed steps
 * are not recorded twice. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/ckpt_dir.h"
#include "train/ckpt_manifest.h"
#include "train/ckpt_verify.h"
#include "train/train_internal.h"
#include "util/fs.h"
#include "util/log.h"

static int new_identity(run *r, k3rt_error *err)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char day[32], iso[64];
    strftime(day, sizeof day, "%Y%m%dT%H%M%S", &tm);
    strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%S", &tm);
    char started[80];
    snprintf(started, sizeof started, "%s.%06ldZ", iso, ts.tv_nsec / 1000);
    snprintf(r->run_id, sizeof r->run_id, "%.12s-%llu-%s.%06ldZ", recipe_hash(r->rec),
             (unsigned long long)r->seed, day, ts.tv_nsec / 1000);
    r->identity = json_pack("{s:s, s:s, s:I, s:s}", "id", r->run_id, "recipe_sha256",
                            recipe_hash(r->rec), "seed", (json_int_t)r->seed, "started",
                            started);
    return r->identity ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
}

/* "run <id> (recipe <path>, seed <n>, started <time>)" of a manifest, for messages. */
static void describe(const json_t *m, char *buf, size_t len)
{
    const json_t *id = json_object_get(m, "run");
    const char *recipe = json_string_value(json_object_get(json_object_get(m, "recipe"),
                                                            "path"));
    if (!json_is_string(json_object_get(id, "id"))) {
        snprintf(buf, len, "a run without an identity (recipe %s; written by an older k3rt)",
                 recipe ? recipe : "?");
        return;
    }
    snprintf(buf, len, "run %s (recipe %s, seed %lld, started %s)",
             json_string_value(json_object_get(id, "id")), recipe ? recipe : "?",
             (long long)json_integer_value(json_object_get(id, "seed")),
             json_string_value(json_object_get(id, "started")));
}

/* A fresh run: the folder must hold no checkpoint, or --force removes them. */
static int claim_folder(run *r, k3rt_error *err)
{
    int64_t *steps;
    int n;
    K3RT_TRY(ckpt_list(r->ckpt_root, &steps, &n, err));
    if (n == 0) {
        free(steps);
        return K3RT_OK;
    }
    char dir[1200], who[600] = "another run";
    json_t *m = NULL;
    k3rt_error ignored = {0};
    int rc = ckpt_dir(r->ckpt_root, steps[0], dir, sizeof dir, err);
    if (!rc && ckpt_read_manifest(dir, &m, &ignored) == K3RT_OK)
        describe(m, who, sizeof who);
    json_decref(m);
    if (!rc && !r->opt.force)
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s holds %d checkpoint%s of %s, steps %lld to "
                       "%lld; a new run would mix with them. Continue that run with --resume, "
                       "replace it with --force (removes its checkpoints) or choose another "
                       "--out", r->ckpt_root, n, n > 1 ? "s" : "", who,
                       (long long)steps[n - 1], (long long)steps[0]);
    for (int i = 0; i < n && !rc; i++)
        if (!(rc = ckpt_dir(r->ckpt_root, steps[i], dir, sizeof dir, err)))
            rc = fs_remove_tree(dir, err);
    if (!rc)
        log_warn("--force: removed %d checkpoint%s of %s (steps %lld to %lld) from %s", n,
                 n > 1 ? "s" : "", who, (long long)steps[n - 1], (long long)steps[0],
                 r->ckpt_root);
    free(steps);
    return rc;
}

/* A checkpoint --resume can start from: its manifest, what it names, its tensors. */
static int usable(run *r, const char *dir, k3rt_error *err)
{
    json_decref(r->manifest);
    r->manifest = NULL;
    int rc = ckpt_read_manifest(dir, &r->manifest, err);
    if (!rc)
        rc = ckpt_check_manifest(r->manifest, &r->reg, dir, err);
    if (!rc)
        rc = ckpt_verify(dir, r->manifest, err);
    return rc;
}

/* The newest usable checkpoint, falling back past unusable ones and saying so. */
static int pick_checkpoint(run *r, k3rt_error *err)
{
    int64_t *steps;
    int n, rc = K3RT_ERR_NOT_FOUND;
    K3RT_TRY(ckpt_list(r->ckpt_root, &steps, &n, err));
    if (n == 0)
        rc = k3rt_fail(err, K3RT_ERR_NOT_FOUND, "--resume: no complete checkpoint under %s",
                       r->ckpt_root);
    k3rt_error first = {0};
    for (int i = 0; i < n && rc; i++) {
        K3RT_TRY(ckpt_dir(r->ckpt_root, steps[i], r->resume_dir, sizeof r->resume_dir, err));
        k3rt_error why = {0};
        rc = usable(r, r->resume_dir, &why);
        if (!rc) {
            r->start_step = steps[i];
            break;
        }
        if (!i)
            first = why;
        if (why.code != K3RT_ERR_FORMAT && why.code != K3RT_ERR_NOT_FOUND &&
            why.code != K3RT_ERR_IO) {
            *err = why; /* not a damaged checkpoint (a plugin file to name, memory): stop */
            break;
        }
        if (i + 1 < n)
            log_warn("--resume: %s is unusable: %s; falling back to the previous complete "
                     "checkpoint, step %lld", r->resume_dir, why.msg, (long long)steps[i + 1]);
        else
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "--resume: none of the %d checkpoints under "
                           "%s is usable; the newest: %s", n, r->ckpt_root, first.msg);
    }
    free(steps);
    return rc;
}

/* The identity of the run being continued (a new one for a checkpoint without one). */
static int adopt_identity(run *r, k3rt_error *err)
{
    const json_t *id = json_object_get(r->manifest, "run");
    const char *s = json_string_value(json_object_get(id, "id"));
    if (s) {
        r->identity = json_deep_copy(id);
        snprintf(r->run_id, sizeof r->run_id, "%s", s);
    } else {
        K3RT_TRY(new_identity(r, err));
    }
    char who[600];
    describe(r->manifest, who, sizeof who);
    const char *then = json_string_value(json_object_get(json_object_get(r->manifest, "recipe"),
                                                          "sha256"));
    log_info("--resume: continuing %s from step %lld (%s)%s", who, (long long)r->start_step,
             r->resume_dir, then && strcmp(then, recipe_hash(r->rec))
                                ? "; the recipe text has changed since" : "");
    if (!s)
        log_info("--resume: this run's identity from now on: %s", r->run_id);
    return r->identity ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
}

/* Keeps the metrics records of steps <= upto (and drops a half-written last line). */
static int trim_metrics(const char *path, int64_t upto, k3rt_error *err)
{
    char *text;
    size_t len;
    if (!fs_exists(path))
        return K3RT_OK;
    K3RT_TRY(fs_read_file(path, &text, &len, err));
    char *out = malloc(len + 1);
    size_t at = 0;
    for (char *line = text, *end; out && (end = memchr(line, '\n', (size_t)(text + len - line)));
         line = end + 1) {
        json_t *rec = json_loadb(line, (size_t)(end - line), 0, NULL);
        const json_t *step = json_object_get(rec, "step");
        if (rec && (!json_is_integer(step) || json_integer_value(step) <= upto)) {
            memcpy(out + at, line, (size_t)(end - line) + 1);
            at += (size_t)(end - line) + 1;
        }
        json_decref(rec);
    }
    int rc = out ? (at == len ? K3RT_OK : fs_write_atomic(path, out, at, err))
                 : k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    free(out);
    free(text);
    return rc;
}

static int resume_from_checkpoint(run *r, k3rt_error *err)
{
    K3RT_TRY(pick_checkpoint(r, err));
    K3RT_TRY(ckpt_check_compatible(r, err));
    K3RT_TRY(adopt_identity(r, err));
    /* The last logged losses carry on into the next manifests, as in a run never stopped. */
    const json_t *metrics = json_object_get(r->manifest, "metrics");
    r->result.final_train_loss = json_number_value(json_object_get(metrics, "train_loss"));
    double val = json_number_value(json_object_get(metrics, "val_loss"));
    if (val >= 0)
        r->result.final_val_loss = val;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(r->manifest, "changes"), i, c) {
        json_array_append(r->changes, c);
        json_decref(r->balancer);
        r->balancer = json_deep_copy(json_object_get(c, "balancer"));
    }
    return r->balancer ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
}

static int set_paths(run *r, k3rt_error *err)
{
    const char *out = r->opt.out_dir ? r->opt.out_dir : json_string_value(json_object_get(
                                                            r->doc, "out"));
    snprintf(r->out, sizeof r->out, "%s", out ? out : "runs/k3rt");
    fs_join(r->ckpt_root, sizeof r->ckpt_root, r->out, "checkpoints");
    if (r->opt.resume && r->opt.force)
        return k3rt_fail(err, K3RT_ERR_INVALID, "--resume continues the run in %s and --force "
                         "replaces it: give one of them", r->out);
    return K3RT_OK;
}

int output_follow(run *r, k3rt_error *err)
{
    K3RT_TRY(set_paths(r, err));
    if (r->opt.resume && !r->opt.dry_run)
        K3RT_TRY(resume_from_checkpoint(r, err));
    return r->identity ? K3RT_OK : new_identity(r, err);
}

int output_prepare(run *r, k3rt_error *err)
{
    K3RT_TRY(set_paths(r, err));
    if (r->opt.dry_run)
        return new_identity(r, err);
    K3RT_TRY(fs_mkdirs(r->ckpt_root, err));
    if (r->opt.resume)
        K3RT_TRY(resume_from_checkpoint(r, err));
    else
        K3RT_TRY(claim_folder(r, err));
    if (!r->identity)
        K3RT_TRY(new_identity(r, err));
    char path[1200];
    fs_join(path, sizeof path, r->out, "metrics.jsonl");
    if (r->opt.resume)
        K3RT_TRY(trim_metrics(path, r->start_step, err));
    r->metrics = fopen(path, r->opt.resume ? "ab" : "wb");
    if (!r->metrics)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot open for writing: %s", path,
                         strerror(errno));
    return K3RT_OK;
}
