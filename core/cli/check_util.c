/* check-plugin: reporting, instance creation and host/device buffers (check.h). */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/check.h"

void ck_report(check_ctx *c, int status, const char *name, const char *fmt, ...)
{
    static const char *word[3] = {"PASS", "FAIL", "SKIP"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("  %s  %-14s %s\n", word[status], name, msg);
    fflush(stdout);
    if (status == CK_PASS)
        c->passed++;
    else if (status == CK_FAIL)
        c->failed++;
    else
        c->skipped++;
}

int ck_error(check_ctx *c, const char *name, const k3rt_error *err)
{
    ck_report(c, CK_FAIL, name, "%s", err->msg[0] ? err->msg : "failed without a message");
    return 1;
}

int ck_create(check_ctx *c, rig *m, k3rt_create_args *a, int dtype, int device,
              k3rt_stream *s, k3rt_error *err)
{
    int kind = c->e->desc.kind;
    a->struct_size = sizeof *a;
    a->dtype = dtype;
    a->device = device;
    a->d_model = c->d;
    a->vocab = c->vocab;
    a->n_layers = c->layers;
    a->layer = kind == K3RT_KIND_RESIDUAL || kind == K3RT_KIND_OPTIMIZER ? -1 : 0;
    if (kind == K3RT_KIND_BALANCER) {
        a->n_experts = c->experts;
        a->top_k = c->top_k;
    }
    a->deterministic = 1;
    a->stream = s ? s : c->cpu;
    a->seed = c->seed;
    return rig_create(m, c->e, c->config, a, "check", err);
}

int ck_cpu_dtypes(const check_ctx *c, int dtypes[2])
{
    int n = 0;
    if (c->e->desc.caps & K3RT_CAP_F64)
        dtypes[n++] = K3RT_F64;
    if (c->e->desc.caps & K3RT_CAP_CPU)
        dtypes[n++] = K3RT_F32;
    return n;
}

int ck_cuda_ready(check_ctx *c, const char *name)
{
    if (!(c->e->desc.caps & K3RT_CAP_CUDA)) {
        ck_report(c, CK_SKIP, name, "no CUDA implementation declared (K3RT_CAP_CUDA)");
        return 0;
    }
    if (!(c->e->desc.caps & K3RT_CAP_CPU)) {
        ck_report(c, CK_SKIP, name, "no CPU implementation to compare with");
        return 0;
    }
    if (k3rt_cuda_device_count() < 1) {
        ck_report(c, CK_SKIP, name, "no usable CUDA device in this build or machine");
        return 0;
    }
    return 1;
}

void *ck_alloc(int dtype, int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), k3rt_dtype_size(dtype) ? k3rt_dtype_size(dtype) : 1);
}

static void ck_set(void *x, int dtype, int64_t i, double v)
{
    if (dtype == K3RT_F64)
        ((double *)x)[i] = v;
    else if (dtype == K3RT_F32)
        ((float *)x)[i] = (float)v;
}

double ck_get(const void *x, int dtype, int64_t i)
{
    switch (dtype) {
    case K3RT_F64: return ((const double *)x)[i];
    case K3RT_F32: return ((const float *)x)[i];
    case K3RT_I32: return ((const int32_t *)x)[i];
    case K3RT_I64: return (double)((const int64_t *)x)[i];
    default: return NAN;
    }
}

void ck_randn(void *x, int dtype, int64_t n, double scale, k3rt_rng *rng)
{
    for (int64_t i = 0; i < n; i++)
        ck_set(x, dtype, i, scale * k3rt_rng_normal(rng));
}

double ck_rel_rms(const void *a, const void *b, int dtype, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = ck_get(a, dtype, i), y = ck_get(b, dtype, i);
        num += (x - y) * (x - y);
        den += x * x;
    }
    if (!(den > 0))
        return num > 0 ? INFINITY : 0.0;
    return sqrt(num / den);
}

int ck_finite(const void *x, int dtype, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(ck_get(x, dtype, i)))
            return 0;
    return 1;
}

