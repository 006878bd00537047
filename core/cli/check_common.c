/* check-plugin: the checks every kind gets — descriptor sanity, configuration errors, FLOPs. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check.h"

static const k3rt_option *option_at(const plugin_entry *e, uint32_t i)
{
    return (const k3rt_option *)((const char *)e->desc.options + (size_t)i * e->desc.option_size);
}

static int one_line(const char *s)
{
    return s && *s && !strchr(s, '\n');
}

static int valid_key(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

/* One option on its own: name, type, flags, range, choices and a default that passes them. */
static const char *option_problem(const plugin_entry *e, uint32_t i, char *buf, size_t len)
{
    const k3rt_option *o = option_at(e, i);
    if (!valid_key(o->name))
        return "an option name is not [a-z0-9_]+";
    for (uint32_t j = 0; j < i; j++)
        if (!strcmp(option_at(e, j)->name, o->name)) {
            snprintf(buf, len, "option '%s' is declared twice", o->name);
            return buf;
        }
    if (o->type < K3RT_OPT_INT || o->type > K3RT_OPT_STRING || (o->flags & ~K3RT_OPT_NULLABLE)) {
        snprintf(buf, len, "option '%s' has an unknown type or flag", o->name);
        return buf;
    }
    if (o->choices && o->type != K3RT_OPT_STRING) {
        snprintf(buf, len, "option '%s' has choices but is not a string", o->name);
        return buf;
    }
    if (!o->default_json)
        return NULL;  /* required: the recipe must give it */
    json_t *cfg = json_object();
    k3rt_error err = {0};
    int rc = options_apply(o, 1, e->desc.option_size, cfg, "default", &err);
    json_decref(cfg);
    if (rc) {
        snprintf(buf, len, "option '%s': its own default %s fails validation: %s", o->name,
                 o->default_json, err.msg);
        return buf;
    }
    return NULL;
}

void ck_descriptor(check_ctx *c)
{
    const plugin_entry *e = c->e;
    const k3rt_plugin_descriptor *d = &e->desc;
    char buf[512];
    const char *why = NULL;
    if (!one_line(d->version))
        why = "version is missing or not one line";
    else if (!one_line(d->description))
        why = "description is missing or not one line";
    for (uint32_t i = 0; i < d->n_options && !why; i++)
        why = option_problem(e, i, buf, sizeof buf);
    /* The loader copied at most the host's sizes; a same-minor plugin with larger structs was
     * built against a different header than its version claims. */
    uint32_t sizes[3] = {d->struct_size, e->inst.struct_size, 0};
    memcpy(&sizes[2], d->vtable, sizeof sizes[2]);
    size_t host[3] = {sizeof(k3rt_plugin_descriptor), sizeof(k3rt_instance_vtable), 0};
    switch (d->kind) {
    case K3RT_KIND_ATTENTION: host[2] = sizeof(k3rt_attention_vtable); break;
    case K3RT_KIND_MOE: host[2] = sizeof(k3rt_moe_vtable); break;
    case K3RT_KIND_BALANCER: host[2] = sizeof(k3rt_balancer_vtable); break;
    case K3RT_KIND_OPTIMIZER: host[2] = sizeof(k3rt_optimizer_vtable); break;
    default: host[2] = sizeof(k3rt_residual_vtable); break;
    }
    if (!why && d->abi_minor == K3RT_ABI_MINOR)
        for (int i = 0; i < 3; i++)
            if (sizes[i] > host[i])
                why = "a struct_size exceeds this SDK's struct of the same ABI minor";
    if (!why && d->n_options && d->option_size > sizeof(k3rt_option) &&
        d->abi_minor == K3RT_ABI_MINOR)
        why = "option_size exceeds this SDK's k3rt_option of the same ABI minor";
    if (why) {
        ck_report(c, CK_FAIL, "descriptor", "%s", why);
        return;
    }
    ck_report(c, CK_PASS, "descriptor",
              "%s %s (%s), %u option%s; struct sizes %u/%u/%u bytes (host %zu/%zu/%zu)%s",
              d->name, d->version, k3rt_kind_name(d->kind), d->n_options,
              d->n_options == 1 ? "" : "s", sizes[0], sizes[1], sizes[2], host[0], host[1],
              host[2], sizes[1] < host[1] || sizes[2] < host[2] ? ": an older minor, missing "
                                                                  "fields read as NULL" : "");
}

/* ---- configuration ------------------------------------------------------------------------- */

/* Applies config + {key: value} and expects a refusal whose message names `key`. Returns NULL
 * on success, else what went wrong. */
static const char *expect_refusal(const check_ctx *c, const char *key, json_t *value,
                                  const char *needle, char *buf, size_t len)
{
    json_t *cfg = c->config ? json_deep_copy(c->config) : json_object();
    json_object_set_new(cfg, key, value);
    k3rt_error err = {0};
    int rc = options_apply(c->e->desc.options, c->e->desc.n_options, c->e->desc.option_size,
                                cfg, "check", &err);
    json_decref(cfg);
    if (rc == K3RT_OK)
        snprintf(buf, len, "key '%s' with a bad value was accepted", key);
    else if (!strstr(err.msg, needle))
        snprintf(buf, len, "the refusal of key '%s' does not say '%s': %s", key, needle,
                 err.msg);
    else
        return NULL;
    return buf;
}

