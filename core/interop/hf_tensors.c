/* Tensor lists, per-head interleave and Hugging Face weight files (hf_tensors.h). */
#include "interop/hf_tensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"

int hf_list_add(hf_list *l, const char *name, int dtype, int ndim, const int64_t *shape,
                const void *data, int own, k3rt_error *err)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        st_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (e)
            l->e = e;
        char **names = e ? realloc(l->names, (size_t)cap * sizeof *names) : NULL;
        if (names)
            l->names = names;
        void **owned = names ? realloc(l->owned, (size_t)cap * sizeof *owned) : NULL;
        if (!owned) {
            if (own)
                free((void *)data);
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        }
        l->owned = owned;
        l->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) {
        if (own)
            free((void *)data);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    st_entry *e = &l->e[l->n];
    memset(e, 0, sizeof *e);
    e->name = copy;
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        e->shape[d] = shape[d];
    e->data = data;
    l->names[l->n] = copy;
    l->owned[l->n++] = own ? (void *)data : NULL;
    return K3RT_OK;
}

void hf_list_free(hf_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->names[i]);
        free(l->owned[i]);
    }
    free(l->e);
    free(l->names);
    free(l->owned);
    memset(l, 0, sizeof *l);
}

int hf_list_find(const hf_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].name, name))
            return i;
    return -1;
}

void hf_fuse_heads(const void *const *parts, const int64_t *w, int k, int64_t H, int64_t cols,
                   size_t esize, void *out)
{
    char *o = out;
    for (int64_t h = 0; h < H; h++)
        for (int p = 0; p < k; p++) {
            size_t bytes = (size_t)(w[p] * cols) * esize;
            memcpy(o, (const char *)parts[p] + (size_t)h * bytes, bytes);
            o += bytes;
        }
}

void hf_split_heads(const void *in, const int64_t *w, int k, int64_t H, int64_t cols,
                    size_t esize, void *const *parts)
{
    const char *s = in;
    for (int64_t h = 0; h < H; h++)
        for (int p = 0; p < k; p++) {
            size_t bytes = (size_t)(w[p] * cols) * esize;
            memcpy((char *)parts[p] + (size_t)h * bytes, s, bytes);
            s += bytes;
        }
}

static int64_t entry_bytes(const st_entry *e)
{
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    return n * (int64_t)k3rt_dtype_size(e->dtype);
}

int hf_write_weights(const char *dir, const hf_list *l, int64_t shard_bytes, int *shards,
                     k3rt_error *err)
{
    /* shard k holds entries [first[k], first[k + 1]) */
    int *first = malloc(((size_t)l->n + 2) * sizeof *first);
    if (!first)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int n = 0;
    int64_t in_shard = 0, total = 0;
    for (int i = 0; i < l->n; i++) {
        int64_t b = entry_bytes(&l->e[i]);
        if (i == 0 || (in_shard > 0 && in_shard + b > shard_bytes)) {
            first[n++] = i;
            in_shard = 0;
        }
        in_shard += b;
        total += b;
    }
    first[n] = l->n;
    *shards = n;
    json_t *meta = json_pack("{s:s}", "format", "pt");
    json_t *map = json_object();
    char file[64], path[1400];
    int rc = K3RT_OK;
    for (int k = 0; k < n && !rc; k++) {
        if (n == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n);
        rc = st_write(fs_join(path, sizeof path, dir, file), l->e + first[k],
                      first[k + 1] - first[k], meta, err);
        for (int i = first[k]; i < first[k + 1]; i++)
            json_object_set_new(map, l->e[i].name, json_string(file));
    }
    if (!rc && n > 1) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", map);
        char *text = json_dumps(index, JSON_INDENT(2));
        rc = text ? fs_write_atomic(fs_join(path, sizeof path, dir,
                                            "model.safetensors.index.json"),
                                    text, strlen(text), err)
                  : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        free(text);
        json_decref(index);
    }
    json_decref(map);
    json_decref(meta);
    free(first);
    return rc;
}

/* The shard files of the folder: the index's (each once, in order of appearance), or
 * model.safetensors alone. */
static int shard_names(const char *dir, json_t **names, k3rt_error *err)
{
    char path[1400];
    fs_join(path, sizeof path, dir, "model.safetensors.index.json");
    *names = json_array();
    if (!fs_exists(path)) {
        json_array_append_new(*names, json_string("model.safetensors"));
        return K3RT_OK;
    }
    json_error_t je;
    json_t *index = json_load_file(path, 0, &je);
    const json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map)) {
        json_decref(index);
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: expected a JSON object with a "
                         "\"weight_map\" object%s%s", path, index ? "" : ": ",
                         index ? "" : je.text);
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const char *f = json_string_value(v);
        int seen = 0;
        size_t i;
        const json_t *s;
        json_array_foreach(*names, i, s)
            seen |= f && !strcmp(json_string_value(s), f);
        if (!f || strchr(f, '/')) {
            json_decref(index);
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: weight_map[\"%s\"] must name a file "
                             "in the folder", path, key);
        }
        if (!seen)
            json_array_append_new(*names, json_string(f));
    }
    json_decref(index);
    return K3RT_OK;
}

int hf_read_weights(const char *dir, hf_weights *w, k3rt_error *err)
{
    memset(w, 0, sizeof *w);
    json_t *names;
    int rc = shard_names(dir, &names, err);
    size_t n = json_array_size(names);
    w->files = rc ? NULL : calloc(n + 1, sizeof *w->files);
    if (!rc && !w->files)
        rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < n && !rc; k++) {
        char path[1400];
        fs_join(path, sizeof path, dir, json_string_value(json_array_get(names, k)));
        rc = st_open(path, &w->files[k], err);
        if (rc)
            break;
        w->n_files++;
        for (int i = 0; i < st_count(w->files[k]) && !rc; i++) {
            const st_entry *e = st_at(w->files[k], i);
            if (hf_list_find(&w->all, e->name) >= 0)
                rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: tensor %s is also in an earlier "
                               "shard", path, e->name);
            else
                rc = hf_list_add(&w->all, e->name, e->dtype, e->ndim, e->shape, e->data, 0,
                                 err);
        }
    }
    json_decref(names);
    return rc;
}

void hf_close_weights(hf_weights *w)
{
    hf_list_free(&w->all);
    for (int k = 0; k < w->n_files; k++)
        st_close(w->files[k]);
    free(w->files);
    memset(w, 0, sizeof *w);
}
