/* cuDNN's backend API through dlopen (dnn_graph.h). */
#define _GNU_SOURCE
#include "dnn_graph.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cg_api {
    cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                              cudnnBackendAttributeType_t, int64_t, const void *);
    cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                              cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t,
                             cudnnBackendDescriptor_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*destroy)(cudnnHandle_t);
    cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
    size_t (*version)(void);
    const char *(*status_name)(cudnnStatus_t);
    void (*last_error)(char *, size_t);
} cg_api;

static cg_api api;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_msg[512]; /* empty when loaded */

static void load(void)
{
    const char *path = getenv("K3RT_CUDNN_LIBRARY");
    if (!path || !*path)
        path = "libcudnn.so.9";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_msg, sizeof load_msg, "cannot load %s (%s); install cuDNN 9 or point "
                 "K3RT_CUDNN_LIBRARY at libcudnn.so.9", path, dlerror());
        return;
    }
    struct { void **slot; const char *name; } sym[] = {
        {(void **)&api.create_desc, "cudnnBackendCreateDescriptor"},
        {(void **)&api.destroy_desc, "cudnnBackendDestroyDescriptor"},
        {(void **)&api.set_attr, "cudnnBackendSetAttribute"},
        {(void **)&api.get_attr, "cudnnBackendGetAttribute"},
        {(void **)&api.finalize, "cudnnBackendFinalize"},
        {(void **)&api.execute, "cudnnBackendExecute"},
        {(void **)&api.create, "cudnnCreate"},
        {(void **)&api.destroy, "cudnnDestroy"},
        {(void **)&api.set_stream, "cudnnSetStream"},
        {(void **)&api.version, "cudnnGetVersion"},
        {(void **)&api.status_name, "cudnnGetErrorString"},
        {(void **)&api.last_error, "cudnnGetLastErrorString"},
    };
    for (size_t i = 0; i < sizeof sym / sizeof sym[0]; i++) {
        *sym[i].slot = dlsym(lib, sym[i].name);
        if (!*sym[i].slot) {
            snprintf(load_msg, sizeof load_msg, "%s has no %s: not cuDNN 9", path, sym[i].name);
            api.version = NULL;
            return;
        }
    }
    /* 9.6 is the first release whose attention backward clears its own dQ accumulator. */
    if (api.version() < 90600) {
        snprintf(load_msg, sizeof load_msg, "%s is cuDNN %zu; fused attention here needs 9.6 "
                 "or later", path, api.version());
        api.version = NULL;
    }
}

int cg_load(k3rt_error *err)
{
    pthread_once(&load_once, load);
    if (load_msg[0])
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "cuDNN: %s", load_msg);
    return K3RT_OK;
}

long cg_version(void)
{
    return api.version && !load_msg[0] ? (long)api.version() : 0;
}

/* cuDNN's "not supported" family (a graph pattern, shape, type or architecture this library
 * has no engine for) is K3RT_ERR_UNSUPPORTED, which lets a caller fall back; the rest are
 * failures. */
static int cudnn_fail(k3rt_error *err, cudnnStatus_t s, const char *what, const char *graph)
{
    char last[400] = "";
    api.last_error(last, sizeof last);
    int code = CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED ? K3RT_ERR_UNSUPPORTED
                                                                       : K3RT_ERR_DEVICE;
    return k3rt_fail(err, code, "cuDNN %ld, %s: %s failed: %s%s%s", cg_version(), graph, what,
                     api.status_name(s), last[0] ? ": " : "", last);
}

int cg_handle_create(cudnnHandle_t *h, k3rt_error *err)
{
    K3RT_TRY(cg_load(err));
    cudnnStatus_t s = api.create(h);
    return s == CUDNN_STATUS_SUCCESS ? K3RT_OK : cudnn_fail(err, s, "cudnnCreate", "handle");
}

void cg_handle_destroy(cudnnHandle_t h)
{
    if (h)
        api.destroy(h);
}

/* ---- graph building ------------------------------------------------------------------------ */

void cg_init(cg_graph *g, const char *name, int64_t first_virtual_uid, k3rt_error *err)
{
    memset(g, 0, sizeof *g);
    g->name = name, g->next_uid = first_virtual_uid, g->err = err;
}

void cg_free(cg_graph *g)
{
    for (int i = 0; i < g->n_desc; i++)
        api.destroy_desc(g->desc[i]);
    g->n_desc = 0, g->n_op = 0;
}

