/* config.json <-> model document (hf_config.h). */
#include "interop/hf_config.h"

#include <ctype.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <k3rt/tensor.h>

/* A "config" map value: the Hub key, and the k3rt value that the Hub writes as null. */
static const char *hub_key(const json_t *v, const json_t **null_is)
{
    *null_is = json_object_get(v, "null_is");
    return json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "key"));
}

/* The Hub key and, under "also", the keys that repeat its value (num_key_value_heads). */
static void set_hub(json_t *cfg, const json_t *map_value, const json_t *value)
{
    const json_t *null_is;
    const char *key = hub_key(map_value, &null_is);
    if (!key || !value)
        return;
    json_t *v = null_is && json_equal(value, null_is) ? json_null() : json_deep_copy(value);
    size_t i;
    const json_t *also;
    json_array_foreach(json_object_get(map_value, "also"), i, also)
        hf_set_path(cfg, json_string_value(also), json_deep_copy(v));
    hf_set_path(cfg, key, v);
}

/* The Hub's value of an option: a constant, {"option": other} (the module's other option) or
 * {"model": key} (the model document's key: latent_moe's latent width is d_model there). */
static const json_t *hub_value(const json_t *want, const json_t *config, const json_t *model)
{
    const json_t *other = json_object_get(want, "option");
    if (json_is_string(other))
        return json_object_get(config, json_string_value(other));
    const json_t *key = json_object_get(want, "model");
    return json_is_string(key) ? json_object_get(model, json_string_value(key)) : want;
}

/* One module's options into the config, and how it differs from the Hub's Kimi-Linear. */
static void module_config(const hf_table *t, const json_t *model, const json_t *spec, json_t *cfg,
                          json_t *differs)
{
    const char *plugin = json_string_value(json_object_get(spec, "plugin"));
    const json_t *entry = hf_table_plugin(t, plugin), *config = json_object_get(spec, "config");
    const char *opt;
    const json_t *v;
    if (!entry) {
        char d[160];
        snprintf(d, sizeof d, "%s: not in the table", plugin ? plugin : "?");
        json_array_append_new(differs, json_string(d));
        return;
    }
    json_object_foreach(json_object_get(entry, "config"), opt, v)
        set_hub(cfg, v, json_object_get(config, opt));
    json_object_foreach(json_object_get(entry, "hub"), opt, v) {
        const json_t *have = json_object_get(config, opt), *want = hub_value(v, config, model);
        int same = have && want && (json_equal(have, want) ||
                                    (json_is_number(have) && json_is_number(want) &&
                                     json_number_value(have) == json_number_value(want)));
        if (!same) {
            char *h = have ? json_dumps(have, JSON_ENCODE_ANY) : NULL;
            char *w = want ? json_dumps(want, JSON_ENCODE_ANY) : NULL;
            char d[256];
            snprintf(d, sizeof d, "%s.%s = %s (Kimi-Linear: %s)", plugin, opt, h ? h : "?",
                     w ? w : "?");
            free(h);
            free(w);
            if (!json_array_size(differs) ||
                strcmp(json_string_value(json_array_get(differs, json_array_size(differs) - 1)), d))
                json_array_append_new(differs, json_string(d));
        }
    }
}

static int differs_has(const json_t *differs, const char *d)
{
    size_t i;
    const json_t *s;
    json_array_foreach(differs, i, s)
        if (!strcmp(json_string_value(s), d))
            return 1;
    return 0;
}

