/* Saving and resuming a run: weights, plugin state and the manifest, in the directories of
 * ckpt_dir.h (declared in train_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "plugin/sinks.h"
#include "train/ckpt_dir.h"
#include "train/ckpt_verify.h"
#include "train/safetensors.h"
#include "train/train_internal.h"
#include "util/fault.h"
#include "util/fs.h"
#include "util/json_diff.h"
#include "util/log.h"

/* Every module's (and the optimizer's) state tensors under their full names. */
typedef struct named_state {
    struct k3rt_tensor_sink *sinks;
    rig **owners;
    char (*prefixes)[80];
    int n;
} named_state;

static void named_state_free(named_state *s)
{
    for (int i = 0; i < s->n; i++)
        tensor_sink_free(&s->sinks[i]);
    free(s->sinks);
    free(s->owners);
    free(s->prefixes);
    memset(s, 0, sizeof *s);
}

/* opt may be NULL (a model without its optimizer, e.g. for eval and sample); mods 0 leaves
 * the modules out (a ZeRO-1 rank's optimizer shard). */
static int named_state_collect(model *m, rig *opt, int mods, named_state *s, k3rt_error *err)
{
    int first = mods ? 0 : m->n_mods, n = m->n_mods + (opt ? 1 : 0) - first;
    s->sinks = calloc((size_t)n + 1, sizeof *s->sinks);
    s->owners = calloc((size_t)n + 1, sizeof *s->owners);
    s->prefixes = calloc((size_t)n + 1, sizeof *s->prefixes);
    if (!s->sinks || !s->owners || !s->prefixes)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < n; k++) {
        int i = first + k;
        rig *mod = i < m->n_mods ? &m->mods[i].r : opt;
        s->owners[k] = mod;
        snprintf(s->prefixes[k], sizeof s->prefixes[k], "%s",
                 i < m->n_mods ? m->mods[i].prefix : "optimizer.");
        s->n = k + 1;
        K3RT_TRY(rig_state(mod, &s->sinks[k], err));
    }
    return K3RT_OK;
}

json_t *manifest_plugins(const model *m, const rig *opt)
{
    json_t *list = json_array();
    for (int i = 0; i <= m->n_mods; i++) {
        const rig *mod = i < m->n_mods ? &m->mods[i].r : opt;
        const char *slot = i < m->n_mods ? m->mods[i].prefix : "optimizer.";
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s, s:s}", "slot", slot,
                                              "name", mod->e->desc.name, "kind",
                                              k3rt_kind_name(mod->e->desc.kind), "version",
                                              mod->e->desc.version ? mod->e->desc.version : "",
                                              "path", mod->e->path));
    }
    return list;
}

int ckpt_entry_data(st_entry *e, const k3rt_tensor *t, k3rt_stream *s, void **owned,
                      k3rt_error *err)
{
    *owned = NULL;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->data = t->data;
    if (t->device == K3RT_DEVICE_CPU)
        return K3RT_OK;
    size_t bytes = (size_t)k3rt_tensor_numel(t) * k3rt_dtype_size(t->dtype);
    *owned = malloc(bytes ? bytes : 1);
    if (!*owned)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "checkpoint: out of memory");
    K3RT_TRY(k3rt_memcpy(s, *owned, K3RT_DEVICE_CPU, t->data, t->device, bytes, err));
    K3RT_TRY(k3rt_stream_sync(s, err));
    e->data = *owned;
    return K3RT_OK;
}

static void free_owned(void **owned, int n)
{
    for (int i = 0; owned && i < n; i++)
        free(owned[i]);
    free(owned);
}

/* The master weights (fp32 under bf16 compute): what resuming and evaluation need. */
static int write_weights(const model *m, const char *path, json_t **sums, k3rt_error *err)
{
    st_entry *e = calloc((size_t)m->n_params, sizeof *e);
    void **owned = calloc((size_t)m->n_params, sizeof *owned);
    int rc = e && owned ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; !rc && i < m->n_params; i++) {
        e[i].name = m->params[i].name;
        rc = ckpt_entry_data(&e[i], &m->params[i].master, m->opt.stream, &owned[i], err);
    }
    json_t *meta = json_pack("{s:s}", "format", "k3rt");
    if (!rc && !(*sums = ckpt_checksums(e, m->n_params)))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = st_write(path, e, m->n_params, meta, err);
    json_decref(meta);
    free(e);
    free_owned(owned, m->n_params);
    return rc;
}

