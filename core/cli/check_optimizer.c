/* check-plugin: optimizer plugins on a synthetic model of one parameter per role — a step
 * along g = p descends on every parameter, determinism (and names do not matter: the rule
 * comes from the role), state() round trips, describe() and CPU vs CUDA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check.h"
#include "comm/comm_impl.h"

typedef struct opt_spec {
    const char *name;
    int role, ndim;
    int64_t shape[3];
    int heads, head_axis, experts;
} opt_spec;

static const opt_spec specs[] = {
    {"layers.0.mixer.q_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {8, 6, 0}, 2, 0, 0},
    {"layers.0.mixer.o_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, {6, 8, 0}, 2, 1, 0},
    {"layers.0.mixer.conv1d.weight", K3RT_ROLE_CONV, 2, {6, 4, 0}, 0, 0, 0},
    {"layers.0.mixer.dt_bias", K3RT_ROLE_VECTOR, 1, {4, 0, 0}, 0, 0, 0},
    {"layers.0.ffn.up_proj.weight", K3RT_ROLE_MATRIX, 2, {12, 6, 0}, 0, 0, 0},
    {"layers.0.ffn.router.weight", K3RT_ROLE_ROUTER, 2, {3, 6, 0}, 0, 0, 3},
    {"layers.0.ffn.experts.weight", K3RT_ROLE_EXPERT_MATRIX, 3, {3, 4, 6}, 0, 0, 3},
    {"embed.weight", K3RT_ROLE_EMBEDDING, 2, {16, 6, 0}, 0, 0, 0},
    {"norm.weight", K3RT_ROLE_NORM_GAIN, 1, {6, 0, 0}, 0, 0, 0},
    {"head.weight", K3RT_ROLE_OUTPUT_HEAD, 2, {16, 6, 0}, 0, 0, 0},
};
enum { NP = sizeof specs / sizeof specs[0] };

typedef struct opt_run {
    check_ctx *c;
    int dtype, device, created, own_stream;
    k3rt_stream *s;
    k3rt_comm **world;
    rig m;
    k3rt_param_decl decls[NP];
    k3rt_param_ref refs[NP];
    char names[NP][64];
    void *host[NP], *grad_host[NP];  /* host mirrors of the device params and grads */
    int64_t numel[NP];
    k3rt_rng rng;                    /* gradients */
} opt_run;

static void opt_close(opt_run *r)
{
    if (r->created)
        rig_destroy(&r->m);
    for (int i = 0; i < NP; i++) {
        free(r->host[i]);
        free(r->grad_host[i]);
        if (r->device != K3RT_DEVICE_CPU) {
            if (r->refs[i].param.data)
                k3rt_free(r->device, r->refs[i].param.data);
            if (r->refs[i].grad.data)
                k3rt_free(r->device, r->refs[i].grad.data);
        }
    }
    if (r->world)
        comm_local_destroy(r->world, 1);
    if (r->own_stream)
        k3rt_stream_destroy(r->s);
    memset(r, 0, sizeof *r);
}

static size_t opt_bytes(const opt_run *r, int i)
{
    return (size_t)r->numel[i] * k3rt_dtype_size(r->dtype);
}

static int opt_upload(opt_run *r, k3rt_error *err)
{
    for (int i = 0; i < NP; i++) {
        K3RT_TRY(ck_copy(r->s, r->refs[i].param.data, r->device, r->host[i], K3RT_DEVICE_CPU,
                         opt_bytes(r, i), err));
        K3RT_TRY(ck_copy(r->s, r->refs[i].grad.data, r->device, r->grad_host[i],
                         K3RT_DEVICE_CPU, opt_bytes(r, i), err));
    }
    return K3RT_OK;
}