int ck_copy(k3rt_stream *s, void *dst, int dst_device, const void *src, int src_device,
            size_t bytes, k3rt_error *err)
{
    if (dst_device == K3RT_DEVICE_CPU && src_device == K3RT_DEVICE_CPU) {
        if (dst != src)
            memcpy(dst, src, bytes);
        return K3RT_OK;
    }
    K3RT_TRY(k3rt_memcpy(s, dst, dst_device, src, src_device, bytes, err));
    return k3rt_stream_sync(s, err);
}

/* ---- parameters ------------------------------------------------------------------------- */

void ck_params_free(ck_params *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->host[i].data);
        free(p->grad_host[i].data);
        if (p->device != K3RT_DEVICE_CPU && p->dev[i].data)
            k3rt_free(p->device, p->dev[i].data);
        if (p->device != K3RT_DEVICE_CPU && p->grad_dev[i].data)
            k3rt_free(p->device, p->grad_dev[i].data);
    }
    free(p->host), free(p->dev), free(p->grad_host), free(p->grad_dev);
    memset(p, 0, sizeof *p);
}

int ck_params_make(check_ctx *c, rig *m, ck_params *p, k3rt_error *err)
{
    memset(p, 0, sizeof *p);
    int dtype = m->dtype, gdtype = m->grad_dtype, device = m->device;
    p->dtype = dtype;
    p->grad_dtype = gdtype;
    p->device = device;
    int n = rig_n_params(m);
    p->host = calloc((size_t)n + 1, sizeof *p->host);
    p->dev = calloc((size_t)n + 1, sizeof *p->dev);
    p->grad_host = calloc((size_t)n + 1, sizeof *p->grad_host);
    p->grad_dev = calloc((size_t)n + 1, sizeof *p->grad_dev);
    if (!p->host || !p->dev || !p->grad_host || !p->grad_dev) {
        ck_params_free(p);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    k3rt_rng rng;
    k3rt_rng_seed(&rng, c->seed, 0x9a2a3ull);
    for (int i = 0; i < n; i++) {
        const k3rt_param_decl *d = rig_param(m, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, dtype, K3RT_DEVICE_CPU, d->ndim, d->shape[0],
                                         d->shape[1], d->shape[2], d->shape[3]);
        int64_t numel = k3rt_tensor_numel(&t);
        p->n = i + 1;  /* so that ck_params_free releases what this iteration allocates */
        p->host[i] = p->dev[i] = t;
        p->grad_host[i] = p->grad_dev[i] = t;
        p->grad_host[i].dtype = p->grad_dev[i].dtype = gdtype;
        p->host[i].data = ck_alloc(dtype, numel);
        p->grad_host[i].data = ck_alloc(gdtype, numel);
        if (device == K3RT_DEVICE_CPU) {
            p->dev[i].data = p->host[i].data;
            p->grad_dev[i].data = p->grad_host[i].data;
        } else {
            p->dev[i].device = p->grad_dev[i].device = device;
            p->dev[i].data = k3rt_alloc(device, k3rt_tensor_bytes(&t), err);
            p->grad_dev[i].data =
                p->dev[i].data ? k3rt_alloc(device, k3rt_tensor_bytes(&p->grad_dev[i]), err)
                               : NULL;
        }
        int rc = K3RT_OK;
        if (!p->host[i].data || !p->grad_host[i].data)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        else if (!p->dev[i].data || !p->grad_dev[i].data)
            rc = err->code ? err->code : K3RT_ERR_DEVICE;
        if (!rc)
            rc = rig_init_param(m, i, p->host[i], c->seed, d->name, err);
        if (rc) {
            ck_params_free(p);
            return rc;
        }
        if (d->init == K3RT_INIT_ZEROS || d->init == K3RT_INIT_ONES || d->init == K3RT_INIT_CONST)
            for (int64_t j = 0; j < numel; j++)
                ck_set(p->host[i].data, dtype, j,
                       ck_get(p->host[i].data, dtype, j) + 0.1 * k3rt_rng_normal(&rng));
    }
    return K3RT_OK;
}

int ck_params_upload(ck_params *p, k3rt_stream *s, k3rt_error *err)
{
    for (int i = 0; i < p->n; i++) {
        size_t gbytes = k3rt_tensor_bytes(&p->grad_host[i]);
        memset(p->grad_host[i].data, 0, gbytes);
        K3RT_TRY(ck_copy(s, p->dev[i].data, p->device, p->host[i].data, K3RT_DEVICE_CPU,
                         k3rt_tensor_bytes(&p->host[i]), err));
        K3RT_TRY(ck_copy(s, p->grad_dev[i].data, p->device, p->grad_host[i].data,
                         K3RT_DEVICE_CPU, gbytes, err));
    }
    return K3RT_OK;
}

int ck_params_download_grads(ck_params *p, k3rt_stream *s, k3rt_error *err)
{
    for (int i = 0; i < p->n; i++)
        K3RT_TRY(ck_copy(s, p->grad_host[i].data, K3RT_DEVICE_CPU, p->grad_dev[i].data,
                         p->device, k3rt_tensor_bytes(&p->grad_host[i]), err));
    return K3RT_OK;
}

/* ---- one instance ------------------------------------------------------------------------ */

int ck_module_open(check_ctx *c, int dtype, int device, ck_module *o, k3rt_error *err)
{
    memset(o, 0, sizeof *o);
    o->s = c->cpu;
    if (device != K3RT_DEVICE_CPU) {
        K3RT_TRY(k3rt_stream_create(device, K3RT_STREAM_COMPUTE, &o->s, err));
        o->own_stream = 1;
    }
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    K3RT_TRY(ck_create(c, &o->m, &a, dtype, device, o->s, err));
    o->created = 1;
    K3RT_TRY(ck_params_make(c, &o->m, &o->p, err));
    K3RT_TRY(ck_params_upload(&o->p, o->s, err));
    K3RT_TRY(rig_bind_params(&o->m, o->p.dev, o->p.grad_dev, err));
    return rig_alloc_shape(&o->m, c->B, c->T, 1, err);
}

int ck_fd_options(check_ctx *c, fd_options *o)
{
    if (!(c->e->desc.caps & K3RT_CAP_F64)) {
        ck_report(c, CK_SKIP, "gradients", "finite differences need the double-precision CPU "
                  "path (K3RT_CAP_F64)");
        return 0;
    }
    memset(o, 0, sizeof *o);
    o->batch = c->B, o->seq = c->T, o->d_model = c->d, o->vocab = c->vocab;
    o->n_layers = c->layers, o->seed = c->seed, o->samples = c->samples;
    o->eps = c->fd_eps, o->tol = c->tol, o->stencil = 4, o->threads = 1; /* many tiny calls */
    return 1;
}

void ck_module_close(ck_module *o)
{
    if (o->created)
        rig_destroy(&o->m);
    ck_params_free(&o->p);
    if (o->own_stream)
        k3rt_stream_destroy(o->s);
    memset(o, 0, sizeof *o);
}

/* ---- output blobs -------------------------------------------------------------------------- */

int ck_blobs_add(ck_blobs *o, const char *name, int dtype, int64_t n, const void *src,
                 int src_device, k3rt_stream *s, k3rt_error *err)
{
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        ck_blob *b = realloc(o->b, (size_t)cap * sizeof *b);
        if (!b)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        o->b = b;
        o->cap = cap;
    }
    ck_blob *b = &o->b[o->n];
    snprintf(b->name, sizeof b->name, "%s", name);
    b->dtype = dtype;
    b->n = n;
    b->data = ck_alloc(dtype, n);
    if (!b->data)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    o->n++;
    return ck_copy(s, b->data, K3RT_DEVICE_CPU, src, src_device,
                   (size_t)n * k3rt_dtype_size(dtype), err);
}