int ckpt_write_state(rank_ctx *c, const char *path, int mods, int opt, json_t **sums,
                     k3rt_error *err)
{
    named_state s;
    memset(&s, 0, sizeof s);
    int rc = named_state_collect(&c->m, opt ? &c->opt : NULL, mods, &s, err);
    int total = 0;
    for (int i = 0; i < s.n; i++)
        total += s.sinks[i].n;
    st_entry *e = calloc((size_t)total + 1, sizeof *e);
    char (*names)[208] = calloc((size_t)total + 1, sizeof *names);
    void **owned = calloc((size_t)total + 1, sizeof *owned);
    if (!rc && (!e || !names || !owned))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < s.n && !rc; i++)
        for (int j = 0; j < s.sinks[i].n && !rc; j++, k++) {
            const tensor_sink_item *it = &s.sinks[i].items[j];
            snprintf(names[k], sizeof names[k], "%s%s", s.prefixes[i], it->name);
            e[k].name = names[k];
            rc = ckpt_entry_data(&e[k], &it->t, c->stream, &owned[k], err);
        }
    if (!rc && !(*sums = ckpt_checksums(e, k)))
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc)
        rc = st_write(path, e, k, NULL, err);
    free(e);
    free(names);
    free_owned(owned, total);
    named_state_free(&s);
    return rc;
}

int ckpt_save_run(rank_ctx *c, int64_t step, const char *begun, json_t *shards,
                  json_t *shard_sums, k3rt_error *err)
{
    run *r = c->r;
    char dir[1200], path[1300];
    json_t *wsums = NULL, *ssums = NULL;
    if (begun)
        snprintf(dir, sizeof dir, "%s", begun);
    else
        K3RT_TRY(ckpt_begin(r->ckpt_root, step, dir, sizeof dir, err));
    int rc = write_weights(&c->m, fs_join(path, sizeof path, dir, "model.safetensors"), &wsums,
                           err);
    fault_point("ckpt.weights", step);
    if (!rc)
        rc = ckpt_write_state(c, fs_join(path, sizeof path, dir, "state.safetensors"), 1,
                              !shards, &ssums, err);
    fault_point("ckpt.state", step);
    if (rc) {
        json_decref(wsums);
        json_decref(ssums);
        return rc;
    }
    pthread_mutex_lock(&r->lock);
    json_t *man = json_pack(
        "{s:i, s:s, s:s, s:I, s:O, s:{s:s, s:s, s:s}, s:O, s:o, s:O, s:O, s:{s:I, s:I}, "
        "s:{s:I}, s:{s:f, s:f}, s:{s:o, s:o}}",
        "format", 1, "k3rt_version", k3rt_version_string(), "abi", "1.0", "step",
        (json_int_t)step, "run", r->identity, "recipe", "path", recipe_path(r->rec), "text",
        recipe_text(r->rec),
        "sha256", recipe_hash(r->rec), "config", r->doc, "plugins",
        manifest_plugins(&c->m, &c->opt), "changes", r->changes, "balancer", r->balancer,
        "data", "cursor", (json_int_t)(step * r->accum * r->dp), "seed", (json_int_t)r->seed,
        "rng", "seed", (json_int_t)r->seed, "metrics", "train_loss", r->result.final_train_loss,
        "val_loss", r->result.final_val_loss == r->result.final_val_loss
                        ? r->result.final_val_loss : -1.0,
        "tensors", "model.safetensors", wsums, "state.safetensors", ssums);
    pthread_mutex_unlock(&r->lock);
    if (man && shards) {
        json_object_set(man, "optimizer_shards", shards);
        json_object_update(json_object_get(man, "tensors"), shard_sums);
    }
    char *text = man ? json_dumps(man, JSON_INDENT(1) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(man);
    if (!text)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "checkpoint: cannot build the manifest");
    rc = fs_write_atomic(fs_join(path, sizeof path, dir, "manifest.json"), text, strlen(text),
                         err);
    free(text);
    K3RT_TRY(rc);
    fault_point("ckpt.manifest", step);
    K3RT_TRY(ckpt_commit(r->ckpt_root, step, (int)r->keep, r->run_id, err));
    if (!r->opt.quiet)
        log_info("step %lld: checkpoint %s/step_%08lld", (long long)step, r->ckpt_root,
                 (long long)step);
    return K3RT_OK;
}