/* renamed: parameters called p0, p1, ... instead of model names (the rule must not change). */
static int opt_open(check_ctx *c, int dtype, int device, int renamed, opt_run *r,
                    k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->c = c, r->dtype = dtype, r->device = device;
    r->s = c->cpu;
    if (device != K3RT_DEVICE_CPU) {
        K3RT_TRY(k3rt_stream_create(device, K3RT_STREAM_COMPUTE, &r->s, err));
        r->own_stream = 1;
    }
    K3RT_TRY(comm_local_create(1, &r->world, err));
    k3rt_rng init;
    k3rt_rng_seed(&init, c->seed, 0x0971ull);
    k3rt_rng_seed(&r->rng, c->seed, 0x0972ull);
    for (int i = 0; i < NP; i++) {
        const opt_spec *sp = &specs[i];
        k3rt_param_decl *d = &r->decls[i];
        memset(d, 0, sizeof *d);
        d->struct_size = sizeof *d;
        d->role = sp->role;
        if (renamed)
            snprintf(r->names[i], sizeof r->names[i], "p%d", i);
        else
            snprintf(r->names[i], sizeof r->names[i], "%s", sp->name);
        d->name = r->names[i];
        d->ndim = sp->ndim;
        memcpy(d->shape, sp->shape, sizeof sp->shape);
        d->heads = sp->heads, d->head_axis = sp->head_axis, d->experts = sp->experts;
        d->init = K3RT_INIT_NORMAL, d->init_a = 0.5, d->layer = -1;
        k3rt_tensor t = k3rt_tensor_view(NULL, dtype, device, d->ndim, d->shape[0], d->shape[1],
                                         d->shape[2], 0);
        r->numel[i] = k3rt_tensor_numel(&t);
        r->host[i] = ck_alloc(dtype, r->numel[i]);
        r->grad_host[i] = ck_alloc(dtype, r->numel[i]);
        if (!r->host[i] || !r->grad_host[i])
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        ck_randn(r->host[i], dtype, r->numel[i], 0.5, &init);
        k3rt_param_ref *p = &r->refs[i];
        p->struct_size = sizeof *p;
        p->index = i;
        p->name = r->names[i];
        p->decl = d;
        p->param = p->grad = t;
        if (device == K3RT_DEVICE_CPU) {
            p->param.data = r->host[i];
            p->grad.data = r->grad_host[i];
        } else {
            p->param.data = k3rt_alloc(device, opt_bytes(r, i), err);
            p->grad.data = p->param.data ? k3rt_alloc(device, opt_bytes(r, i), err) : NULL;
            if (!p->grad.data)
                return err->code;
        }
    }
    K3RT_TRY(opt_upload(r, err));
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.params = r->refs;
    a.n_params = NP;
    a.comm = r->world[0];
    K3RT_TRY(ck_create(c, &r->m, &a, dtype, device, r->s, err));
    r->created = 1;
    return K3RT_OK;
}

/* descent: g = p; otherwise fresh random gradients. Then one step; params back on the host. */
static int opt_step(opt_run *r, int64_t step, int descent, k3rt_error *err)
{
    for (int i = 0; i < NP; i++) {
        if (descent)
            memcpy(r->grad_host[i], r->host[i], opt_bytes(r, i));
        else
            ck_randn(r->grad_host[i], r->dtype, r->numel[i], 1.0, &r->rng);
    }
    K3RT_TRY(opt_upload(r, err));
    K3RT_TRY(rig_step(&r->m, r->world[0], 1e-3, step, r->refs, NP, err));
    K3RT_TRY(k3rt_stream_sync(r->s, err));
    for (int i = 0; i < NP; i++)
        K3RT_TRY(ck_copy(r->s, r->host[i], K3RT_DEVICE_CPU, r->refs[i].param.data, r->device,
                         opt_bytes(r, i), err));
    for (int i = 0; i < NP; i++)
        if (!ck_finite(r->host[i], r->dtype, r->numel[i]))
            return k3rt_fail(err, K3RT_ERR_NUMERIC, "parameter %s is not finite after step "
                             "%lld", r->names[i], (long long)step);
    return K3RT_OK;
}

static double norm2(const void *x, int dtype, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += ck_get(x, dtype, i) * ck_get(x, dtype, i);
    return s;
}

/* 0 when every parameter of a and b is equal bit for bit; else 1 and the first in `where`. */
static int params_differ(const opt_run *a, const opt_run *b, char *where, size_t len)
{
    for (int i = 0; i < NP; i++)
        if (memcmp(a->host[i], b->host[i], opt_bytes(a, i))) {
            snprintf(where, len, "%s (role %s)", specs[i].name, k3rt_role_name(specs[i].role));
            return 1;
        }
    return 0;
}

/* ---- checks ------------------------------------------------------------------------------- */

