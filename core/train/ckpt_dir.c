/* Checkpoint directories and their atomic commit (ckpt_dir.h). */
#include "train/ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/fault.h"
#include "util/fs.h"

#define CKPT_PATH_MAX 4096

static int put_path(char *buf, size_t len, const char *path, k3rt_error *err)
{
    if ((size_t)snprintf(buf, len, "%s", path) >= len)
        return k3rt_fail(err, K3RT_ERR_INVALID, "path does not fit in %zu bytes: %s", len,
                         path);
    return K3RT_OK;
}

/* <root>/step_%08lld, with ".tmp" when tmp. */
static int step_path(char *buf, size_t len, const char *root, int64_t step, int tmp,
                     k3rt_error *err)
{
    char name[64];
    snprintf(name, sizeof name, "step_%08lld%s", (long long)step, tmp ? ".tmp" : "");
    char full[CKPT_PATH_MAX];
    if ((size_t)snprintf(full, sizeof full, "%s/%s", root, name) >= sizeof full)
        return k3rt_fail(err, K3RT_ERR_INVALID, "checkpoint path too long under %s", root);
    return put_path(buf, len, full, err);
}

/* "step_<digits>": a checkpoint directory's name. */
static int parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step_", 5) != 0)
        return 0;
    const char *p = name + 5;
    int64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (v > (INT64_MAX - 9) / 10)
            return 0;
        v = v * 10 + (*p - '0');
    }
    if (!digits || *p)
        return 0;
    *step = v;
    return 1;
}

/* "step_*.tmp": a save in progress, or the leftover of an interrupted one. */
static int is_tmp_name(const char *name)
{
    size_t n = strlen(name);
    return strncmp(name, "step_", 5) == 0 && n > 9 && !strcmp(name + n - 4, ".tmp");
}

static int is_complete(const char *dir)
{
    char done[CKPT_PATH_MAX];
    struct stat st;
    fs_join(done, sizeof done, dir, "DONE");
    return stat(done, &st) == 0 && S_ISREG(st.st_mode);
}

/* Steps of the complete checkpoints under root (sorted newest first) and the names of the
 * step_*.tmp directories. */
typedef struct ckpt_scan {
    int64_t *steps;
    int n;
    char (*tmps)[64];
    int ntmp;
} ckpt_scan;

static void scan_free(ckpt_scan *s)
{
    free(s->steps);
    free(s->tmps);
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

static int scan_root(const char *root, ckpt_scan *s, k3rt_error *err)
{
    memset(s, 0, sizeof *s);
    DIR *d = opendir(root);
    if (!d)
        return k3rt_fail(err, errno == ENOENT ? K3RT_ERR_NOT_FOUND : K3RT_ERR_IO,
                         "%s: cannot open checkpoint directory: %s", root, strerror(errno));
    int cap = 0, tcap = 0, rc = K3RT_OK;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        int64_t step = 0;
        int tmp = is_tmp_name(e->d_name);
        char path[CKPT_PATH_MAX];
        if (!tmp && !parse_step_name(e->d_name, &step))
            continue;
        fs_join(path, sizeof path, root, e->d_name);
        if (!fs_is_dir(path))
            continue;
        if (tmp) {
            if (s->ntmp == tcap) {
                tcap = tcap ? 2 * tcap : 8;
                void *p = realloc(s->tmps, (size_t)tcap * sizeof *s->tmps);
                if (!p) {
                    rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory scanning %s", root);
                    break;
                }
                s->tmps = p;
            }
            if (strlen(e->d_name) < sizeof s->tmps[0])
                snprintf(s->tmps[s->ntmp++], sizeof s->tmps[0], "%s", e->d_name);
        } else if (is_complete(path)) {
            if (s->n == cap) {
                cap = cap ? 2 * cap : 16;
                void *p = realloc(s->steps, (size_t)cap * sizeof *s->steps);
                if (!p) {
                    rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory scanning %s", root);
                    break;
                }
                s->steps = p;
            }
            s->steps[s->n++] = step;
        }
    }
    closedir(d);
    if (rc)
        scan_free(s);
    else if (s->n)
        qsort(s->steps, (size_t)s->n, sizeof *s->steps, cmp_desc);
    return rc;
}

int ckpt_begin(const char *root, int64_t step, char *tmpdir, size_t len, k3rt_error *err)
{
    if (step < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "checkpoint step must be >= 0, got %lld",
                         (long long)step);
    char tmp[CKPT_PATH_MAX];
    K3RT_TRY(step_path(tmp, sizeof tmp, root, step, 1, err));
    K3RT_TRY(fs_mkdirs(root, err));
    K3RT_TRY(fs_remove_tree(tmp, err));
    K3RT_TRY(fs_mkdirs(tmp, err));
    return put_path(tmpdir, len, tmp, err);
}

