/* Plugin option schemas: validation with suggestions, defaults, typed getters
 * (options.h, k3rt/config.h). */
#include "plugin/options.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "util/nearest.h"

static const k3rt_option *option_at(const k3rt_option *options, uint32_t size, uint32_t i)
{
    return (const k3rt_option *)((const char *)options + (size_t)i * size);
}

/* help is the entry's last field; entries of option_size bytes that end before it have none
 * (the loader accepts them), and reading it would run into the next entry. */
static const char *option_help(const k3rt_option *o, uint32_t size)
{
    return size >= offsetof(k3rt_option, help) + sizeof o->help ? o->help : NULL;
}

static const char *type_name(int type)
{
    switch (type) {
    case K3RT_OPT_INT: return "an integer";
    case K3RT_OPT_FLOAT: return "a number";
    case K3RT_OPT_BOOL: return "a boolean";
    case K3RT_OPT_STRING: return "a string";
    default: return "?";
    }
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "a table";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "none";
    }
    return "?";
}

static int choice_ok(const char *choices, const char *s)
{
    size_t n = strlen(s);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, s, n))
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

static int check_value(const k3rt_option *o, json_t *cfg, json_t *v, const char *what,
                       k3rt_error *err)
{
    if (json_is_null(v)) {
        if (o->flags & K3RT_OPT_NULLABLE)
            return K3RT_OK;
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' cannot be none (expected %s)",
                         what, o->name, type_name(o->type));
    }
    double num = 0;
    switch (o->type) {
    case K3RT_OPT_INT:
        if (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v) &&
            fabs(json_real_value(v)) < 9e15) {
            /* Lua writes 4.0 for computed integers; accept whole numbers. */
            json_object_set_new(cfg, o->name, json_integer((json_int_t)json_real_value(v)));
            v = json_object_get(cfg, o->name);
        }
        if (!json_is_integer(v))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' expects %s, got %s", what,
                             o->name, type_name(o->type), json_kind(v));
        num = (double)json_integer_value(v);
        break;
    case K3RT_OPT_FLOAT:
        if (!json_is_number(v))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' expects %s, got %s", what,
                             o->name, type_name(o->type), json_kind(v));
        num = json_number_value(v);
        if (!isfinite(num))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' must be finite", what,
                             o->name);
        break;
    case K3RT_OPT_BOOL:
        if (!json_is_boolean(v))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' expects %s, got %s", what,
                             o->name, type_name(o->type), json_kind(v));
        return K3RT_OK;
    case K3RT_OPT_STRING:
        if (!json_is_string(v))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' expects %s, got %s", what,
                             o->name, type_name(o->type), json_kind(v));
        if (o->choices && !choice_ok(o->choices, json_string_value(v)))
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' must be one of %s, got '%s'",
                             what, o->name, o->choices, json_string_value(v));
        return K3RT_OK;
    default:
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: option '%s' has unknown type %d", what,
                         o->name, o->type);
    }
    if (o->min <= o->max && (num < o->min || num > o->max))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: key '%s' must be in [%g, %g], got %g",
                         what, o->name, o->min, o->max, num);
    return K3RT_OK;
}

int options_apply(const k3rt_option *options, uint32_t n_options, uint32_t option_size,
                  json_t *cfg, const char *what, k3rt_error *err)
{
    if (!json_is_object(cfg))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: configuration must be a table", what);
    if (n_options && option_size < offsetof(k3rt_option, help))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: option entries of %u bytes are too small",
                         what, option_size);
    const char *names[256];
    uint32_t n = n_options < 256 ? n_options : 256;
    for (uint32_t i = 0; i < n; i++)
        names[i] = option_at(options, option_size, i)->name;

    const char *key;
    json_t *v;
    json_object_foreach(cfg, key, v) {
        const k3rt_option *o = NULL;
        for (uint32_t i = 0; i < n && !o; i++)
            if (!strcmp(names[i], key))
                o = option_at(options, option_size, i);
        if (!o) {
            const char *near = nearest_word(key, names, (int)n);
            if (near)
                return k3rt_fail(err, K3RT_ERR_INVALID,
                                 "%s: unknown key '%s'; did you mean '%s'?", what, key, near);
            char list[512] = "";
            size_t at = 0;
            for (uint32_t i = 0; i < n && at < sizeof list; i++)
                at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "",
                                       names[i]);
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: unknown key '%s' (valid keys: %s)",
                             what, key, n ? list : "none");
        }
        K3RT_TRY(check_value(o, cfg, v, what, err));
    }
    for (uint32_t i = 0; i < n; i++) {
        const k3rt_option *o = option_at(options, option_size, i);
        if (json_object_get(cfg, o->name))
            continue;
        if (!o->default_json) {
            const char *help = option_help(o, option_size);
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: missing required key '%s' (%s)", what,
                             o->name, help ? help : type_name(o->type));
        }
        json_error_t je;
        json_t *def = json_loads(o->default_json, JSON_DECODE_ANY, &je);
        if (!def)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: option '%s' has a bad default '%s'",
                             what, o->name, o->default_json);
        json_object_set_new(cfg, o->name, def);
        K3RT_TRY(check_value(o, cfg, json_object_get(cfg, o->name), what, err));
    }
    return K3RT_OK;
}
