/* The shared ops' public entry points (k3rt/ops.h): argument checks and dispatch. */
#include "ops/dispatch.h"

int k3rt_stream_index_error(k3rt_stream *s, k3rt_error *err)
{
    if (k3rt_stream_device(s) == K3RT_DEVICE_CPU)
        return K3RT_OK;
#ifdef K3RT_HAVE_CUDA
    return cuda_ops_take_index_error(k3rt_stream_device(s), err);
#else
    return ops_no_cuda_kernel(err, "take_index_error");
#endif
}

int ops_no_cuda_kernel(k3rt_error *err, const char *op)
{
#ifdef K3RT_HAVE_CUDA
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "op %s has no CUDA kernel in this build", op);
#else
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "op %s on a CUDA stream: this k3rt was built "
                     "without CUDA (no CUDA toolkit found at configure time)", op);
#endif
}

int ops_bad_dtype(k3rt_error *err, const char *op, int dtype)
{
    return k3rt_fail(err, K3RT_ERR_INVALID, "op %s: dtype %s is not supported on the CPU "
                     "(f32 or f64)", op, k3rt_dtype_name(dtype));
}

int k3rt_rmsnorm_fwd(k3rt_stream *s, int dtype, const void *x, const void *gain, void *y,
                     void *rstd, int64_t n, int64_t d, double eps, k3rt_error *err)
{
    OPS_ON_CUDA(s, "rmsnorm_fwd", cuda_rmsnorm_fwd(s, dtype, x, gain, y, rstd, n, d, eps, err));
#define CALL(S, R, NT) \
    cpu_rmsnorm_fwd_##S((const R *)x, (const R *)gain, (R *)y, (R *)rstd, n, d, eps, NT)
    OPS_DISPATCH(s, dtype, "rmsnorm_fwd", CALL);
#undef CALL
}

int k3rt_rmsnorm_bwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                     const void *rstd, const void *dy, void *dx, void *dgain, int64_t n,
                     int64_t d, int accumulate_dx, k3rt_error *err)
{
    OPS_ON_CUDA(s, "rmsnorm_bwd",
                cuda_rmsnorm_bwd(s, dtype, x, gain, rstd, dy, dx, dgain, n, d, accumulate_dx,
                                 err));
#define CALL(S, R, NT)                                                                       \
    cpu_rmsnorm_bwd_##S((const R *)x, (const R *)gain, (const R *)rstd, (const R *)dy,       \
                        (R *)dx, (R *)dgain, n, d, accumulate_dx, NT)
    OPS_DISPATCH(s, dtype, "rmsnorm_bwd", CALL);
#undef CALL
}

static int check_tokens(const int32_t *tokens, int64_t n, int64_t vocab, k3rt_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return k3rt_fail(err, K3RT_ERR_INVALID,
                             "token %d at position %lld is outside the vocabulary [0, %lld)",
                             tokens[i], (long long)i, (long long)vocab);
    return K3RT_OK;
}

int k3rt_embedding_fwd(k3rt_stream *s, int dtype, const void *table, const int32_t *tokens,
                       void *out, int64_t n, int64_t vocab, int64_t d, k3rt_error *err)
{
    OPS_ON_CUDA(s, "embedding_fwd",
                cuda_embedding_fwd(s, dtype, table, tokens, out, n, vocab, d, err));
    K3RT_TRY(check_tokens(tokens, n, vocab, err));
#define CALL(S, R, NT) cpu_embedding_fwd_##S((const R *)table, tokens, (R *)out, n, d, NT)
    OPS_DISPATCH(s, dtype, "embedding_fwd", CALL);
#undef CALL
}

int k3rt_embedding_bwd(k3rt_stream *s, int dtype, const int32_t *tokens, const void *dout,
                       void *dtable, int64_t n, int64_t vocab, int64_t d, k3rt_error *err)
{
    OPS_ON_CUDA(s, "embedding_bwd",
                cuda_embedding_bwd(s, dtype, tokens, dout, dtable, n, vocab, d, err));
    K3RT_TRY(check_tokens(tokens, n, vocab, err));
#define CALL(S, R, NT) cpu_embedding_bwd_##S(tokens, (const R *)dout, (R *)dtable, n, d, NT)
    OPS_DISPATCH(s, dtype, "embedding_bwd", CALL);
#undef CALL
}

static int check_targets(const int32_t *targets, int64_t n, int64_t v, k3rt_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (targets[i] >= v)
            return k3rt_fail(err, K3RT_ERR_INVALID,
                             "target %d at position %lld is outside the vocabulary [0, %lld)",
                             targets[i], (long long)i, (long long)v);
    return K3RT_OK;
}