/* Steps of one descriptor's construction: each sets the sticky error on failure. */
static int ok(cg_graph *g, cudnnStatus_t s, const char *what)
{
    if (g->rc)
        return 0;
    if (s != CUDNN_STATUS_SUCCESS) {
        g->rc = cudnn_fail(g->err, s, what, g->name);
        return 0;
    }
    return 1;
}

static cudnnBackendDescriptor_t make(cg_graph *g, cudnnBackendDescriptorType_t type,
                                     const char *what)
{
    if (g->rc)
        return NULL;
    if (g->n_desc == CG_MAX_DESCS) {
        g->rc = k3rt_fail(g->err, K3RT_ERR_INVALID, "cuDNN %s: more than %d descriptors",
                          g->name, CG_MAX_DESCS);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    if (!ok(g, api.create_desc(type, &d), what))
        return NULL;
    g->desc[g->n_desc++] = d;
    return d;
}

static void set(cg_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what)
{
    if (!g->rc && d)
        ok(g, api.set_attr(d, name, type, n, v), what);
}

static cudnnBackendDescriptor_t done(cg_graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    return d && ok(g, api.finalize(d), what) ? d : NULL;
}

static void add_op(cg_graph *g, cudnnBackendDescriptor_t op)
{
    if (g->rc || !op)
        return;
    if (g->n_op == CG_MAX_OPS) {
        g->rc = k3rt_fail(g->err, K3RT_ERR_INVALID, "cuDNN %s: more than %d operations",
                          g->name, CG_MAX_OPS);
        return;
    }
    g->op[g->n_op++] = op;
}

static cudnnBackendDescriptor_t tensor(cg_graph *g, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4],
                                       int by_value)
{
    cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor");
    bool virt = uid == 0, value = by_value != 0;
    int64_t id = virt ? g->next_uid++ : uid, align = 16;
    const char *what = "a tensor's attributes";
    set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, what);
    set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, what);
    set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, what);
    set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, what);
    set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, what);
    if (value)
        set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value, what);
    return done(g, d, "finalising a tensor");
}

cudnnBackendDescriptor_t cg_tensor(cg_graph *g, int64_t uid, cudnnDataType_t type,
                                   const int64_t dim[4], const int64_t stride[4])
{
    return tensor(g, uid, type, dim, stride, 0);
}

cudnnBackendDescriptor_t cg_scalar(cg_graph *g, int64_t uid)
{
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(g, uid, CUDNN_DATA_FLOAT, one, one, 1);
}

/* An operation of `type` whose attribute name[i] is desc[i] (a NULL desc[i] left unset). */
static void operation(cg_graph *g, cudnnBackendDescriptorType_t type, int n,
                      const cudnnBackendAttributeName_t *name,
                      const cudnnBackendDescriptor_t *desc, const char *what)
{
    cudnnBackendDescriptor_t op = make(g, type, what);
    for (int i = 0; i < n; i++)
        if (desc[i])
            set(g, op, name[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc[i], what);
    add_op(g, done(g, op, what));
}

/* A descriptor of `type` with one data-type attribute (a computation's precision). */
static cudnnBackendDescriptor_t with_type(cg_graph *g, cudnnBackendDescriptorType_t type,
                                          cudnnBackendAttributeName_t name, cudnnDataType_t t,
                                          const char *what)
{
    cudnnBackendDescriptor_t d = make(g, type, what);
    set(g, d, name, CUDNN_TYPE_DATA_TYPE, 1, &t, what);
    return d;
}

void cg_pointwise(cg_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                  cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
    const char *what = "a pointwise operation";
    cudnnBackendDescriptor_t pw = with_type(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR,
                                            CUDNN_ATTR_POINTWISE_MATH_PREC, prec, what);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
    if (axis >= 0)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
    const cudnnBackendAttributeName_t name[] = {
        CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
    const cudnnBackendDescriptor_t desc[] = {done(g, pw, what), x, b, t, y};
    operation(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, name, desc, what);
}

void cg_reduce(cg_graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t y)
{
    const char *what = "a reduction";
    cudnnBackendDescriptor_t r = with_type(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
                                           CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT,
                                           what);
    set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, what);
    const cudnnBackendAttributeName_t name[] = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                CUDNN_ATTR_OPERATION_REDUCTION_DESC};
    const cudnnBackendDescriptor_t desc[] = {x, y, done(g, r, what)};
    operation(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, name, desc, what);
}