static void check_step(check_ctx *c)
{
    int dtypes[2], nd = ck_cpu_dtypes(c, dtypes);
    const char *why = NULL;
    char buf[512];
    k3rt_error err = {0};
    for (int k = 0; k < nd && !why; k++) {
        opt_run r = {0};
        double before[NP];
        int rc = opt_open(c, dtypes[k], K3RT_DEVICE_CPU, 0, &r, &err);
        for (int i = 0; i < NP && !rc; i++)
            before[i] = norm2(r.host[i], r.dtype, r.numel[i]);
        if (!rc)
            rc = opt_step(&r, 1, 1, &err);
        if (rc) {
            snprintf(buf, sizeof buf, "%s", err.msg);
            why = buf;
        }
        for (int i = 0; i < NP && !why; i++) {
            double after = norm2(r.host[i], r.dtype, r.numel[i]);
            if (!(after < before[i])) {
                snprintf(buf, sizeof buf, "%s: a step along g = p (lr 1e-3) did not shrink %s "
                         "(role %s): |p|^2 %.9g -> %.9g", k3rt_dtype_name(dtypes[k]),
                         specs[i].name, k3rt_role_name(specs[i].role), before[i], after);
                why = buf;
            }
        }
        opt_close(&r);
    }
    if (!nd)
        ck_report(c, CK_SKIP, "step", "no CPU implementation");
    else if (why)
        ck_report(c, CK_FAIL, "step", "%s", why);
    else
        ck_report(c, CK_PASS, "step", "%d parameters of %d roles: one step along g = p "
                  "(gradient of |p|^2 / 2) shrinks every one and keeps it finite (%s%s)", NP,
                  NP - 2, k3rt_dtype_name(dtypes[0]), nd > 1 ? ", f32" : "");
}

static void check_determinism(check_ctx *c)
{
    int dtypes[2];
    if (!ck_cpu_dtypes(c, dtypes))
        return;
    opt_run a = {0}, b = {0}, n = {0};
    k3rt_error err = {0};
    char where[256];
    int rc = opt_open(c, dtypes[ck_cpu_dtypes(c, dtypes) - 1], K3RT_DEVICE_CPU, 0, &a, &err);
    if (!rc)
        rc = opt_open(c, a.dtype, K3RT_DEVICE_CPU, 0, &b, &err);
    if (!rc)
        rc = opt_open(c, a.dtype, K3RT_DEVICE_CPU, 1, &n, &err);
    int differ = 0, renamed = 0;
    for (int64_t step = 1; step <= 3 && !rc && !differ && !renamed; step++) {
        rc = opt_step(&a, step, 0, &err);
        if (!rc)
            rc = opt_step(&b, step, 0, &err);
        if (!rc)
            rc = opt_step(&n, step, 0, &err);
        if (!rc)
            differ = params_differ(&a, &b, where, sizeof where);
        if (!rc && !differ)
            renamed = params_differ(&a, &n, where, sizeof where);
    }
    if (rc)
        ck_error(c, "determinism", &err);
    else if (differ)
        ck_report(c, (c->e->desc.caps & K3RT_CAP_DETERMINISTIC) ? CK_FAIL : CK_SKIP,
                  "determinism", "two instances given the same gradients differ at %s", where);
    else if (renamed)
        ck_report(c, CK_FAIL, "determinism", "renaming the parameters (same roles and shapes) "
                  "changes the update of %s: the rule must come from the role, never the name",
                  where);
    else
        ck_report(c, CK_PASS, "determinism", "%s, 3 steps of random gradients: two instances "
                  "bitwise equal, and equal again with every parameter renamed",
                  k3rt_dtype_name(a.dtype));
    opt_close(&a), opt_close(&b), opt_close(&n);
}

/* A fresh instance over the same parameters, loaded with the state after step 2, takes the
 * same step 3. */