int hf_config_from_model(const hf_table *t, const json_t *model, int dtype,
                         const json_t *extra_differs, json_t **out, k3rt_error *err)
{
    /* "dtype" as transformers >= 4.56 writes it, "torch_dtype" for older readers */
    const char *dt = dtype == K3RT_BF16 ? "bfloat16" : "float32";
    json_t *cfg = json_pack("{s:[s], s:s, s:s}", "architectures", "KimiLinearForCausalLM",
                            "dtype", dt, "torch_dtype", dt);
    json_t *differs = json_array(), *seen = json_array();
    if (!cfg || !differs || !seen)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    const char *key;
    const json_t *v;
    json_object_foreach(json_object_get(json_object_get(t->doc, "model"), "fixed"), key, v)
        hf_set_path(cfg, key, json_deep_copy(json_object_get(v, "value")));
    json_object_foreach(json_object_get(json_object_get(t->doc, "model"), "config"), key, v)
        set_hub(cfg, v, json_object_get(model, key));
    int layers = (int)json_integer_value(json_object_get(model, "layers"));
    for (int i = 0; i < layers; i++)
        for (int s = 0; s < 2; s++) {
            const json_t *spec = hf_layer_spec(model, i, s ? "ffn" : "mixer");
            const json_t *entry = hf_table_plugin(t, json_string_value(json_object_get(spec,
                                                                                   "plugin")));
            const char *list = json_string_value(json_object_get(entry, "layers_key"));
            if (list) {
                json_t *a = (json_t *)hf_get_path(cfg, list);
                if (!json_is_array(a)) {
                    a = json_array();
                    hf_set_path(cfg, list, a);
                }
                json_array_append_new(a, json_integer(i + 1));
            }
            /* each distinct module once (json_equal on the spec) */
            size_t k;
            const json_t *prev;
            int dup = 0;
            json_array_foreach(seen, k, prev)
                dup |= json_equal(prev, spec);
            if (spec && !dup) {
                json_array_append(seen, (json_t *)spec);
                json_t *d = json_array();
                module_config(t, model, spec, cfg, d);
                json_array_foreach(d, k, prev)
                    if (!differs_has(differs, json_string_value(prev)))
                        json_array_append(differs, (json_t *)prev);
                json_decref(d);
            }
        }
    const char *res = json_string_value(json_object_get(json_object_get(model, "residual"),
                                                        "plugin"));
    if (!hf_table_plugin(t, res)) {
        char d[160];
        snprintf(d, sizeof d, "residual %s: not in the table", res ? res : "?");
        json_array_append_new(differs, json_string(d));
    }
    size_t k;
    const json_t *d;
    json_array_foreach(extra_differs, k, d)
        json_array_append(differs, (json_t *)d);
    int kimi = json_array_size(differs) == 0;
    json_object_set_new(cfg, "model_type", json_string(kimi ? "kimi_linear" : "kimi_k3"));
    json_t *k3 = json_pack("{s:i, s:O}", "format", 1, "model", model);
    if (!kimi)
        json_object_set(k3, "differs_from_kimi_linear", differs);
    json_object_set_new(cfg, "k3rt", k3);
    json_decref(differs);
    json_decref(seen);
    *out = cfg;
    return K3RT_OK;
}

/* A module spec {"plugin", "config"} of a table entry from the Hub fields. */
static json_t *module_from_hub(const char *plugin, const json_t *entry, const json_t *cfg,
                               const json_t *model)
{
    json_t *config = json_object();
    const char *opt;
    const json_t *v;
    json_object_foreach(json_object_get(entry, "config"), opt, v) {
        const json_t *null_is;
        const json_t *have = hf_get_path(cfg, hub_key(v, &null_is));
        if (json_is_null(have) && null_is)
            have = null_is;
        if (have && !json_is_null(have))
            json_object_set_new(config, opt, json_deep_copy(have));
    }
    json_object_foreach(json_object_get(entry, "hub"), opt, v) {
        const json_t *want = hub_value(v, config, model);
        json_object_set_new(config, opt, want ? json_deep_copy(want) : json_null());
    }
    return json_pack("{s:s, s:o}", "plugin", plugin, "config", config);
}

/* How many of the entry's Hub keys the config holds (non-null); -1 when one is missing. */
static int hub_keys_present(const json_t *entry, const json_t *cfg)
{
    int n = 0;
    const char *opt;
    const json_t *v;
    json_object_foreach(json_object_get(entry, "config"), opt, v) {
        const json_t *null_is;
        const json_t *have = hf_get_path(cfg, hub_key(v, &null_is));
        if (!have || (json_is_null(have) && !null_is))
            return -1;
        n++;
    }
    return n;
}

static int mixers_from_hub(const hf_table *t, const json_t *cfg, int layers, json_t *model,
                           const char *path, k3rt_error *err)
{
    char pattern[4096] = "";
    if (layers < 1 || layers >= (int)sizeof pattern)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: num_hidden_layers %d is not 1 to %d", path,
                         layers, (int)sizeof pattern - 1);
    memset(pattern, '?', (size_t)layers);
    pattern[layers] = '\0';
    json_t *mixers = json_object();
    json_object_set_new(model, "mixers", mixers);
    const char *plugin;
    const json_t *entry;
    json_object_foreach(json_object_get(t->doc, "plugins"), plugin, entry) {
        const char *list = json_string_value(json_object_get(entry, "layers_key"));
        const json_t *a = list ? hf_get_path(cfg, list) : NULL;
        if (!json_array_size(a))
            continue;
        char letter[2] = {(char)toupper((unsigned char)plugin[0]), 0};
        json_object_set_new(mixers, letter, module_from_hub(plugin, entry, cfg, model));
        size_t k;
        const json_t *v;
        json_array_foreach(a, k, v) {
            json_int_t l = json_integer_value(v);
            if (l < 1 || l > layers || pattern[l - 1] != '?')
                return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s lists layer %lld, which is "
                                 "outside 1..%d or listed twice", path, list, (long long)l,
                                 layers);
            pattern[l - 1] = letter[0];
        }
    }
    char *gap = strchr(pattern, '?');
    if (gap)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: layer %d is in no mixer list of the "
                         "table (linear_attn_config.kda_layers / full_attn_layers)", path,
                         (int)(gap - pattern) + 1);
    json_object_set_new(model, "pattern", json_string(pattern));
    return K3RT_OK;
}