void cg_matmul(cg_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t c)
{
    const char *what = "a matmul";
    cudnnBackendDescriptor_t mm = with_type(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR,
                                            CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT, what);
    const cudnnBackendAttributeName_t name[] = {
        CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
        CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_ATTR_OPERATION_MATMUL_DESC};
    const cudnnBackendDescriptor_t desc[] = {a, b, c, done(g, mm, what)};
    operation(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, name, desc, what);
}

void cg_reshape(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    const cudnnBackendAttributeName_t name[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
    const cudnnBackendDescriptor_t desc[] = {x, y};
    operation(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, name, desc, "a reshape");
}

/* ---- plans --------------------------------------------------------------------------------- */

/* The first heuristic configuration whose plan finalises; its descriptor stays alive with the
 * plan (not in g). */
static int first_plan(cg_graph *g, cudnnHandle_t h, cudnnBackendDescriptor_t opg,
                      cg_plan *out)
{
    const char *what = "the engine heuristics";
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what);
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opg,
        what);
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, what);
    heur = done(g, heur, what);
    int64_t n = 0;
    if (g->rc || !ok(g, api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL), what))
        return g->rc;
    if (n > 16)
        n = 16;
    cudnnBackendDescriptor_t cfg[16];
    for (int64_t i = 0; i < n; i++)
        cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what);
    int64_t got = 0;
    if (g->rc || !ok(g, api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg), what))
        return g->rc;
    for (int64_t i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        if (api.create_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan))
            continue;
        if (!api.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) &&
            !api.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]) &&
            !api.finalize(plan)) {
            int64_t ws = 0, cnt = 0;
            api.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                         &cnt, &ws);
            out->plan = plan, out->workspace = ws;
            return K3RT_OK;
        }
        api.destroy_desc(plan);
    }
    char last[400] = "";
    api.last_error(last, sizeof last);
    return g->rc = k3rt_fail(g->err, K3RT_ERR_UNSUPPORTED, "cuDNN %ld, %s: none of the %lld "
                             "engine configurations of the heuristics builds a plan%s%s",
                             cg_version(), g->name, (long long)got, last[0] ? ": " : "", last);
}

int cg_plan_build(cg_graph *g, cudnnHandle_t h, cg_plan *out)
{
    memset(out, 0, sizeof *out);
    const char *what = "the operation graph";
    cudnnBackendDescriptor_t opg = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what);
    set(g, opg, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, what);
    set(g, opg, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_op, g->op,
        what);
    opg = done(g, opg, what);
    if (!g->rc)
        first_plan(g, h, opg, out);
    if (!g->rc) {
        out->keep = malloc((size_t)g->n_desc * sizeof *out->keep);
        if (!out->keep)
            g->rc = k3rt_fail(g->err, K3RT_ERR_NOMEM, "cuDNN %s: out of memory", g->name);
    }
    if (g->rc) {
        cg_plan_destroy(out);
        cg_free(g);
        return g->rc;
    }
    memcpy(out->keep, g->desc, (size_t)g->n_desc * sizeof *out->keep);
    out->n_keep = g->n_desc;
    g->n_desc = 0, g->n_op = 0;
    return K3RT_OK;
}

void cg_plan_destroy(cg_plan *p)
{
    if (p->plan)
        api.destroy_desc(p->plan);
    for (int i = p->n_keep - 1; i >= 0; i--)
        api.destroy_desc(p->keep[i]);
    free(p->keep);
    memset(p, 0, sizeof *p);
}

int cg_execute(cudnnHandle_t h, void *stream, const cg_plan *p, int n, const int64_t *uids,
               void *const *ptrs, void *workspace, k3rt_error *err)
{
    cudnnStatus_t s = api.set_stream(h, (cudaStream_t)stream);
    if (s)
        return cudnn_fail(err, s, "cudnnSetStream", "execution");
    cudnnBackendDescriptor_t pack = NULL;
    s = api.create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (!s)
        s = api.set_attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (!s)
        s = api.set_attr(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                         ptrs);
    if (!s)
        s = api.set_attr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                         &workspace);
    if (!s)
        s = api.finalize(pack);
    if (!s)
        s = api.execute(h, p->plan, pack);
    int rc = s ? cudnn_fail(err, s, "executing a plan", "execution") : K3RT_OK;
    if (pack)
        api.destroy_desc(pack);
    return rc;
}
