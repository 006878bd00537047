// The grouped (expert) GEMMs through CUTLASS's sm90 ptr-array kernel: what linear.cu's grouped
// ops hand over, independent of CUTLASS's types (this header compiles without CUTLASS).
#ifndef K3RT_OPS_CUDA_CUTLASS_GROUPED_H
#define K3RT_OPS_CUDA_CUTLASS_GROUPED_H

#include <stdint.h>

#include "ops/cuda/internal.cuh"

// Most groups one launch takes: the host offsets travel in the launch's parameters, and the
// schedule sort runs in one block of this many threads.
#define GG_MAX_GROUPS 1024

enum gg_kind {
    GG_FWD,  // y(rows,out)  = x W_g^T       per group: M = n_g, N = out, K = in
    GG_DX,   // dx(rows,in) (=|+=) dy W_g    per group: M = n_g, N = in,  K = out
    GG_DW    // dW_g(out,in) (+=|=) dy_g^T x_g per group: M = out, N = in, K = n_g (fp32)
};

struct gg_host_offsets {
    int32_t v[GG_MAX_GROUPS + 1];
};

struct gg_call {
    int kind;
    const void *x, *w, *dy;  // bf16 operands (those the kind reads)
    void *out;               // y / dx bf16, dW fp32
    int accumulate;          // dx += / dW += instead of = (dW =: empty groups zeroed)
    // Group boundaries: on the device (offsets_dev, groups + 1 int32, or int64 when
    // offsets_i64) or, when it is null, copied from the host into the launch (host).
    const void *offsets_dev;
    int offsets_i64;
    const gg_host_offsets *host;
    int64_t groups, rows, in, out_features;
};

// Whether the CUTLASS path takes this call: built with CUTLASS, an sm_90 device, bf16 with
// in and out multiples of 8 (16-byte TMA rows) and at most GG_MAX_GROUPS groups.
bool gg_supported(const cuda_stream_ctx *ctx, int dtype, int64_t groups, int64_t in,
                  int64_t out);

// Runs one grouped product on the stream; no host synchronisation.
int gg_run(cuda_stream_ctx *ctx, const gg_call &c, k3rt_error *err);

#endif