static void check_state(check_ctx *c)
{
    int dtypes[2], nd = ck_cpu_dtypes(c, dtypes);
    if (!nd)
        return;
    opt_run a = {0}, b = {0};
    k3rt_error err = {0};
    char where[256];
    int n = 0;
    int rc = opt_open(c, dtypes[nd - 1], K3RT_DEVICE_CPU, 0, &a, &err);
    for (int64_t step = 1; step <= 2 && !rc; step++)
        rc = opt_step(&a, step, 0, &err);
    if (!rc)
        rc = opt_open(c, a.dtype, K3RT_DEVICE_CPU, 0, &b, &err);
    for (int i = 0; i < NP && !rc; i++)
        memcpy(b.host[i], a.host[i], opt_bytes(&a, i));
    if (!rc && c->e->inst.state)
        rc = ck_state_copy(&a.m, &b.m, a.s, &n, &err);
    b.rng = a.rng;
    if (!rc)
        rc = opt_step(&a, 3, 0, &err);
    if (!rc)
        rc = opt_step(&b, 3, 0, &err);
    int differ = !rc && params_differ(&a, &b, where, sizeof where);
    if (rc)
        ck_error(c, "state()", &err);
    else if (differ && !c->e->inst.state)
        ck_report(c, CK_FAIL, "state()", "step 3 depends on earlier steps (at %s) but there is "
                  "no state(): a checkpoint would lose it", where);
    else if (differ)
        ck_report(c, CK_FAIL, "state()", "a fresh instance loaded with the %d state tensors "
                  "after step 2 takes a different step 3 (at %s): state() misses something",
                  n, where);
    else
        ck_report(c, CK_PASS, "state()", c->e->inst.state
                  ? "%d tensors saved after step 2 and loaded into a fresh instance: step 3 "
                    "identical bit for bit" : "%d tensors: stateless, and step 3 does not "
                    "depend on the steps before", n);
    opt_close(&a), opt_close(&b);
}

static void check_describe(check_ctx *c)
{
    int dtypes[2], nd = ck_cpu_dtypes(c, dtypes);
    if (!c->e->vt.optimizer.describe || !nd)
        return;
    opt_run r = {0};
    k3rt_error err = {0};
    char first[128] = "", bad[160] = "";
    if (opt_open(c, dtypes[nd - 1], K3RT_DEVICE_CPU, 0, &r, &err)) {
        ck_error(c, "describe", &err);
        opt_close(&r);
        return;
    }
    for (int i = 0; i < NP && !bad[0]; i++) {
        char buf[128];
        memset(buf, 0, sizeof buf);
        int rc = rig_describe(&r.m, i, buf, sizeof buf);
        buf[sizeof buf - 1] = '\0';
        if (rc || !buf[0] || strchr(buf, '\n'))
            snprintf(bad, sizeof bad, "describe(%d) (%s) gave no one-line description", i,
                     specs[i].name);
        else if (i == 0)
            snprintf(first, sizeof first, "%s", buf);
    }
    if (bad[0])
        ck_report(c, CK_FAIL, "describe", "%s", bad);
    else
        ck_report(c, CK_PASS, "describe", "one line for each of the %d parameters (%s: \"%s\")",
                  NP, k3rt_role_name(specs[0].role), first);
    opt_close(&r);
}

static void check_cuda(check_ctx *c)
{
    if (!ck_cuda_ready(c, "cuda"))
        return;
    opt_run h = {0}, g = {0};
    k3rt_error err = {0};
    int rc = opt_open(c, K3RT_F32, K3RT_DEVICE_CPU, 0, &h, &err);
    if (!rc)
        rc = opt_open(c, K3RT_F32, 0, 0, &g, &err);
    double worst = 0;
    const char *at = specs[0].name;
    for (int64_t step = 1; step <= 3 && !rc; step++) {
        rc = opt_step(&h, step, 0, &err);
        if (!rc)
            rc = opt_step(&g, step, 0, &err);
        for (int i = 0; i < NP && !rc; i++) {
            double e = ck_rel_rms(h.host[i], g.host[i], K3RT_F32, h.numel[i]);
            if (e > worst) {
                worst = e;
                at = specs[i].name;
            }
        }
    }
    if (rc)
        ck_error(c, "cuda", &err);
    else
        ck_report(c, worst <= c->cuda_tol ? CK_PASS : CK_FAIL, "cuda", "3 steps on CUDA device "
                  "0 against the CPU: worst relative rms %.2e (%s; tolerance %.0e)", worst, at,
                  c->cuda_tol);
    opt_close(&h), opt_close(&g);
}

void ck_optimizer(check_ctx *c)
{
    check_step(c);
    check_determinism(c);
    check_state(c);
    check_describe(c);
    check_cuda(c);
}