void ck_blobs_free(ck_blobs *o)
{
    for (int i = 0; i < o->n; i++)
        free(o->b[i].data);
    free(o->b);
    memset(o, 0, sizeof *o);
}

const ck_blob *ck_blobs_find(const ck_blobs *o, const char *name)
{
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->b[i].name, name))
            return &o->b[i];
    return NULL;
}

static int same_layout(const ck_blobs *a, const ck_blobs *b, char *where, size_t len)
{
    if (a->n != b->n) {
        snprintf(where, len, "%d outputs against %d", a->n, b->n);
        return 0;
    }
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->b[i].name, b->b[i].name) || a->b[i].n != b->b[i].n ||
            a->b[i].dtype != b->b[i].dtype) {
            snprintf(where, len, "output %s changed its shape or dtype", a->b[i].name);
            return 0;
        }
    return 1;
}

int ck_blobs_differ(const ck_blobs *a, const ck_blobs *b, char *where, size_t len)
{
    if (!same_layout(a, b, where, len))
        return 1;
    for (int i = 0; i < a->n; i++) {
        size_t es = k3rt_dtype_size(a->b[i].dtype);
        for (int64_t j = 0; j < a->b[i].n; j++)
            if (memcmp((char *)a->b[i].data + j * es, (char *)b->b[i].data + j * es, es)) {
                snprintf(where, len, "%s[%lld]: %.17g then %.17g", a->b[i].name, (long long)j,
                         ck_get(a->b[i].data, a->b[i].dtype, j),
                         ck_get(b->b[i].data, b->b[i].dtype, j));
                return 1;
            }
    }
    return 0;
}

