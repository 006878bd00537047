/* The attention core through cuDNN's fused flash attention (mla_cuda.h's MLA_KERNEL_CUDNN).
 * cuDNN recognises scaled-dot-product attention written as a graph of its backend operations
 * (matmul, scale, causal mask, softmax, matmul) and runs it as one fused kernel; the graphs
 * below are the ones its fused engines match (cuDNN frontend's composite SDPA, top-left causal
 * mask, no dropout, no bias), down to the types and strides of the virtual tensors. Plans are
 * built once per (device, shape, direction) and kept for the life of the process (32 at most;
 * the oldest is replaced after a device synchronisation).
 *
 * The same definitions as k3rt's kernels: the statistics output is the natural log-sum-exp of
 * the scaled logits, [B, H, T] f32, so either backward consumes either forward's lse. The max
 * logits k3rt's forward reports (block_max) have no counterpart here: cuDNN 9.14 and 9.19
 * accept the row maximum as a graph output but leave it unwritten (measured on an H200).
 *
 * The library path, taken wherever it takes the call (bf16, T a multiple of 128, head widths
 * up to 256 on sm_90, no max logits asked for, a backward that need not be deterministic):
 * 0.95-1.00x of PyTorch's SDPA (docs/PERFORMANCE.md); k3rt's kernels (attn_tc*.cu,
 * attn_simple.cu) serve the rest. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attn_cudnn.h"
#include "dnn_graph.h"

enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF, U_ONE,
    U_DO, U_DQ, U_DK, U_DV, U_DQ_ACC, U_SOFTMAX_SUM,
    U_FIRST_VIRTUAL = 100
};

#define MAX_DEVICES 64
#define MAX_PLANS 32

typedef struct plan_key {
    int device, backward;
    int64_t B, T, H, dqk, dv;
} plan_key;

typedef struct plan_entry {
    plan_key key;
    int state;          /* 0 empty, 1 built, -1 cuDNN has no engine for it */
    cg_plan plan;
    void *workspace;    /* plan.workspace bytes on key.device */
} plan_entry;

static struct {
    pthread_mutex_t mu;
    cudnnHandle_t handle[MAX_DEVICES];
    plan_entry e[MAX_PLANS];
    int next;           /* the slot a full cache reuses next */
} cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- shapes -------------------------------------------------------------------------------- */

typedef struct dims {
    int64_t d[4], s[4];
} dims;

static dims mk(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
               int64_t s2, int64_t s3)
{
    dims x = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return x;
}

/* Token-major tensors [B, T, H, w] seen as [B, H, T, w] (transposed: [B, H, w, T]). */
static dims tokens(const plan_key *k, int64_t w, int transposed)
{
    int64_t B = k->B, T = k->T, H = k->H;
    return transposed ? mk(B, H, w, T, T * H * w, w, 1, H * w)
                      : mk(B, H, T, w, T * H * w, w, H * w, 1);
}

static dims rows(const plan_key *k) /* [B, H, T, 1] */
{
    return mk(k->B, k->H, k->T, 1, k->H * k->T, k->T, 1, 1);
}

static dims scores(const plan_key *k, int transposed) /* [B, H, T, T] */
{
    int64_t B = k->B, T = k->T, H = k->H;
    return transposed ? mk(B, H, T, T, H * T * T, T * T, 1, T)
                      : mk(B, H, T, T, H * T * T, T * T, T, 1);
}

typedef cudnnBackendDescriptor_t desc;

static desc ten(cg_graph *g, int64_t uid, cudnnDataType_t t, dims x)
{
    return cg_tensor(g, uid, t, x.d, x.s);
}

static desc virt(cg_graph *g, cudnnDataType_t t, dims x)
{
    return cg_tensor(g, 0, t, x.d, x.s);
}

static desc unary(cg_graph *g, cudnnPointwiseMode_t mode, desc x, dims shape)
{
    desc y = virt(g, CUDNN_DATA_FLOAT, shape);
    cg_pointwise(g, mode, CUDNN_DATA_FLOAT, x, NULL, NULL, y, -1);
    return y;
}

static desc binary(cg_graph *g, cudnnPointwiseMode_t mode, desc x, desc b, dims shape)
{
    desc y = virt(g, CUDNN_DATA_FLOAT, shape);
    cg_pointwise(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
    return y;
}

/* Keeps s where column <= row, -inf elsewhere. */
static desc causal(cg_graph *g, desc s, desc neg_inf, dims shape)
{
    desc row = virt(g, CUDNN_DATA_INT32, shape), col = virt(g, CUDNN_DATA_INT32, shape);
    cg_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    cg_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    desc keep = virt(g, CUDNN_DATA_BOOLEAN, shape);
    cg_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    desc y = virt(g, CUDNN_DATA_FLOAT, shape);
    cg_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, y, -1);
    return y;
}

/* S = scale Q K^T, causal; M = rowmax S; Z = sum exp(S - M); stats = M + log Z;
 * O = (exp(S - M) / Z) V. */