/* ffn: the FFN plugin whose Hub keys are all present, the most of them (MoE over dense);
 * dense_ffn for the first first_k_dense_replace layers: the next one. */
static int ffns_from_hub(const hf_table *t, const json_t *cfg, json_t *model, const char *path,
                         k3rt_error *err)
{
    const char *best[2] = {NULL, NULL};
    int score[2] = {-1, -1};
    const char *plugin, *residual = NULL;
    const json_t *entry;
    json_object_foreach(json_object_get(t->doc, "plugins"), plugin, entry) {
        const char *slot = json_string_value(json_object_get(entry, "slot"));
        if (slot && !strcmp(slot, "residual") && !residual)
            residual = plugin;
        if (!slot || strcmp(slot, "ffn"))
            continue;
        int n = hub_keys_present(entry, cfg);
        if (n > score[0]) {
            best[1] = best[0], score[1] = score[0];
            best[0] = plugin, score[0] = n;
        } else if (n > score[1]) {
            best[1] = plugin, score[1] = n;
        }
    }
    if (score[0] < 0 || !residual)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: no FFN plugin of the table has all "
                         "its fields here, or the table has no residual plugin", path);
    const json_t *ffn = hf_table_plugin(t, best[0]);
    json_object_set_new(model, "ffn", module_from_hub(best[0], ffn, cfg, model));
    /* a routed FFN whose router bias the Hub keeps (e_score_correction_bias) is balanced the
     * Hub model's way: DeepSeek / Kimi train with the auxiliary-loss-free bias */
    const json_t *bal = json_object_get(json_object_get(t->doc, "model"), "hub_balancer");
    if (json_object_get(ffn, "balancer_state") && json_is_object(bal))
        json_object_set_new(model, "balancer", json_deep_copy(bal));
    json_int_t dense = json_integer_value(json_object_get(model, "dense_layers"));
    if (dense > 0) {
        if (score[1] < 0)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: first_k_dense_replace = %lld but "
                             "no second FFN plugin of the table matches the fields (the dense "
                             "layers' intermediate_size)", path, (long long)dense);
        json_object_set_new(model, "dense_ffn",
                            module_from_hub(best[1], hf_table_plugin(t, best[1]), cfg, model));
    }
    json_object_set_new(model, "residual", json_pack("{s:s, s:{}}", "plugin", residual,
                                                     "config"));
    return K3RT_OK;
}

/* The table's "fixed" Hub fields: a folder that states another value is a model k3rt does not
 * compute, refused by the key and the table's reason. */
static int check_fixed(const hf_table *t, const json_t *cfg, const char *path, k3rt_error *err)
{
    const char *key;
    const json_t *v;
    json_object_foreach(json_object_get(json_object_get(t->doc, "model"), "fixed"), key, v) {
        const json_t *have = hf_get_path(cfg, key), *want = json_object_get(v, "value");
        if (!have || json_is_null(have) || json_equal(have, want) ||
            (json_is_number(have) && json_is_number(want) &&
             json_number_value(have) == json_number_value(want)))
            continue;
        char *h = json_dumps(have, JSON_ENCODE_ANY), *w = json_dumps(want, JSON_ENCODE_ANY);
        int rc = k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: %s = %s, k3rt computes only %s: %s",
                           path, key, h ? h : "?", w ? w : "?",
                           json_string_value(json_object_get(v, "why")));
        free(h);
        free(w);
        return rc;
    }
    return K3RT_OK;
}

int hf_model_from_config(const hf_table *t, const json_t *cfg, const char *path, json_t **out,
                         k3rt_error *err)
{
    const json_t *own = hf_get_path(cfg, "k3rt.model");
    if (json_is_object(own)) {
        *out = json_deep_copy(own);
        return *out ? K3RT_OK : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    json_t *model = json_object();
    const char *key;
    const json_t *v;
    json_object_foreach(json_object_get(json_object_get(t->doc, "model"), "config"), key, v) {
        const json_t *null_is;
        const json_t *have = hf_get_path(cfg, hub_key(v, &null_is));
        if (have && !json_is_null(have))
            json_object_set_new(model, key, json_deep_copy(have));
    }
    int rc = check_fixed(t, cfg, path, err);
    if (!rc)
        rc = mixers_from_hub(t, cfg, (int)json_integer_value(json_object_get(model, "layers")),
                             model, path, err);
    if (!rc)
        rc = ffns_from_hub(t, cfg, model, path, err);
    if (rc) {
        json_decref(model);
        return rc;
    }
    *out = model;
    return K3RT_OK;
}