double ck_blobs_worst(const ck_blobs *a, const ck_blobs *b, char *where, size_t len)
{
    if (!same_layout(a, b, where, len))
        return INFINITY;
    double worst = 0;
    snprintf(where, len, "no outputs");
    for (int i = 0; i < a->n; i++) {
        const ck_blob *x = &a->b[i], *y = &b->b[i];
        double e;
        if (k3rt_dtype_is_float(x->dtype)) {
            e = ck_rel_rms(x->data, y->data, x->dtype, x->n);
        } else {
            e = memcmp(x->data, y->data, (size_t)x->n * k3rt_dtype_size(x->dtype)) ? INFINITY
                                                                                   : 0.0;
        }
        if (e > worst || i == 0) {
            worst = e;
            snprintf(where, len, "%s", x->name);
        }
    }
    return worst;
}

int ck_blobs_nonfinite(const ck_blobs *a, char *where, size_t len)
{
    for (int i = 0; i < a->n; i++)
        if (k3rt_dtype_is_float(a->b[i].dtype) && !ck_finite(a->b[i].data, a->b[i].dtype,
                                                             a->b[i].n)) {
            snprintf(where, len, "%s", a->b[i].name);
            return 1;
        }
    return 0;
}

/* ---- state round trip ---------------------------------------------------------------------- */

int ck_state_copy(rig *from, rig *to, k3rt_stream *s, int *n, k3rt_error *err)
{
    struct k3rt_tensor_sink a, b;
    *n = 0;
    K3RT_TRY(rig_state(from, &a, err));
    int rc = rig_state(to, &b, err);
    if (rc) {
        tensor_sink_free(&a);
        return rc;
    }
    if (a.n != b.n)
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "state() lists %d tensors on one instance and %d "
                       "on another", a.n, b.n);
    for (int i = 0; i < a.n && !rc; i++) {
        const tensor_sink_item *src = &a.items[i], *dst = NULL;
        for (int j = 0; j < b.n && !dst; j++)
            if (!strcmp(b.items[j].name, src->name))
                dst = &b.items[j];
        for (int j = 0; j < i && !rc; j++)
            if (!strcmp(a.items[j].name, src->name))
                rc = k3rt_fail(err, K3RT_ERR_INVALID, "state() lists '%s' twice", src->name);
        if (rc)
            break;
        if (!dst) {
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "state tensor '%s' is missing from a fresh "
                           "instance", src->name);
            break;
        }
        if (!k3rt_tensor_present(&src->t) || !k3rt_tensor_present(&dst->t) ||
            src->t.dtype != dst->t.dtype || k3rt_tensor_numel(&src->t) !=
            k3rt_tensor_numel(&dst->t)) {
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "state tensor '%s' has no data or differs in "
                           "shape or dtype between instances", src->name);
            break;
        }
        size_t bytes = k3rt_tensor_bytes(&src->t);
        void *tmp = malloc(bytes + 1);
        if (!tmp) {
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
            break;
        }
        rc = ck_copy(s, tmp, K3RT_DEVICE_CPU, src->t.data, src->t.device, bytes, err);
        if (!rc)
            rc = ck_copy(s, dst->t.data, dst->t.device, tmp, K3RT_DEVICE_CPU, bytes, err);
        free(tmp);
        (*n)++;
    }
    tensor_sink_free(&a);
    tensor_sink_free(&b);
    if (!rc)
        rc = rig_state_loaded(to, err);
    return rc;
}