static void forward_graph(cg_graph *g, const plan_key *k)
{
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    dims ss = scores(k, 0), r = rows(k);
    desc q = ten(g, U_Q, bf, tokens(k, k->dqk, 0)), kt = ten(g, U_K, bf, tokens(k, k->dqk, 1));
    desc v = ten(g, U_V, bf, tokens(k, k->dv, 0)), o = ten(g, U_O, bf, tokens(k, k->dv, 0));
    desc scale = cg_scalar(g, U_SCALE), neg_inf = cg_scalar(g, U_NEG_INF);
    desc s = virt(g, f32, ss);
    cg_matmul(g, q, kt, s);
    s = causal(g, binary(g, CUDNN_POINTWISE_MUL, s, scale, ss), neg_inf, ss);
    desc m = virt(g, f32, r);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, m);
    desc e = unary(g, CUDNN_POINTWISE_EXP, binary(g, CUDNN_POINTWISE_SUB, s, m, ss), ss);
    desc z = virt(g, f32, r);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    desc stats = ten(g, U_STATS, f32, r);
    cg_pointwise(g, CUDNN_POINTWISE_ADD, f32, m, unary(g, CUDNN_POINTWISE_LOG, z, r), NULL,
                 stats, -1);
    desc p = virt(g, bf, ss);
    cg_pointwise(g, CUDNN_POINTWISE_DIV, f32, e, z, NULL, p, -1);
    cg_matmul(g, p, v, o);
}

/* D = rowsum(dO o O); P = exp(scale Q K^T - stats), causal; dV = P^T dO;
 * dS = scale P o (dO V^T - D); dK = dS^T Q; dQ = dS K (accumulated in f32). */
static void backward_graph(cg_graph *g, const plan_key *k)
{
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    int64_t B = k->B, T = k->T, H = k->H, dqk = k->dqk;
    dims ss = scores(k, 0), st = scores(k, 1), r = rows(k), vv = tokens(k, k->dv, 0);
    dims qq = tokens(k, dqk, 0);
    desc q = ten(g, U_Q, bf, qq), kt = ten(g, U_K, bf, tokens(k, dqk, 1));
    desc vt = ten(g, U_V, bf, tokens(k, k->dv, 1)), o = ten(g, U_O, bf, vv);
    desc dout = ten(g, U_DO, bf, vv), stats = ten(g, U_STATS, f32, r);
    desc scale = cg_scalar(g, U_SCALE), neg_inf = cg_scalar(g, U_NEG_INF);
    desc one = cg_scalar(g, U_ONE);

    desc dd = virt(g, f32, r);
    dims prod = mk(B, H, T, k->dv, H * T * k->dv, T * k->dv, H * k->dv, 1);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, binary(g, CUDNN_POINTWISE_MUL, dout, o, prod), dd);
    desc sum = ten(g, U_SOFTMAX_SUM, f32, r);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, f32, dd, one, NULL, sum, -1);

    desc s = virt(g, f32, ss);
    cg_matmul(g, q, kt, s);
    s = binary(g, CUDNN_POINTWISE_MUL, s, scale, ss);
    s = causal(g, binary(g, CUDNN_POINTWISE_SUB, s, stats, ss), neg_inf, ss);
    desc p = unary(g, CUDNN_POINTWISE_EXP, s, ss);
    desc pt = virt(g, bf, st);
    cg_reshape(g, p, pt);
    cg_matmul(g, pt, dout, ten(g, U_DV, bf, vv));

    desc dp = virt(g, f32, ss);
    cg_matmul(g, dout, vt, dp);
    desc ds = binary(g, CUDNN_POINTWISE_MUL, binary(g, CUDNN_POINTWISE_SUB, dp, sum, ss), p, ss);
    ds = binary(g, CUDNN_POINTWISE_MUL, ds, scale, ss);
    desc dst = virt(g, bf, st);
    cg_reshape(g, ds, dst);
    cg_matmul(g, dst, q, ten(g, U_DK, bf, qq));

    desc kk = virt(g, f32, tokens(k, dqk, 0)); /* K viewed back: as the frontend types it */
    cg_reshape(g, kt, kk);
    desc acc = ten(g, U_DQ_ACC, f32, mk(B, H, T, dqk, H * T * dqk, T * dqk, dqk, 1));
    cg_matmul(g, ds, kk, acc);
    cg_pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, acc, NULL, NULL, ten(g, U_DQ, bf, qq), -1);
}

/* ---- plans --------------------------------------------------------------------------------- */

static int same(const plan_key *a, const plan_key *b)
{
    return !memcmp(a, b, sizeof *a);
}

/* The cache entry of key in *out, built on first use; K3RT_ERR_UNSUPPORTED when cuDNN has no
 * engine for it (remembered, so the heuristics run once per shape). Called with cache.mu. */
