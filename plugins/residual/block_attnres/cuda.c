/* block_attnres on CUDA: the plugin's mixing ops handed to the kernels of cuda/attnres_cuda.h
 * (f32 or bf16, fp32 arithmetic), and the depth-weight statistics kept on the device. The
 * control flow is attnres.c's, shared with the CPU. */
#include <string.h>

#include "attnres.h"
#include "cuda/attnres_cuda.h"

static void cuda_op(const attnres *r, const ar_op *op, const k3rt_residual_args *norm,
                    ar_cuda_op *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = r->dtype;
    o->n = op->n;
    o->N = op->N;
    o->d = op->d;
    for (int i = 0; i < op->n; i++)
        o->v[i] = op->v[i];
    o->w = op->w;
    o->gamma = op->gamma;
    o->eps = (float)op->eps;
    o->alpha = op->alpha;
    o->rho_last = op->rho_last;
    o->z_last = op->z_last;
    if (norm) {
        o->norm_gain = norm->norm_gain.data;
        o->norm_eps = (float)norm->norm_eps;
        o->normed = norm->normed.data;
        o->rstd = norm->rstd.data;
    }
}

int attnres_cuda_fwd(const attnres *r, const ar_op *op, const k3rt_residual_args *norm,
                     void *h, void *h32, k3rt_error *err)
{
    ar_cuda_op o;
    cuda_op(r, op, norm, &o);
    K3RT_TRY(ar_cuda_enter(r->device, err));
    return ar_cuda_fwd(k3rt_stream_native(op->stream), &o, h, h32, err);
}

int attnres_cuda_bwd(const attnres *r, const ar_op *op, const k3rt_residual_args *norm,
                     const void *dh, const void *h, const void *h32, int recon, int overwrite,
                     void *const *dv, void *dw, void *dgamma, void *scratch, k3rt_error *err)
{
    ar_cuda_op o;
    cuda_op(r, op, norm, &o);
    ar_cuda_bwd b;
    memset(&b, 0, sizeof b);
    b.h = h;
    b.h32 = h32;
    b.dh = dh;
    b.recon = recon;
    b.overwrite = overwrite;
    for (int i = 0; i < op->n; i++)
        b.dv[i] = dv[i];
    b.dw = dw;
    b.dgamma = dgamma;
    b.norm_gain_grad = norm ? norm->norm_gain_grad.data : NULL;
    b.scratch = scratch;
    K3RT_TRY(ar_cuda_enter(r->device, err));
    return ar_cuda_bwd_run(k3rt_stream_native(op->stream), &o, &b, err);
}

int attnres_cuda_stats(attnres *r, k3rt_stream *st, int s, const void *alpha, int64_t N, int n,
                       k3rt_error *err)
{
    int cols = r->nb + 1, fresh = r->alpha_tokens[s] == 0;
    r->alpha_tokens[s] += N;
    int64_t at = (int64_t)s * cols;
    K3RT_TRY(ar_cuda_enter(r->device, err));
    return ar_cuda_alpha_stats(k3rt_stream_native(st), alpha, N, n, cols, fresh,
                               (double)r->alpha_tokens[s], r->dev_sum + at, r->dev_mean + at,
                               err);
}

int64_t attnres_cuda_scratch_bytes(int64_t N, int64_t d) { return ar_cuda_bwd_scratch_bytes(N, d); }

int attnres_cuda_create(attnres *r, k3rt_error *err)
{
    K3RT_TRY(ar_cuda_supported(r->dtype, r->d, r->nb + 1, err));
    size_t cells = (size_t)(r->S + 1) * (size_t)(r->nb + 1);
    if (!(r->dev_sum = k3rt_alloc(r->device, cells * sizeof(double), err)) ||
        !(r->dev_mean = k3rt_alloc(r->device, cells * sizeof(float), err)))
        return err->code;
    K3RT_TRY(k3rt_memset(r->stream, r->dev_sum, r->device, 0, cells * sizeof(double), err));
    return k3rt_memset(r->stream, r->dev_mean, r->device, 0, cells * sizeof(float), err);
}

void attnres_cuda_destroy(attnres *r)
{
    if (r->dev_sum)
        k3rt_free(r->device, r->dev_sum);
    if (r->dev_mean)
        k3rt_free(r->device, r->dev_mean);
}