/* Copies a tensor from a checkpoint file into live storage after checking it fits. */
static int restore(const st_file *f, const char *file, const char *name, k3rt_tensor dst,
                   k3rt_stream *s, k3rt_error *err)
{
    const st_entry *e = st_find(f, name);
    if (!e)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: has no tensor %s (the model or plugin set "
                         "differs from the one that wrote it)", file, name);
    int same = e->ndim == dst.ndim;
    for (int i = 0; same && i < e->ndim; i++)
        same = e->shape[i] == dst.shape[i];
    if (!same) {
        char want[96];
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s has a different shape than %s "
                         "expected by this model (the model shape changed)", file, name,
                         k3rt_tensor_shape_str(&dst, want, sizeof want));
    }
    int64_t n = k3rt_tensor_numel(&dst);
    if (e->dtype == dst.dtype)
        return k3rt_memcpy(s, dst.data, dst.device, e->data, K3RT_DEVICE_CPU,
                           (size_t)n * k3rt_dtype_size(dst.dtype), err);
    if (k3rt_dtype_is_float(e->dtype) && k3rt_dtype_is_float(dst.dtype) &&
        dst.device == K3RT_DEVICE_CPU)
        return k3rt_convert(dst.data, dst.dtype, e->data, e->dtype, n, err);
    return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is %s, expected %s", file, name,
                     k3rt_dtype_name(e->dtype), k3rt_dtype_name(dst.dtype));
}

int ckpt_load_weights(model *m, const char *path, k3rt_error *err)
{
    st_file *f;
    K3RT_TRY(st_open(path, &f, err));
    int rc = K3RT_OK;
    for (int i = 0; i < m->n_params && !rc; i++)
        rc = restore(f, path, m->params[i].name, m->params[i].master, m->opt.stream, err);
    for (int i = 0; i < st_count(f) && !rc; i++)
        if (model_find_param(m, st_at(f, i)->name) < 0)
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: holds parameter %s, which this model does "
                           "not have (the model shape changed)", path, st_at(f, i)->name);
    st_close(f);
    if (!rc)
        rc = model_sync_compute(m, err);
    if (!rc)
        rc = k3rt_stream_sync(m->opt.stream, err);
    return rc;
}

/* Restores every state tensor of the modules (mods) and of opt from the first of the n files
 * that holds it (ZeRO-1 shards: the optimizer state of a parameter is in its owner's file,
 * whatever this rank now owns). */
static int load_named(model *m, rig *opt, int mods, char (*paths)[1300], int n,
                      k3rt_error *err)
{
    st_file **f = calloc((size_t)n, sizeof *f);
    if (!f)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = K3RT_OK;
    for (int q = 0; q < n && !rc; q++)
        rc = st_open(paths[q], &f[q], err);
    named_state s;
    memset(&s, 0, sizeof s);
    if (!rc)
        rc = named_state_collect(m, opt, mods, &s, err);
    for (int i = 0; i < s.n && !rc; i++) {
        for (int j = 0; j < s.sinks[i].n && !rc; j++) {
            char name[208];
            snprintf(name, sizeof name, "%s%s", s.prefixes[i], s.sinks[i].items[j].name);
            int q = 0;
            while (q < n - 1 && !st_find(f[q], name))
                q++;
            if (n > 1 && !st_find(f[q], name))
                rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: none of the %d optimizer shards "
                               "holds %s (the model or optimizer differs from the one that "
                               "wrote them)", paths[0], n, name);
            else
                rc = restore(f[q], paths[q], name, s.sinks[i].items[j].t, m->opt.stream, err);
        }
        if (!rc)
            rc = k3rt_stream_sync(m->opt.stream, err);  /* the copies landed */
        if (!rc)
            rc = rig_state_loaded(s.owners[i], err);
    }
    named_state_free(&s);
    for (int q = 0; q < n; q++)
        if (f[q])
            st_close(f[q]);
    free(f);
    return rc;
}