static int plan_for(const plan_key *key, cudnnHandle_t *h, plan_entry **out, k3rt_error *err)
{
    *out = NULL;
    if (!cache.handle[key->device])
        K3RT_TRY(cg_handle_create(&cache.handle[key->device], err));
    *h = cache.handle[key->device];
    for (int i = 0; i < MAX_PLANS; i++)
        if (cache.e[i].state && same(&cache.e[i].key, key)) {
            if (cache.e[i].state < 0)
                return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "cuDNN %ld has no fused attention "
                                 "engine for B %lld, T %lld, H %lld, dqk %lld, dv %lld",
                                 cg_version(), (long long)key->B, (long long)key->T,
                                 (long long)key->H, (long long)key->dqk, (long long)key->dv);
            *out = &cache.e[i];
            return K3RT_OK;
        }

    plan_entry *e = &cache.e[cache.next];
    cache.next = (cache.next + 1) % MAX_PLANS;
    if (e->state > 0) {
        /* The slot's plan may still be running: wait for the device before reusing it. */
        cudaDeviceSynchronize();
        cg_plan_destroy(&e->plan);
        k3rt_free(e->key.device, e->workspace);
    }
    memset(e, 0, sizeof *e);
    cg_graph g;
    cg_init(&g, key->backward ? "attention backward" : "attention forward", U_FIRST_VIRTUAL,
            err);
    if (key->backward)
        backward_graph(&g, key);
    else
        forward_graph(&g, key);
    int rc = cg_plan_build(&g, *h, &e->plan);
    e->key = *key;
    if (rc == K3RT_ERR_UNSUPPORTED)
        e->state = -1;
    if (rc)
        return rc;
    if (e->plan.workspace > 0) {
        e->workspace = k3rt_alloc(key->device, (size_t)e->plan.workspace, err);
        if (!e->workspace) {
            cg_plan_destroy(&e->plan);
            return k3rt_error_prefix(err, "mla attention (cuDNN): %lld bytes of plan workspace: ",
                                     (long long)e->plan.workspace);
        }
    }
    e->state = 1;
    *out = e;
    return K3RT_OK;
}

/* ---- entry points -------------------------------------------------------------------------- */

int mla_cudnn_load(k3rt_error *err)
{
    return cg_load(err);
}

int mla_cudnn_shape_ok(const mla_attn *a, int cc_major, const char **why)
{
    const void *p[] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv_out};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if ((uintptr_t)p[i] & 15)
            return *why = "a tensor is not 16-byte aligned", 0;
    if (a->dtype != K3RT_BF16)
        return *why = "cuDNN's fused attention runs bf16 here", 0;
    if (a->T % 128)
        return *why = "T is not a multiple of 128", 0;
    if (a->dqk % 8 || a->dv % 8)
        return *why = "head widths must be multiples of 8", 0;
    int64_t wmax = cc_major == 9 ? 256 : 128;
    if (a->dqk > wmax || a->dv > wmax)
        return *why = cc_major == 9 ? "head widths above 256" : "head widths above 128 "
                      "(off Hopper)", 0;
    return 1;
}

static int run(cudaStream_t st, const mla_attn *a, int backward, k3rt_error *err)
{
    int dev;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES)
        return k3rt_fail(err, K3RT_ERR_DEVICE, "mla attention (cuDNN): no usable current "
                         "device");
    plan_key key;
    memset(&key, 0, sizeof key);
    key.device = dev, key.backward = backward;
    key.B = a->B, key.T = a->T, key.H = a->H, key.dqk = a->dqk, key.dv = a->dv;
    float scale = (float)a->scale, neg_inf = -INFINITY, one = 1.0f;
    int64_t uid[16];
    void *ptr[16];
    int n = 0;
#define BIND(u, p) (uid[n] = (u), ptr[n++] = (void *)(p))
    BIND(U_Q, a->q), BIND(U_K, a->k), BIND(U_V, a->v), BIND(U_O, a->o);
    BIND(U_STATS, a->lse), BIND(U_SCALE, &scale), BIND(U_NEG_INF, &neg_inf);
    if (backward) {
        BIND(U_ONE, &one), BIND(U_DO, a->dout), BIND(U_DQ, a->dq), BIND(U_DK, a->dk);
        BIND(U_DV, a->dv_out), BIND(U_DQ_ACC, a->dq_acc), BIND(U_SOFTMAX_SUM, a->drow);
    }
#undef BIND
    pthread_mutex_lock(&cache.mu);
    cudnnHandle_t h = NULL;
    plan_entry *e = NULL;
    int rc = plan_for(&key, &h, &e, err);
    if (!rc)
        rc = cg_execute(h, st, &e->plan, n, uid, ptr, e->workspace, err);
    pthread_mutex_unlock(&cache.mu);
    return rc;
}

int mla_cudnn_fwd(void *st, const mla_attn *a, k3rt_error *err)
{
    if (a->block_max)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention (cuDNN): the forward cannot "
                         "report block_max");
    return run((cudaStream_t)st, a, 0, err);
}

int mla_cudnn_bwd(void *st, const mla_attn *a, k3rt_error *err)
{
    if (!a->dq_acc || ((uintptr_t)a->dq_acc & 15) || !a->drow)
        return k3rt_fail(err, K3RT_ERR_INVALID, "mla attention backward (cuDNN): needs dq_acc "
                         "(16-byte aligned f32 scratch of B*T*H*dqk) and drow");
    return run((cudaStream_t)st, a, 1, err);
}