int k3rt_xent_fwd(k3rt_stream *s, int dtype, const void *logits, const int32_t *targets,
                  void *loss, void *lse, int64_t n, int64_t v, k3rt_error *err)
{
    OPS_ON_CUDA(s, "xent_fwd", cuda_xent_fwd(s, dtype, logits, targets, loss, lse, n, v, err));
    K3RT_TRY(check_targets(targets, n, v, err));
#define CALL(S, R, NT) \
    cpu_xent_fwd_##S((const R *)logits, targets, (R *)loss, (R *)lse, n, v, NT)
    OPS_DISPATCH(s, dtype, "xent_fwd", CALL);
#undef CALL
}

int k3rt_xent_bwd(k3rt_stream *s, int dtype, const void *logits, const int32_t *targets,
                  const void *lse, double scale, void *dlogits, int64_t n, int64_t v,
                  k3rt_error *err)
{
    OPS_ON_CUDA(s, "xent_bwd",
                cuda_xent_bwd(s, dtype, logits, targets, lse, scale, dlogits, n, v, err));
    K3RT_TRY(check_targets(targets, n, v, err));
#define CALL(S, R, NT) \
    cpu_xent_bwd_##S((const R *)logits, targets, (const R *)lse, scale, (R *)dlogits, n, v, NT)
    OPS_DISPATCH(s, dtype, "xent_bwd", CALL);
#undef CALL
}

static int check_act(int act, k3rt_error *err)
{
    if (act < K3RT_ACT_IDENTITY || act > K3RT_ACT_RELU)
        return k3rt_fail(err, K3RT_ERR_INVALID, "unknown activation %d", act);
    return K3RT_OK;
}

int k3rt_act_fwd(k3rt_stream *s, int dtype, int act, const void *x, void *y, int64_t n,
                 k3rt_error *err)
{
    K3RT_TRY(check_act(act, err));
    OPS_ON_CUDA(s, "act_fwd", cuda_act_fwd(s, dtype, act, x, y, n, err));
#define CALL(S, R, NT) cpu_act_fwd_##S(act, (const R *)x, (R *)y, n, NT)
    OPS_DISPATCH(s, dtype, "act_fwd", CALL);
#undef CALL
}

int k3rt_act_bwd(k3rt_stream *s, int dtype, int act, const void *x, const void *dy, void *dx,
                 int64_t n, int accumulate_dx, k3rt_error *err)
{
    K3RT_TRY(check_act(act, err));
    OPS_ON_CUDA(s, "act_bwd", cuda_act_bwd(s, dtype, act, x, dy, dx, n, accumulate_dx, err));
#define CALL(S, R, NT) \
    cpu_act_bwd_##S(act, (const R *)x, (const R *)dy, (R *)dx, n, accumulate_dx, NT)
    OPS_DISPATCH(s, dtype, "act_bwd", CALL);
#undef CALL
}

static int check_glu(int glu, double b1, double b2, k3rt_error *err)
{
    if (glu != K3RT_GLU_SWIGLU && glu != K3RT_GLU_SITU && glu != K3RT_GLU_SIGMOID)
        return k3rt_fail(err, K3RT_ERR_INVALID, "unknown GLU variant %d", glu);
    if (glu == K3RT_GLU_SITU && (!(b1 > 0) || !(b2 > 0)))
        return k3rt_fail(err, K3RT_ERR_INVALID, "SiTU-GLU needs beta1 > 0 and beta2 > 0 "
                         "(got %g, %g)", b1, b2);
    return K3RT_OK;
}

int k3rt_glu_fwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                 void *out, int64_t n, double beta1, double beta2, k3rt_error *err)
{
    K3RT_TRY(check_glu(glu, beta1, beta2, err));
    OPS_ON_CUDA(s, "glu_fwd", cuda_glu_fwd(s, dtype, glu, gate, up, out, n, beta1, beta2, err));
#define CALL(S, R, NT) \
    cpu_glu_fwd_##S(glu, (const R *)gate, (const R *)up, (R *)out, n, beta1, beta2, NT)
    OPS_DISPATCH(s, dtype, "glu_fwd", CALL);
#undef CALL
}

int k3rt_glu_bwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                 const void *dout, void *dgate, void *dup, int64_t n, double beta1,
                 double beta2, k3rt_error *err)
{
    K3RT_TRY(check_glu(glu, beta1, beta2, err));
    OPS_ON_CUDA(s, "glu_bwd",
                cuda_glu_bwd(s, dtype, glu, gate, up, dout, dgate, dup, n, beta1, beta2, err));
#define CALL(S, R, NT)                                                                    \
    cpu_glu_bwd_##S(glu, (const R *)gate, (const R *)up, (const R *)dout, (R *)dgate,     \
                    (R *)dup, n, beta1, beta2, NT)
    OPS_DISPATCH(s, dtype, "glu_bwd", CALL);
#undef CALL
}

int k3rt_axpby(k3rt_stream *s, int dtype, int64_t n, double alpha, const void *x, double beta,
               void *y, k3rt_error *err)
{
    OPS_ON_CUDA(s, "axpby", cuda_axpby(s, dtype, n, alpha, x, beta, y, err));
#define CALL(S, R, NT) cpu_axpby_##S(n, alpha, (const R *)x, beta, (R *)y, NT)
    OPS_DISPATCH(s, dtype, "axpby", CALL);
#undef CALL
}

