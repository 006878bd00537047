/* Checking what a manifest names (ckpt_manifest.h). */
#include "train/ckpt_manifest.h"

#include <stdio.h>
#include <string.h>

#include "recipe/doc_check.h"

/* Checks spec (kind balancer) and puts its completed form under key of holder. */
static int check_balancer(json_t *holder, const char *key, registry *reg, const char *what,
                          k3rt_error *err)
{
    json_t *done;
    K3RT_TRY(doc_check_spec(json_object_get(holder, key), K3RT_KIND_BALANCER, reg, what, &done,
                            err));
    json_object_set_new(holder, key, done);
    return K3RT_OK;
}

/* One record of "changes": {step, source, balancer}, steps in [1, last + 1] and in order. */
static int check_change(json_t *c, size_t i, json_int_t *prev, json_int_t last, registry *reg,
                        k3rt_error *err)
{
    char what[64];
    snprintf(what, sizeof what, "changes[%zu]", i + 1);
    const json_t *step = json_object_get(c, "step");
    const char *source = json_string_value(json_object_get(c, "source"));
    if (!json_is_object(c) || json_object_size(c) != 3 || !json_is_integer(step) || !source)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: expected {step, source, balancer}", what);
    json_int_t s = json_integer_value(step);
    if (s < 1 || s > last + 1 || s < *prev)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: step %lld; expected %lld to %lld (changes "
                         "in step order, none after the checkpoint's step + 1)", what,
                         (long long)s, (long long)(*prev > 1 ? *prev : 1),
                         (long long)(last + 1));
    if (strcmp(source, "recipe") && strcmp(source, "on_step"))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: source \"%s\"; expected \"recipe\" or "
                         "\"on_step\"", what, source);
    *prev = s;
    char bwhat[80];
    snprintf(bwhat, sizeof bwhat, "%s.balancer", what);
    return check_balancer(c, "balancer", reg, bwhat, err);
}

static int check_all(json_t *m, registry *reg, k3rt_error *err)
{
    json_t *config;
    K3RT_TRY(doc_check_config(json_object_get(m, "config"), reg, &config, err));
    json_object_set_new(m, "config", config);
    K3RT_TRY(check_balancer(m, "balancer", reg, "balancer", err));
    json_t *changes = json_object_get(m, "changes");
    if (!json_is_array(changes))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "changes: expected a list of mid-run changes");
    json_int_t prev = 1, last = json_integer_value(json_object_get(m, "step"));
    size_t i;
    json_t *c;
    json_array_foreach(changes, i, c)
        K3RT_TRY(check_change(c, i, &prev, last, reg, err));
    size_t n = json_array_size(changes);
    const json_t *want = n ? json_object_get(json_array_get(changes, n - 1), "balancer")
                           : json_object_get(json_object_get(config, "model"), "balancer");
    if (!json_equal(json_object_get(m, "balancer"), want))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "balancer: is not the one in effect (%s)",
                         n ? "the last of \"changes\"" : "config.model.balancer");
    return K3RT_OK;
}

int ckpt_check_manifest(json_t *m, registry *reg, const char *dir, k3rt_error *err)
{
    int rc = check_all(m, reg, err);
    if (rc)
        k3rt_error_prefix(err, "%s/manifest.json: ", dir);
    return rc;
}
