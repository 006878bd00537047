/* A model document written back as a Lua recipe (hf_recipe.h). */
#include "interop/hf_recipe.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"

static void lua_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\%03d", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static int is_name(const char *k)
{
    if (!isalpha((unsigned char)*k) && *k != '_')
        return 0;
    for (; *k; k++)
        if (!isalnum((unsigned char)*k) && *k != '_')
            return 0;
    return 1;
}

static void lua_value(FILE *f, const json_t *v, int depth);

static void lua_fields(FILE *f, const json_t *obj, int depth)
{
    const char *key;
    const json_t *v;
    int first = 1;
    json_object_foreach((json_t *)obj, key, v) {
        fprintf(f, "%s\n%*s", first ? "" : ",", 2 * depth, "");
        if (is_name(key))
            fprintf(f, "%s = ", key);
        else {
            fputc('[', f);
            lua_string(f, key);
            fputs("] = ", f);
        }
        lua_value(f, v, depth);
        first = 0;
    }
}

/* A module spec: k3.NAME { options }, or k3.plugin("path", { options }) for one loaded by
 * its file. */
static void lua_spec(FILE *f, const json_t *spec, int depth)
{
    const char *plugin = json_string_value(json_object_get(spec, "plugin"));
    const char *path = json_string_value(json_object_get(spec, "path"));
    const json_t *config = json_object_get(spec, "config");
    if (path) {
        fputs("k3.plugin(", f);
        lua_string(f, path);
        fputs(", {", f);
    } else {
        fprintf(f, "k3.%s {", plugin);
    }
    if (json_object_size(config)) {
        lua_fields(f, config, depth + 1);
        fprintf(f, "\n%*s", 2 * depth, "");
    }
    fputs(path ? "})" : "}", f);
}

static void lua_value(FILE *f, const json_t *v, int depth)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        if (json_is_string(json_object_get(v, "plugin")) && json_object_get(v, "config")) {
            lua_spec(f, v, depth);
            return;
        }
        fputc('{', f);
        lua_fields(f, v, depth + 1);
        fprintf(f, "\n%*s}", 2 * depth, "");
        return;
    case JSON_ARRAY: {
        size_t i;
        const json_t *x;
        fputc('{', f);
        json_array_foreach(v, i, x) {
            fputs(i ? ", " : " ", f);
            lua_value(f, x, depth + 1);
        }
        fputs(" }", f);
        return;
    }
    case JSON_STRING: lua_string(f, json_string_value(v)); return;
    case JSON_INTEGER: fprintf(f, "%lld", (long long)json_integer_value(v)); return;
    case JSON_REAL: fprintf(f, "%.17g", json_real_value(v)); return;
    case JSON_TRUE: fputs("true", f); return;
    case JSON_FALSE: fputs("false", f); return;
    default: fputs("k3.none", f); return;
    }
}

int hf_write_recipe(const char *path, const json_t *model, const json_t *k3,
                    const char *weights, const char *state, const char *src, k3rt_error *err)
{
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    FILE *f = a.f;
    const json_t *plan = json_object_get(k3, "plan"), *data = json_object_get(k3, "data");
    fputs("-- Written by k3rt import from ", f);
    fputs(src, f);
    fputs(". The model is the imported one; train.init_weights loads its weights\n"
          "-- (so `k3rt eval` of this recipe scores them and `k3rt train` fine-tunes them).\n",
          f);
    if (!data)
        fputs("-- The data below is a placeholder: point it at shards of the model's tokenizer\n"
              "-- (scripts/data/prepare.py).\n", f);
    fputs("return k3.recipe {\n  model = ", f);
    lua_value(f, model, 1);
    fputs(",\n  optimizer = k3.adamw { lr = 3e-4, weight_decay = 0.1 },\n  plan = ", f);
    if (plan)
        lua_value(f, plan, 1);
    else
        fputs("{ micro_batch = 8, seq_len = 1024 }", f);
    fputs(",\n  train = { steps = 1000, warmup = 50, schedule = \"cosine\", init_weights = ", f);
    lua_string(f, weights);
    if (state) {
        fputs(",\n            init_state = ", f);
        lua_string(f, state);
    }
    fputs(" },\n  data = ", f);
    if (data)
        lua_value(f, data, 1);
    else
        fputs("{ tokenizer = \"shards\", train = \"train.bin\", val = \"val.bin\" }", f);
    fputs(",\n}\n", f);
    return fs_atomic_commit(&a, err);
}
