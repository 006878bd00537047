/* The Hugging Face name table and the model document's layers (hf_table.h). */
#include "interop/hf_table.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"

int hf_table_open(hf_table *t, const char *path, const registry *reg, k3rt_error *err)
{
    memset(t, 0, sizeof *t);
    if (path) {
        snprintf(t->path, sizeof t->path, "%s", path);
    } else {
        for (int i = 0; i < reg->n && !t->path[0]; i++) {
            char dir[1100];
            if (!strcmp(reg->entries[i].path, "(built-in)"))
                continue;
            fs_dirname(dir, sizeof dir, reg->entries[i].path);
            fs_join(t->path, sizeof t->path, dir, HF_TABLE_FILE);
            if (!fs_exists(t->path))
                t->path[0] = '\0';
        }
        if (!t->path[0])
            return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "no %s beside the plugins on the search "
                             "path (it is installed with them; name one with --names FILE)",
                             HF_TABLE_FILE);
    }
    json_error_t je;
    t->doc = json_load_file(t->path, 0, &je);
    if (!t->doc)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s:%d: %s", t->path, je.line, je.text);
    if (json_integer_value(json_object_get(t->doc, "format")) != 1 ||
        !json_is_object(json_object_get(t->doc, "plugins")) ||
        !json_is_object(json_object_get(json_object_get(t->doc, "model"), "params")))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: expected {\"format\": 1, \"model\": "
                         "{\"params\"}, \"plugins\"}", t->path);
    return K3RT_OK;
}

void hf_table_close(hf_table *t)
{
    json_decref(t->doc);
    memset(t, 0, sizeof *t);
}

const json_t *hf_table_plugin(const hf_table *t, const char *plugin)
{
    return plugin ? json_object_get(json_object_get(t->doc, "plugins"), plugin) : NULL;
}

const json_t *hf_layer_spec(const json_t *model, int layer, const char *slot)
{
    if (layer < 0 || layer >= json_integer_value(json_object_get(model, "layers")))
        return NULL;
    if (!strcmp(slot, "residual"))
        return json_object_get(model, "residual");
    if (!strcmp(slot, "ffn"))
        return json_object_get(model, layer < json_integer_value(json_object_get(
                                                  model, "dense_layers"))
                                          ? "dense_ffn" : "ffn");
    if (strcmp(slot, "mixer"))
        return NULL;
    const char *pattern = json_string_value(json_object_get(model, "pattern"));
    char letter[2] = {pattern && (int)strlen(pattern) > layer ? pattern[layer] : 0, 0};
    return json_object_get(json_object_get(model, "mixers"), letter);
}

const char *hf_fill(char *buf, size_t len, const char *template, int i, int j)
{
    size_t at = 0;
    for (const char *s = template; *s && at + 12 < len; s++) {
        if ((!strncmp(s, "{i}", 3) || !strncmp(s, "{j}", 3))) {
            at += (size_t)snprintf(buf + at, len - at, "%d", s[1] == 'i' ? i : j);
            s += 2;
        } else {
            buf[at++] = *s;
        }
    }
    buf[at] = '\0';
    return buf;
}

int hf_match(const char *template, const char *name, int *i, int *j)
{
    *i = *j = -1;
    const char *t = template, *n = name;
    while (*t) {
        if (!strncmp(t, "{i}", 3) || !strncmp(t, "{j}", 3)) {
            if (!isdigit((unsigned char)*n))
                return 0;
            int v = 0;
            while (isdigit((unsigned char)*n) && v < 100000000)
                v = v * 10 + (*n++ - '0');
            *(t[1] == 'i' ? i : j) = v;
            t += 3;
        } else if (*t++ != *n++) {
            return 0;
        }
    }
    return *n == '\0';
}

const json_t *hf_get_path(const json_t *obj, const char *path)
{
    char key[128];
    const char *dot;
    while (obj && (dot = strchr(path, '.'))) {
        snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
        obj = json_object_get(obj, key);
        path = dot + 1;
    }
    return obj ? json_object_get(obj, path) : NULL;
}

int hf_set_path(json_t *obj, const char *path, json_t *value)
{
    char key[128];
    const char *dot;
    while ((dot = strchr(path, '.'))) {
        snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
        json_t *next = json_object_get(obj, key);
        if (!next) {
            next = json_object();
            json_object_set_new(obj, key, next);
        }
        obj = next;
        path = dot + 1;
    }
    return json_object_set_new(obj, path, value) ? K3RT_ERR_NOMEM : K3RT_OK;
}