int k3rt_mul(k3rt_stream *s, int dtype, int64_t n, const void *a, const void *b, void *out,
             k3rt_error *err)
{
    OPS_ON_CUDA(s, "mul", cuda_mul(s, dtype, n, a, b, out, err));
#define CALL(S, R, NT) cpu_mul_##S(n, (const R *)a, (const R *)b, (R *)out, NT)
    OPS_DISPATCH(s, dtype, "mul", CALL);
#undef CALL
}

int k3rt_fill(k3rt_stream *s, int dtype, void *x, int64_t n, double value, k3rt_error *err)
{
    OPS_ON_CUDA(s, "fill", cuda_fill(s, dtype, x, n, value, err));
#define CALL(S, R, NT) cpu_fill_##S((R *)x, n, value, NT)
    OPS_DISPATCH(s, dtype, "fill", CALL);
#undef CALL
}

int k3rt_sum_squares(k3rt_stream *s, int dtype, const void *x, int64_t n, double *out,
                     k3rt_error *err)
{
    OPS_ON_CUDA(s, "sum_squares", cuda_sum_squares(s, dtype, x, n, out, err));
#define CALL(S, R, NT) ((void)(NT), *out = cpu_sum_squares_##S((const R *)x, n))
    OPS_DISPATCH(s, dtype, "sum_squares", CALL);
#undef CALL
}

int k3rt_cast(k3rt_stream *s, const void *src, int src_dtype, void *dst, int dst_dtype,
              int64_t n, k3rt_error *err)
{
    OPS_ON_CUDA(s, "cast", cuda_cast(s, src, src_dtype, dst, dst_dtype, n, err));
    return k3rt_convert(dst, dst_dtype, src, src_dtype, n, err);
}

int k3rt_adamw_step(k3rt_stream *s, int dtype, void *param, const void *grad, void *m, void *v,
                    int64_t n, double lr, double beta1, double beta2, double eps,
                    double weight_decay, int64_t step, k3rt_error *err)
{
    if (step < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step: step must be >= 1, got %lld",
                         (long long)step);
    OPS_ON_CUDA(s, "adamw_step",
                cuda_adamw_step(s, dtype, param, grad, m, v, n, lr, beta1, beta2, eps,
                                weight_decay, step, err));
#define CALL(S, R, NT)                                                                      \
    cpu_adamw_##S((R *)param, (const R *)grad, (R *)m, (R *)v, n, lr, beta1, beta2, eps,    \
                  weight_decay, step, NT)
    OPS_DISPATCH(s, dtype, "adamw_step", CALL);
#undef CALL
}

static int check_adamw_multi(int64_t count, void *const *param, const void *const *grad,
                             void *const *m, void *const *v, const int64_t *n, int64_t step,
                             k3rt_error *err)
{
    if (step < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: step must be >= 1, got %lld",
                         (long long)step);
    if (count < 0 || (count > 0 && (!param || !grad || !m || !v || !n)))
        return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: %lld tensors without the "
                         "pointer and length arrays", (long long)count);
    for (int64_t i = 0; i < count; i++) {
        if (n[i] < 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: tensor %lld has "
                             "negative length %lld", (long long)i, (long long)n[i]);
        if (n[i] > 0 && (!param[i] || !grad[i] || !m[i] || !v[i]))
            return k3rt_fail(err, K3RT_ERR_INVALID, "adamw_step_multi: tensor %lld of %lld "
                             "elements has a NULL %s pointer", (long long)i, (long long)n[i],
                             !param[i] ? "param" : !grad[i] ? "grad" : !m[i] ? "m" : "v");
    }
    return K3RT_OK;
}

int k3rt_adamw_step_multi(k3rt_stream *s, int dtype, int64_t count, void *const *param,
                          const void *const *grad, void *const *m, void *const *v,
                          const int64_t *n, const double *weight_decay, double lr, double beta1,
                          double beta2, double eps, int64_t step, k3rt_error *err)
{
    K3RT_TRY(check_adamw_multi(count, param, grad, m, v, n, step, err));
    OPS_ON_CUDA(s, "adamw_step_multi",
                cuda_adamw_step_multi(s, dtype, count, param, grad, m, v, n, weight_decay, lr,
                                      beta1, beta2, eps, step, err));
#define CALL(S, R, NT)                                                                      \
    for (int64_t i = 0; i < count; i++)                                                     \
        cpu_adamw_##S((R *)param[i], (const R *)grad[i], (R *)m[i], (R *)v[i], n[i], lr,     \
                      beta1, beta2, eps, weight_decay ? weight_decay[i] : 0.0, step, NT)
    OPS_DISPATCH(s, dtype, "adamw_step_multi", CALL);
#undef CALL
}
