/* standard: the pre-norm residual stream h_{s+1} = h_s + sublayer_s(norm(h_s)). */
#ifndef STANDARD_RESIDUAL_H
#define STANDARD_RESIDUAL_H

#include <k3rt/k3rt.h>

typedef struct standard_residual {
    int dtype;      /* f32 or f64 on the CPU, f32 or bf16 on CUDA: the stream's dtype */
    int device;     /* K3RT_DEVICE_CPU or a CUDA ordinal */
    int64_t d;
    int32_t n_layers;
} standard_residual;

/* Bytes of one [B, T, d] activation; saved holds two (h and dh). */
int64_t standard_activation_bytes(const standard_residual *r, int64_t batch, int64_t seq);

int standard_begin(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_mix(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_push(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_finish(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_finish_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_push_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_mix_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_begin_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_mix_norm(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_mix_norm_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_op_forward(void *self, const k3rt_residual_args *a, k3rt_error *err);
int standard_op_backward(void *self, const k3rt_residual_args *a, k3rt_error *err);

#endif
