/* Newton-Schulz orthogonalisation, written once over REAL and included by cpu.c (float,
 * double) with REAL, DTYPE and SUF(name) defined.
 *
 *   X = G / (||G||_F + 1e-7)                      singular values now in [0, 1]
 *   repeat `steps` times:                         (a, b, c) = (3.4445, -4.7750, 2.0315)
 *       wide (R <= C):  S = X X^T   (R x R)     X = a X + (b S + c S S) X
 *       tall (R >  C):  S = X^T X   (C x C)     X = a X + X (b S + c S S)
 *
 * Each step maps every singular value x to p(x) = a x + b x^3 + c x^5 and keeps the singular
 * vectors, so the result is U p^steps(sigma / ||G||_F) V^T: with 5 steps the values that start
 * at >= 2e-3 land in [0.68, 1.21] (not at 1: Keller's coefficients trade exactness for a steep
 * slope at 0), smaller ones are lifted less. The Gram matrix is taken on the small side, so one
 * step costs 4 m^2 n + 2 m^3 FLOPs for m = min(R, C), n = max(R, C).
 *
 * bf16 (ns_precision = "bf16" on the CPU, for tests): every stored result (the normalised X, S,
 * P, X') is rounded to bf16, the products accumulating in REAL and b S, a X entering unrounded
 * as the products' addends. This is what the CUDA path does on the tensor cores (bf16 operands,
 * fp32 accumulation and epilogue, bf16 store after each product), so the device can be checked
 * against it (ERRATA: PyTorch's CPU bf16 matmul rounds differently and is no reference). */
#include <math.h>
#include <string.h>

#include "muon.h"

/* x rounded to bf16 in place (through f32, as the device's fp32 accumulator is). */
static void SUF(round_bf16)(REAL *x, int64_t n, int on)
{
    if (on)
        for (int64_t i = 0; i < n; i++)
            x[i] = (REAL)k3rt_bf16_to_f32(k3rt_f32_to_bf16((float)x[i]));
}

int SUF(muon_newton_schulz)(k3rt_stream *s, REAL *x, REAL *y, REAL *sq, REAL *p, int64_t rows,
                            int64_t cols, int steps, int bf16, k3rt_error *err)
{
    const int64_t n = rows * cols, m = rows <= cols ? rows : cols;
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    const REAL inv = (REAL)(1.0 / (sqrt(ss) + MUON_NS_EPS));
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
    SUF(round_bf16)(x, n, bf16);
    const REAL a = (REAL)MUON_NS_A, b = (REAL)MUON_NS_B;
    REAL *cur = x, *next = y;
    for (int it = 0; it < steps; it++) {
        if (rows <= cols)  /* S = X X^T */
            K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 1, m, m, cols, 1.0, cur, cols, cur, cols, 0.0, sq, m,
                               err));
        else               /* S = X^T X */
            K3RT_TRY(k3rt_gemm(s, DTYPE, 1, 0, m, m, rows, 1.0, cur, cols, cur, cols, 0.0, sq, m,
                               err));
        SUF(round_bf16)(sq, m * m, bf16);
        /* P = b S + c S S */
        for (int64_t i = 0; i < m * m; i++)
            p[i] = b * sq[i];
        K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 0, m, m, m, MUON_NS_C, sq, m, sq, m, 1.0, p, m, err));
        SUF(round_bf16)(p, m * m, bf16);
        /* X' = a X + P X (wide) or a X + X P (tall; P is symmetric) */
        for (int64_t i = 0; i < n; i++)
            next[i] = a * cur[i];
        if (rows <= cols)
            K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 0, rows, cols, rows, 1.0, p, m, cur, cols, 1.0, next,
                               cols, err));
        else
            K3RT_TRY(k3rt_gemm(s, DTYPE, 0, 0, rows, cols, cols, 1.0, cur, cols, p, m, 1.0, next,
                               cols, err));
        SUF(round_bf16)(next, n, bf16);
        REAL *t = cur;
        cur = next;
        next = t;
    }
    if (cur != x)
        memcpy(x, cur, (size_t)n * sizeof(REAL));
    return K3RT_OK;
}