void ckpt_run_id(const char *dir, char *id, size_t len)
{
    char path[CKPT_PATH_MAX];
    json_t *m = json_load_file(fs_join(path, sizeof path, dir, "manifest.json"), 0, NULL);
    const char *s = json_string_value(json_object_get(json_object_get(m, "run"), "id"));
    snprintf(id, len, "%s", s ? s : "");
    json_decref(m);
}

/* Drops complete checkpoints of run_id beyond its newest `keep`, and leftovers of interrupted
 * saves. */
static int prune(const char *root, int keep, const char *run_id, k3rt_error *err)
{
    ckpt_scan s;
    K3RT_TRY(scan_root(root, &s, err));
    int rc = K3RT_OK, kept = 0;
    char path[CKPT_PATH_MAX], id[256];
    for (int i = 0; i < s.n && !rc && keep > 0; i++) {
        if ((rc = step_path(path, sizeof path, root, s.steps[i], 0, err)))
            break;
        if (run_id) {
            ckpt_run_id(path, id, sizeof id);
            if (strcmp(id, run_id))
                continue; /* another run's: never ours to remove */
        }
        if (++kept > keep)
            rc = fs_remove_tree(path, err);
    }
    for (int i = 0; i < s.ntmp && !rc; i++)
        rc = fs_remove_tree(fs_join(path, sizeof path, root, s.tmps[i]), err);
    scan_free(&s);
    return rc;
}

int ckpt_commit(const char *root, int64_t step, int keep, const char *run_id, k3rt_error *err)
{
    char tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX], done[CKPT_PATH_MAX], old[CKPT_PATH_MAX];
    K3RT_TRY(step_path(tmp, sizeof tmp, root, step, 1, err));
    K3RT_TRY(step_path(final, sizeof final, root, step, 0, err));
    if (!fs_is_dir(tmp))
        return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: no checkpoint being written (call "
                         "ckpt_begin first)", tmp);
    char marker[64];
    int n = snprintf(marker, sizeof marker, "step %lld\n", (long long)step);
    /* fs_write_atomic fsyncs the directory it writes into, which covers every file written
     * there before DONE. */
    K3RT_TRY(fs_write_atomic(fs_join(done, sizeof done, tmp, "DONE"), marker, (size_t)n, err));
    fault_point("ckpt.done", step);
    /* rename() cannot replace a non-empty directory: an existing step_N (a save at the same
     * step again) moves aside first and goes once the new one is in place. */
    int replaced = 0;
    if (fs_exists(final)) {
        snprintf(old, sizeof old, "%s.replaced.tmp", final);
        K3RT_TRY(fs_remove_tree(old, err));
        if (rename(final, old) != 0)
            return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot move the old checkpoint aside: %s",
                             final, strerror(errno));
        replaced = 1;
    }
    if (rename(tmp, final) != 0)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot rename to %s: %s", tmp, final,
                         strerror(errno));
    K3RT_TRY(fs_fsync_dir(root, err));
    fault_point("ckpt.renamed", step);
    if (replaced)
        K3RT_TRY(fs_remove_tree(old, err));
    int rc = prune(root, keep, run_id, err);
    if (rc)
        return k3rt_error_prefix(err, "checkpoint %s committed, but pruning failed: ", final);
    return K3RT_OK;
}

int ckpt_list(const char *root, int64_t **steps, int *n, k3rt_error *err)
{
    *steps = NULL;
    *n = 0;
    ckpt_scan s;
    int rc = scan_root(root, &s, err);
    if (rc == K3RT_ERR_NOT_FOUND)
        return K3RT_OK;
    K3RT_TRY(rc);
    free(s.tmps);
    *steps = s.steps;
    *n = s.n;
    return K3RT_OK;
}

int ckpt_dir(const char *root, int64_t step, char *buf, size_t len, k3rt_error *err)
{
    return step_path(buf, len, root, step, 0, err);
}

int ckpt_latest(const char *root, int64_t *step, char *dir, size_t len, k3rt_error *err)
{
    ckpt_scan s;
    K3RT_TRY(scan_root(root, &s, err));
    int rc;
    if (s.n == 0)
        rc = k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: no complete checkpoint (a step_N "
                       "directory with a DONE file)", root);
    else if (!(rc = step_path(dir, len, root, s.steps[0], 0, err)))
        *step = s.steps[0];
    scan_free(&s);
    return rc;
}

