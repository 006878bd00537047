/* dense_glu: a dense GLU feed-forward layer, y = down(glu(gate(x), up(x))). Shared by the
 * descriptor side (plugin.c) and the compute side (ffn.c). */
#ifndef DENSE_GLU_H
#define DENSE_GLU_H

#include <k3rt/k3rt.h>

enum { GLU_GATE = 0, GLU_UP = 1, GLU_DOWN = 2, GLU_N_PARAMS = 3 };
/* The saved parts, in declaration order (plugin.c glu_saved). */
enum { GLU_SAVED_G = 0, GLU_SAVED_U = 1, GLU_SAVED_A = 2, GLU_SAVED_N = 3 };

typedef struct dense_glu {
    int dtype;          /* compute dtype: f32 or f64 on the CPU, f32 or bf16 on CUDA */
    int device;         /* K3RT_DEVICE_CPU or a CUDA ordinal */
    int64_t d, hidden;
    int glu;            /* k3rt_glu */
    double beta1, beta2;
    double init_std, down_std;
} dense_glu;

/* Bytes of one [B*T, hidden] buffer, rounded up to 256 so that the three buffers in saved and
 * in workspace all start aligned for vector loads and cuBLASLt. */
int64_t dense_glu_hidden_bytes(const dense_glu *f, int64_t batch, int64_t seq);

int dense_glu_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err);
int dense_glu_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err);

#endif
