// Activations, GLUs, axpby, mul and fill on CUDA, through the elementwise kernel. The formulas
// are those of the CPU reference (core/ops/cpu_ops.inc.c), in fp32 with the accurate expf,
// tanhf and log1pf (no fast-math intrinsics), except the SiTU and sigmoid GLUs on bf16 data
// (below).
#include <type_traits>

#include "ops/cuda/elementwise.cuh"

namespace {

__device__ __forceinline__ float sigmoid(float x)
{
    float e = expf(x >= 0.0f ? -x : x);  // branch on the sign so exp never overflows
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

__device__ __forceinline__ float act_value(int act, float x)
{
    switch (act) {
    case K3RT_ACT_SILU: return x * sigmoid(x);
    case K3RT_ACT_SIGMOID: return sigmoid(x);
    case K3RT_ACT_SOFTPLUS: return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
    case K3RT_ACT_TANH: return tanhf(x);
    case K3RT_ACT_RELU: return x > 0.0f ? x : 0.0f;
    default: return x;
    }
}

__device__ __forceinline__ float act_slope(int act, float x)
{
    switch (act) {
    case K3RT_ACT_SILU: {
        float s = sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case K3RT_ACT_SIGMOID: {
        float s = sigmoid(x);
        return s * (1.0f - s);
    }
    case K3RT_ACT_SOFTPLUS: return sigmoid(x);
    case K3RT_ACT_TANH: {
        float t = tanhf(x);
        return 1.0f - t * t;
    }
    case K3RT_ACT_RELU: return x > 0.0f ? 1.0f : 0.0f;
    default: return 1.0f;
    }
}

struct act_fwd_op {
    int act;
    __device__ void operator()(const float *x, float *y) const { y[0] = act_value(act, x[0]); }
};

// in: x, dy [, dx]; out: dx
template <bool ACC> struct act_bwd_op {
    int act;
    __device__ void operator()(const float *in, float *out) const
    {
        float v = in[1] * act_slope(act, in[0]);
        out[0] = ACC ? in[2] + v : v;
    }
};

// The SiTU-GLU's two tanh and a sigmoid per element. With the accurate tanhf, expf and IEEE
// divisions the bf16 passes were bound by arithmetic, not memory: 422 us a forward over
// K3-mini's 201M routed elements on the H200, where the bytes allow about 290 us. On bf16 data
// (8 significant bits, rounding error up to 2^-9 relative) the fast forms below err by at
// most about 2^-11 relative and the passes are bound by memory again; f32 data keeps the
// accurate functions (the tests' 1e-5 against the CPU). The sigmoid GLU (the attention output
// gates) takes the same fast sigmoid on bf16.
//   tanh: the MUFU.TANH instruction (tanh.approx.f32, relative error <= 2^-10.99);
//   the backward's tanh and 1 - tanh^2 from one exp e = e^{-2|x|}: (1 - e)/(1 + e) and
//   4e/(1 + e)^2, so the slope keeps its relative accuracy where tanh saturates (1 - t^2 of
//   an approximate t would not);
//   sigmoid: 1/(1 + e^{-x}) with the fast exp and division (0 or 1 at the ends, no NaN);
//   x / beta as x times 1 / beta.
struct glu_fast {
    __device__ static float over(float x, float b, float rb) { return x * rb; }
    __device__ static float tanh(float x)
    {
        float y;
        asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
        return y;
    }
    __device__ static float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
    // t = tanh(x), s = 1 - tanh(x)^2
    __device__ static void tanh_slope(float x, float *t, float *s)
    {
        float e = __expf(-2.0f * fabsf(x)), r = __fdividef(1.0f, 1.0f + e);
        *t = copysignf((1.0f - e) * r, x);
        *s = 4.0f * e * r * r;
    }
};
struct glu_exact {
    __device__ static float over(float x, float b, float) { return x / b; }
    __device__ static float tanh(float x) { return tanhf(x); }
    __device__ static float sigmoid(float x) { return ::sigmoid(x); }
    __device__ static void tanh_slope(float x, float *t, float *s)
    {
        *t = tanhf(x);
        *s = 1.0f - *t * *t;
    }
};
template <typename T> using glu_math =
    typename std::conditional<std::is_same<T, bf16>::value, glu_fast, glu_exact>::type;

// in: gate, up; out: glu(gate, up)
template <typename M> struct glu_fwd_op {
    int glu;
    float b1, b2, r1, r2;  // r = 1 / b
    __device__ void operator()(const float *in, float *out) const
    {
        float g = in[0], u = in[1];
        if (glu == K3RT_GLU_SITU)
            out[0] = (b1 * M::tanh(M::over(g, b1, r1)) * M::sigmoid(g)) *
                     (b2 * M::tanh(M::over(u, b2, r2)));
        else if (glu == K3RT_GLU_SIGMOID)
            out[0] = M::sigmoid(g) * u;
        else
            out[0] = g * sigmoid(g) * u;
    }
};

// in: gate, up, dout; out: dgate, dup
template <typename M> struct glu_bwd_op {
    int glu;
    float b1, b2, r1, r2;
    __device__ void operator()(const float *in, float *out) const
    {
        float g = in[0], u = in[1], d = in[2];
        if (glu == K3RT_GLU_SITU) {
            float sg = M::sigmoid(g), t1, s1, t2, s2;
            M::tanh_slope(M::over(g, b1, r1), &t1, &s1);
            M::tanh_slope(M::over(u, b2, r2), &t2, &s2);
            float a = b1 * t1 * sg, b = b2 * t2;
            float da = s1 * sg + b1 * t1 * sg * (1.0f - sg);
            out[0] = d * b * da;
            out[1] = d * a * s2;
        } else if (glu == K3RT_GLU_SIGMOID) {
            float sg = M::sigmoid(g);
            out[0] = d * u * sg * (1.0f - sg);
            out[1] = d * sg;
        } else {
            float sg = sigmoid(g);
            out[0] = d * u * sg * (1.0f + g * (1.0f - sg));
            out[1] = d * g * sg;
        }
    }
};

// y = alpha x (beta == 0: y is not read) or alpha x + beta y
struct scale_op {
    float alpha;
    __device__ void operator()(const float *in, float *out) const { out[0] = alpha * in[0]; }
};
struct axpby_op {
    float alpha, beta;
    __device__ void operator()(const float *in, float *out) const
    {
        out[0] = alpha * in[0] + beta * in[1];
    }
};
struct mul_op {
    __device__ void operator()(const float *in, float *out) const { out[0] = in[0] * in[1]; }
};
struct fill_op {
    float value;
    __device__ void operator()(const float *, float *out) const { out[0] = value; }
};

int check(const char *op, int dtype, int64_t n, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    if (n < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: negative length %lld", op, (long long)n);
    return K3RT_OK;
}

// Enters the stream and runs RUN(T) with T the element type of dtype.
#define EW_OP(opname, dtype, n, RUN)                                  \
    do {                                                              \
        K3RT_TRY(check(opname, dtype, n, err));                       \
        if ((n) == 0)                                                 \
            return K3RT_OK;                                           \
        cuda_stream_ctx *ctx;                                         \
        K3RT_TRY(cu_enter(s, &ctx, err));                             \
        if ((dtype) == K3RT_BF16)                                     \
            return RUN(bf16);                                         \
        return RUN(float);                                            \
    } while (0)

}  // namespace

extern "C" int cuda_act_fwd(k3rt_stream *s, int dtype, int act, const void *x, void *y,
                            int64_t n, k3rt_error *err)
{
#define RUN(T)                                                                               \
    ew_launch(ctx, "act_fwd", act_fwd_op{act}, ew_args<T, T, 1, 1>{{(const T *)x}, {(T *)y}}, \
              n, err)
    EW_OP("act_fwd", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_act_bwd(k3rt_stream *s, int dtype, int act, const void *x, const void *dy,
                            void *dx, int64_t n, int accumulate_dx, k3rt_error *err)
{
#define RUN(T)                                                                               \
    (accumulate_dx                                                                           \
         ? ew_launch(ctx, "act_bwd", act_bwd_op<true>{act},                                  \
                     ew_args<T, T, 3, 1>{{(const T *)x, (const T *)dy, (const T *)dx}, {(T *)dx}}, \
                     n, err)                                                                 \
         : ew_launch(ctx, "act_bwd", act_bwd_op<false>{act},                                 \
                     ew_args<T, T, 2, 1>{{(const T *)x, (const T *)dy}, {(T *)dx}}, n, err))
    EW_OP("act_bwd", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_glu_fwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                            void *out, int64_t n, double beta1, double beta2, k3rt_error *err)
{
    float b1 = (float)beta1, b2 = (float)beta2;  // unused by SwiGLU (0: r = inf)
#define RUN(T)                                                                             \
    ew_launch(ctx, "glu_fwd", glu_fwd_op<glu_math<T>>{glu, b1, b2, 1.0f / b1, 1.0f / b2}, \
              ew_args<T, T, 2, 1>{{(const T *)gate, (const T *)up}, {(T *)out}}, n, err)
    EW_OP("glu_fwd", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_glu_bwd(k3rt_stream *s, int dtype, int glu, const void *gate, const void *up,
                            const void *dout, void *dgate, void *dup, int64_t n, double beta1,
                            double beta2, k3rt_error *err)
{
    float b1 = (float)beta1, b2 = (float)beta2;
#define RUN(T)                                                                                 \
    ew_launch(ctx, "glu_bwd", glu_bwd_op<glu_math<T>>{glu, b1, b2, 1.0f / b1, 1.0f / b2},     \
              ew_args<T, T, 3, 2>{{(const T *)gate, (const T *)up, (const T *)dout},           \
                                  {(T *)dgate, (T *)dup}},                                     \
              n, err)
    EW_OP("glu_bwd", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_axpby(k3rt_stream *s, int dtype, int64_t n, double alpha, const void *x,
                          double beta, void *y, k3rt_error *err)
{
#define RUN(T)                                                                                 \
    (beta == 0.0 ? ew_launch(ctx, "axpby", scale_op{(float)alpha},                             \
                             ew_args<T, T, 1, 1>{{(const T *)x}, {(T *)y}}, n, err)            \
                 : ew_launch(ctx, "axpby", axpby_op{(float)alpha, (float)beta},                \
                             ew_args<T, T, 2, 1>{{(const T *)x, (const T *)y}, {(T *)y}}, n, err))
    EW_OP("axpby", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_mul(k3rt_stream *s, int dtype, int64_t n, const void *a, const void *b,
                        void *out, k3rt_error *err)
{
#define RUN(T)                                                                               \
    ew_launch(ctx, "mul", mul_op{},                                                          \
              ew_args<T, T, 2, 1>{{(const T *)a, (const T *)b}, {(T *)out}}, n, err)
    EW_OP("mul", dtype, n, RUN);
#undef RUN
}

extern "C" int cuda_fill(k3rt_stream *s, int dtype, void *x, int64_t n, double value,
                         k3rt_error *err)
{
#define RUN(T)                                                                               \
    ew_launch(ctx, "fill", fill_op{(float)value}, ew_args<T, T, 0, 1>{{nullptr}, {(T *)x}}, n, \
              err)
    EW_OP("fill", dtype, n, RUN);
#undef RUN
}