int ckpt_load_init_states(model *m, const char *path, k3rt_error *err)
{
    st_file *f;
    K3RT_TRY(st_open(path, &f, err));
    named_state s;
    memset(&s, 0, sizeof s);
    int rc = named_state_collect(m, NULL, 1, &s, err), used = 0;
    for (int i = 0; i < s.n && !rc; i++) {
        int here = 0;
        for (int j = 0; j < s.sinks[i].n && !rc; j++) {
            char name[208];
            snprintf(name, sizeof name, "%s%s", s.prefixes[i], s.sinks[i].items[j].name);
            if (!st_find(f, name))
                continue; /* the module keeps its fresh value */
            rc = restore(f, path, name, s.sinks[i].items[j].t, m->opt.stream, err);
            here++;
        }
        used += here;
        if (!rc && here)
            rc = k3rt_stream_sync(m->opt.stream, err);
        if (!rc && here)
            rc = rig_state_loaded(s.owners[i], err);
    }
    /* a tensor no module keeps: a different model or plugin (balancer) set */
    for (int k = 0; k < st_count(f) && !rc && used < st_count(f); k++) {
        const char *name = st_at(f, k)->name;
        int found = 0;
        for (int i = 0; i < s.n && !found; i++)
            for (int j = 0; j < s.sinks[i].n && !found; j++) {
                size_t pl = strlen(s.prefixes[i]);
                found = !strncmp(name, s.prefixes[i], pl) &&
                        !strcmp(name + pl, s.sinks[i].items[j].name);
            }
        if (!found)
            rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: holds state %s, which no module of this "
                           "model keeps (e.g. a balancer without that state: the file was "
                           "written for another)", path, name);
    }
    named_state_free(&s);
    st_close(f);
    return rc;
}

int ckpt_load_states(model *m, rig *opt, const char *path, k3rt_error *err)
{
    char p[1][1300];
    snprintf(p[0], sizeof p[0], "%s", path);
    return load_named(m, opt, 1, p, 1, err);
}

int ckpt_load_run(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    char path[1300];
    K3RT_TRY(ckpt_load_weights(&c->m, fs_join(path, sizeof path, r->resume_dir,
                                              "model.safetensors"), err));
    int n;
    K3RT_TRY(ckpt_shard_count(r->resume_dir, r->manifest, &n, err));
    if (!n)
        return ckpt_load_states(&c->m, &c->opt, fs_join(path, sizeof path, r->resume_dir,
                                                       "state.safetensors"), err);
    /* ZeRO-1 checkpoint: the modules' state from state.safetensors, the optimizer's from the
     * shards, looked up by name, so any plan of owners (or none) resumes from it */
    K3RT_TRY(ckpt_load_states(&c->m, NULL, fs_join(path, sizeof path, r->resume_dir,
                                                  "state.safetensors"), err));
    char(*paths)[1300] = calloc((size_t)n, sizeof *paths);
    if (!paths)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int q = 0; q < n; q++) {
        char name[64];
        fs_join(paths[q], sizeof paths[q], r->resume_dir, ckpt_shard_name(q, name, sizeof name));
    }
    int rc = load_named(&c->m, &c->opt, 0, paths, n, err);
    free(paths);
    return rc;
}

static long long plan_int(const json_t *plan, const char *key)
{
    const json_t *v = json_object_get(plan, key);
    return v ? (long long)json_integer_value(v) : 1;
}

/* The data split may change on resume (dp, micro_batch, grad_accum: the modules' and the
 * optimizer's state is found by name, whatever shards it was written in), as long as a step
 * still takes the same global batch: the data cursor and the learning-rate schedule count in
 * steps of it, and a step's rows are the same whichever ranks and micro-batches share them
 * (data.h), so the run continues on the data it would have seen. */