/* A value of the wrong type, one outside the range and one outside the choices. */
static const char *option_refusals(const check_ctx *c, const k3rt_option *o, int *n, char *buf,
                                   size_t len)
{
    const char *why;
    json_t *wrong = o->type == K3RT_OPT_STRING ? json_integer(1) : json_string("x");
    if ((why = expect_refusal(c, o->name, wrong, o->name, buf, len)))
        return why;
    (*n)++;
    if ((o->type == K3RT_OPT_INT || o->type == K3RT_OPT_FLOAT) && o->min <= o->max) {
        double out = o->max + fmax(1.0, fabs(o->max));
        if (fabs(out) < 9e15) {
            json_t *v = o->type == K3RT_OPT_INT ? json_integer((json_int_t)out) : json_real(out);
            if ((why = expect_refusal(c, o->name, v, o->name, buf, len)))
                return why;
            (*n)++;
        }
    }
    if (o->type == K3RT_OPT_STRING && o->choices) {
        if ((why = expect_refusal(c, o->name, json_string("k3rt-not-a-choice"), o->name, buf,
                                  len)))
            return why;
        (*n)++;
    }
    return NULL;
}

void ck_config(check_ctx *c)
{
    const plugin_entry *e = c->e;
    char buf[1200], what[1400];
    json_t *cfg = c->config ? json_deep_copy(c->config) : json_object();
    k3rt_error err = {0};
    if (options_apply(e->desc.options, e->desc.n_options, e->desc.option_size, cfg, "config",
                           &err)) {
        json_decref(cfg);
        ck_report(c, CK_FAIL, "config", "the configuration is refused: %s", err.msg);
        return;
    }
    json_decref(cfg);
    const char *why = expect_refusal(c, "k3rt_no_such_key", json_integer(1), "k3rt_no_such_key",
                                     buf, sizeof buf);
    if (!why && e->desc.n_options) {
        /* a near miss of a real key is answered with that key */
        char typo[80], hint[100];
        const char *name = option_at(e, 0)->name;
        snprintf(typo, sizeof typo, "%sx", name);
        snprintf(hint, sizeof hint, "did you mean '%s'", name);
        if (strlen(name) >= 3)
            why = expect_refusal(c, typo, json_integer(1), hint, buf, sizeof buf);
    }
    int refused = 0;
    for (uint32_t i = 0; i < e->desc.n_options && !why; i++)
        why = option_refusals(c, option_at(e, i), &refused, buf, sizeof buf);
    if (why) {
        ck_report(c, CK_FAIL, "config", "%s", why);
        return;
    }
    if (e->desc.n_options)
        snprintf(what, sizeof what, "valid with defaults filled; an unknown key, a misspelt key "
                 "and %d bad values (wrong type, out of range, not a choice) refused naming the "
                 "key", refused);
    else
        snprintf(what, sizeof what, "no options: any key is refused, naming it");
    ck_report(c, CK_PASS, "config", "%s", what);
}

/* ---- FLOPs --------------------------------------------------------------------------------- */

void ck_flops(check_ctx *c)
{
    if (!c->e->inst.flops) {
        ck_report(c, CK_FAIL, "flops", "no flops(): every attention, moe and residual plugin "
                  "reports its FLOPs (MFU and the plan depend on them)");
        return;
    }
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes)) {
        ck_report(c, CK_SKIP, "flops", "no CPU implementation to create an instance on");
        return;
    }
    rig m;
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    k3rt_error err = {0};
    if (ck_create(c, &m, &a, dtypes[0], K3RT_DEVICE_CPU, NULL, &err)) {
        ck_error(c, "flops", &err);
        return;
    }
    k3rt_flops f1, f2, f3;
    int rc = rig_flops(&m, c->B, c->T, &f1, &err);
    if (!rc)
        rc = rig_flops(&m, 2 * c->B, c->T, &f2, &err);
    if (!rc)
        rc = rig_flops(&m, c->B, 2 * c->T, &f3, &err);
    rig_destroy(&m);
    if (rc) {
        ck_error(c, "flops", &err);
        return;
    }
    const char *why = NULL;
    if (!(f1.forward > 0) || !(f1.backward > 0) || !isfinite(f1.forward) ||
        !isfinite(f1.backward))
        why = "forward and backward FLOPs must be finite and > 0";
    else if (fabs(f2.forward - 2 * f1.forward) > 1e-6 * f2.forward ||
             fabs(f2.backward - 2 * f1.backward) > 1e-6 * f2.backward)
        why = "FLOPs are not proportional to the batch (sequences are independent)";
    else if (f3.forward < f1.forward || f3.backward < f1.backward)
        why = "FLOPs fall when the sequence grows";
    if (why) {
        ck_report(c, CK_FAIL, "flops", "%s: B=%lld T=%lld gives %.4g/%.4g, 2B %.4g/%.4g, 2T "
                  "%.4g/%.4g (forward/backward)", why, (long long)c->B, (long long)c->T,
                  f1.forward, f1.backward, f2.forward, f2.backward, f3.forward, f3.backward);
        return;
    }
    ck_report(c, CK_PASS, "flops", "forward %.4g, backward %.4g at B=%lld T=%lld; "
              "proportional to B, non-decreasing in T", f1.forward, f1.backward,
              (long long)c->B, (long long)c->T);
}