int ckpt_resolve(const char *path, char *dir, size_t len, k3rt_error *err)
{
    char base[CKPT_PATH_MAX];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    snprintf(base, sizeof base, "%.*s", (int)n, path);
    const char *slash = strrchr(base, '/');
    const char *name = slash ? slash + 1 : base;
    int64_t step;
    int tmp = is_tmp_name(name);
    if (!tmp && is_complete(base))
        return put_path(dir, len, base, err);
    if (!fs_is_dir(base))
        return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: no such checkpoint directory", path);
    if (tmp || parse_step_name(name, &step))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s checkpoint (no DONE marker, or still "
                         "being written); use an earlier one", path,
                         tmp ? "unfinished" : "incomplete");
    int64_t latest;
    return ckpt_latest(base, &latest, dir, len, err);
}

/* The manifest's integer `key`, or a message naming it. */
static int manifest_int(const char *path, const json_t *m, const char *key, json_int_t *v,
                        k3rt_error *err)
{
    json_t *j = json_object_get(m, key);
    if (!json_is_integer(j))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: \"%s\" must be an integer%s", path, key,
                         j ? "" : " (missing)");
    *v = json_integer_value(j);
    return K3RT_OK;
}

/* The folder name (when it is step_N) and the DONE marker must give the manifest's step. */
static int check_step_names(const char *dir, json_int_t step, k3rt_error *err)
{
    char base[CKPT_PATH_MAX], done[CKPT_PATH_MAX];
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    snprintf(base, sizeof base, "%.*s", (int)n, dir);
    const char *slash = strrchr(base, '/');
    int64_t named;
    if (parse_step_name(slash ? slash + 1 : base, &named) && named != step)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: the folder is named for step %lld but its "
                         "manifest says step %lld (a renamed or mixed-up checkpoint)", dir,
                         (long long)named, (long long)step);
    char *text = NULL;
    size_t len = 0;
    k3rt_error ignored = {0};
    if (fs_read_file(fs_join(done, sizeof done, dir, "DONE"), &text, &len, &ignored))
        return K3RT_OK; /* completeness is checked where checkpoints are listed */
    long long marked = -1;
    int ok = sscanf(text, "step %lld", &marked) == 1 && marked == step;
    free(text);
    if (!ok)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: its DONE marker says step %lld but its "
                         "manifest says step %lld (a mixed-up checkpoint)", dir, marked,
                         (long long)step);
    return K3RT_OK;
}

static int check_manifest(const char *path, const json_t *m, k3rt_error *err)
{
    if (!json_is_object(m))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: expected a JSON object", path);
    json_int_t format = 0, step = 0;
    K3RT_TRY(manifest_int(path, m, "format", &format, err));
    if (format != 1)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: manifest format %lld; this k3rt reads "
                         "format 1 (written by a newer k3rt?)", path, (long long)format);
    K3RT_TRY(manifest_int(path, m, "step", &step, err));
    if (step < 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: \"step\" is %lld; expected >= 0", path,
                         (long long)step);
    json_t *recipe = json_object_get(m, "recipe");
    json_t *text = json_object_get(recipe, "text"), *hash = json_object_get(recipe, "sha256");
    if (!json_is_object(recipe) || !json_is_string(text) || !json_is_string(hash))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: \"recipe\" must be an object with string "
                         "fields \"text\" and \"sha256\"", path);
    char actual[65];
    sha256_hex(json_string_value(text), json_string_length(text), actual);
    if (strcmp(actual, json_string_value(hash)) != 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: recipe sha256 mismatch: the manifest says "
                         "%s but its recipe text hashes to %s (edited or corrupted manifest)",
                         path, json_string_value(hash), actual);
    return K3RT_OK;
}

int ckpt_read_manifest(const char *dir, json_t **out, k3rt_error *err)
{
    *out = NULL;
    char path[CKPT_PATH_MAX];
    fs_join(path, sizeof path, dir, "manifest.json");
    if (!fs_exists(path))
        return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: missing (is %s a checkpoint directory?)",
                         path, dir);
    json_error_t je;
    json_t *m = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!m)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column,
                         je.text);
    int rc = check_manifest(path, m, err);
    if (!rc)
        rc = check_step_names(dir, json_integer_value(json_object_get(m, "step")), err);
    if (rc) {
        json_decref(m);
        return rc;
    }
    *out = m;
    return K3RT_OK;
}
