/* The getters a plugin reads its validated configuration with (k3rt/config.h): the
 * k3rt_config is the JSON object the host validated (plugin/options.h). */
#include <jansson.h>
#include <k3rt/config.h>

static const json_t *json_of(const k3rt_config *cfg) { return (const json_t *)cfg; }

int64_t k3rt_cfg_int(const k3rt_config *cfg, const char *key)
{
    json_t *v = json_object_get(json_of(cfg), key);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return json_is_real(v) ? (int64_t)json_real_value(v) : 0;
}

double k3rt_cfg_float(const k3rt_config *cfg, const char *key)
{
    json_t *v = json_object_get(json_of(cfg), key);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

int k3rt_cfg_bool(const k3rt_config *cfg, const char *key)
{
    return json_is_true(json_object_get(json_of(cfg), key));
}

const char *k3rt_cfg_string(const k3rt_config *cfg, const char *key)
{
    json_t *v = json_object_get(json_of(cfg), key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int k3rt_cfg_is_null(const k3rt_config *cfg, const char *key)
{
    json_t *v = json_object_get(json_of(cfg), key);
    return v == NULL || json_is_null(v);
}