static int check_split(run *r, const json_t *op, const json_t *np, k3rt_error *err)
{
    static const char *const split[] = {"dp", "micro_batch", "grad_accum"};
    long long o[3], n[3], og = 1, ng = 1;
    int changed = 0;
    for (int i = 0; i < 3; i++) {
        o[i] = plan_int(op, split[i]), n[i] = plan_int(np, split[i]);
        og *= o[i], ng *= n[i], changed |= o[i] != n[i];
    }
    if (og != ng)
        return k3rt_fail(err, K3RT_ERR_INVALID, "--resume: the checkpoint in %s takes a global "
                         "batch of dp x micro_batch x grad_accum = %lld x %lld x %lld = %lld "
                         "sequences a step, this run %lld x %lld x %lld = %lld; a resumed run "
                         "keeps the global batch (the data order and the learning-rate "
                         "schedule count in its steps): choose plan.dp, plan.micro_batch and "
                         "plan.grad_accum with the product %lld", r->resume_dir, o[0], o[1],
                         o[2], og, n[0], n[1], n[2], ng, og);
    if (changed)
        log_info("--resume: resharded from dp %lld x micro_batch %lld x grad_accum %lld to "
                 "%lld x %lld x %lld (the same %lld sequences a step)", o[0], o[1], o[2], n[0],
                 n[1], n[2], og);
    return K3RT_OK;
}

int ckpt_check_compatible(run *r, k3rt_error *err)
{
    const json_t *old = json_object_get(r->manifest, "config");
    const char *plan_keys[] = {"ep", "cp", "seq_len"};
    const json_t *op = json_object_get(old, "plan"), *np = json_object_get(r->doc, "plan");
    for (size_t i = 0; i < sizeof plan_keys / sizeof plan_keys[0]; i++)
        if (!json_equal(json_object_get(op, plan_keys[i]), json_object_get(np, plan_keys[i])))
            return k3rt_fail(err, K3RT_ERR_INVALID,
                             "--resume: the checkpoint in %s was trained with plan.%s = %lld, "
                             "this run has %lld; resharding changes only plan.dp, "
                             "plan.micro_batch and plan.grad_accum (at the same global batch)",
                             r->resume_dir, plan_keys[i],
                             (long long)json_integer_value(json_object_get(op, plan_keys[i])),
                             (long long)json_integer_value(json_object_get(np, plan_keys[i])));
    K3RT_TRY(check_split(r, op, np, err));
    /* The balancer may change mid-run (recorded in the manifest); the rest of the model may
     * not. */
    json_t *om = json_deep_copy(json_object_get(old, "model"));
    json_t *nm = json_deep_copy(json_object_get(r->doc, "model"));
    json_object_del(om, "balancer");
    json_object_del(nm, "balancer");
    char where[256];
    int differs = json_first_difference(om, nm, "model", where, sizeof where);
    json_decref(om);
    json_decref(nm);
    if (differs)
        return k3rt_fail(err, K3RT_ERR_INVALID, "--resume: the checkpoint in %s has a different "
                         "model or plugin set (first difference at %s); resume needs the same "
                         "model", r->resume_dir, where);
    const json_t *oo = json_object_get(old, "optimizer"), *no = json_object_get(r->doc, "optimizer");
    if (!json_equal(json_object_get(oo, "plugin"), json_object_get(no, "plugin")))
        return k3rt_fail(err, K3RT_ERR_INVALID, "--resume: the checkpoint in %s was trained with "
                         "optimizer %s, this run uses %s", r->resume_dir,
                         json_string_value(json_object_get(oo, "plugin")),
                         json_string_value(json_object_get(no, "plugin")));
    if (json_first_difference(json_object_get(old, "train"), json_object_get(r->doc, "train"),
                         "train", where, sizeof where))
        log_info("note: --resume with a changed training setting (%s): allowed", where);
    if (json_first_difference(oo, no, "optimizer", where, sizeof where))
        log_info("note: --resume with a changed optimizer setting (%s): allowed", where);
    return K3RT_OK;
}
