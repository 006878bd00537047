/* Checking what a manifest names (ckpt_manifest.h). */
#include "train/ckpt_manifest.h"

#include <stdio.h>
#include <string.h>

#include "recipe/doc_check.h"

/* One record of "changes": {step, source, balancer}, steps in [1, last + 1] and in order. */
static int check_change(const json_t *c, size_t i, json_int_t *prev, json_int_t last,
                        registry *reg, k3rt_error *err)
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
    return doc_check_spec(json_object_get(c, "balancer"), K3RT_KIND_BALANCER, reg, bwhat, err);
}

static int check_all(const json_t *m, registry *reg, k3rt_error *err)
{
    const json_t *config = json_object_get(m, "config");
    K3RT_TRY(doc_check_config(config, reg, err));
    const json_t *bal = json_object_get(m, "balancer");
    K3RT_TRY(doc_check_spec(bal, K3RT_KIND_BALANCER, reg, "balancer", err));
    const json_t *changes = json_object_get(m, "changes");
    if (!json_is_array(changes))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "changes: expected a list of mid-run changes");
    json_int_t prev = 1, last = json_integer_value(json_object_get(m, "step"));
    size_t i;
    const json_t *c;
    json_array_foreach(changes, i, c)
        K3RT_TRY(check_change(c, i, &prev, last, reg, err));
    const json_t *want = json_array_size(changes)
                             ? json_object_get(json_array_get(changes, json_array_size(changes) - 1),
                                               "balancer")
                             : json_object_get(json_object_get(config, "model"), "balancer");
    if (!json_equal(bal, want))
        return k3rt_fail(err, K3RT_ERR_FORMAT, "balancer: is not the one in effect (%s)",
                         json_array_size(changes) ? "the last of \"changes\""
                                                  : "config.model.balancer");
    return K3RT_OK;
}

int ckpt_check_manifest(const json_t *m, registry *reg, const char *dir, k3rt_error *err)
{
    int rc = check_all(m, reg, err);
    if (rc)
        k3rt_error_prefix(err, "%s/manifest.json: ", dir);
    return rc;
}
