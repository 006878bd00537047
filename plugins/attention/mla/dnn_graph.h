/* A small C layer over cuDNN's backend (graph) API, loaded at run time with dlopen so that the
 * plugin builds against the headers alone and loads on machines without cuDNN. A graph is
 * described with tensors and operations, then finalised into one execution plan by cuDNN's
 * heuristics; every failure names the descriptor or step and carries cuDNN's own message. */
#ifndef K3RT_PLUGIN_MLA_DNN_GRAPH_H
#define K3RT_PLUGIN_MLA_DNN_GRAPH_H

#include <cudnn_graph.h>
#include <k3rt/k3rt.h>

/* Loads the library once per process: $K3RT_CUDNN_LIBRARY when set, else libcudnn.so.9.
 * K3RT_ERR_UNSUPPORTED with the loader's reason when it is missing or older than 9.6. */
int cg_load(k3rt_error *err);
/* cudnnGetVersion() of the loaded library (0 before a successful cg_load). */
long cg_version(void);

int cg_handle_create(cudnnHandle_t *h, k3rt_error *err);
void cg_handle_destroy(cudnnHandle_t h);

#define CG_MAX_DESCS 96
#define CG_MAX_OPS 40

/* A graph under construction. The first failure sticks: later calls do nothing and cg_plan
 * reports it, so a builder checks once at the end. */
typedef struct cg_graph {
    cudnnBackendDescriptor_t desc[CG_MAX_DESCS]; /* everything created, destroyed by cg_free */
    int n_desc;
    cudnnBackendDescriptor_t op[CG_MAX_OPS];
    int n_op;
    int64_t next_uid;  /* for virtual tensors */
    int rc;
    k3rt_error *err;
    const char *name;  /* "attention forward", for messages */
} cg_graph;

void cg_init(cg_graph *g, const char *name, int64_t first_virtual_uid, k3rt_error *err);
void cg_free(cg_graph *g);

/* A 4-d tensor; uid > 0 for one the caller binds at execution, 0 for a virtual one. */
cudnnBackendDescriptor_t cg_tensor(cg_graph *g, int64_t uid, cudnnDataType_t type,
                                   const int64_t dim[4], const int64_t stride[4]);
/* A float scalar passed by value at execution (bound to a host float). */
cudnnBackendDescriptor_t cg_scalar(cg_graph *g, int64_t uid);

/* y = mode(x[, b[, t]]), math in `prec`; axis >= 0 for GEN_INDEX. */
void cg_pointwise(cg_graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                  cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis);
/* y = reduce(x) over the dimensions where y has extent 1, in fp32. */
void cg_reduce(cg_graph *g, cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t y);
/* c = a b (batched over the leading dimensions), fp32 accumulation. */
void cg_matmul(cg_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t c);
/* y views x with other dimensions and strides (a transpose here). */
void cg_reshape(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

typedef struct cg_plan {
    cudnnBackendDescriptor_t plan;
    int64_t workspace;  /* bytes the plan needs at execution */
    /* The graph's descriptors (tensors, operations, engine configuration), alive as long as the
     * plan that was built from them. */
    cudnnBackendDescriptor_t *keep;
    int n_keep;
} cg_plan;

/* Finalises the operation graph on handle h and takes the first engine configuration of
 * cuDNN's heuristics (mode A) that builds: K3RT_ERR_UNSUPPORTED when none does, or when a
 * step fails with cuDNN's "not supported" family. The plan takes over the graph's descriptors; on
 * failure they are freed. g is empty afterwards either way. */
int cg_plan_build(cg_graph *g, cudnnHandle_t h, cg_plan *out);
void cg_plan_destroy(cg_plan *p);

/* Runs plan p on stream with n (uid, pointer) bindings and `workspace`. */
int cg_execute(cudnnHandle_t h, void *stream, const cg_plan *p, int n, const int64_t *uids,
               void *const *ptrs, void *workspace, k3rt_error *err);

#endif
