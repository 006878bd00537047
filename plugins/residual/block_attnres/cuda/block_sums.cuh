// K per-thread values summed over a thread block in a fixed order (the same bits on every run),
// for the AttnRes kernels (attnres.cu), which reduce every source of a chunk at once.
//
// Within a warp the K values are reduce-scattered rather than each all-reduced: at each of the
// five butterfly steps a lane keeps half of its values and sends the other half to its partner,
// so the warp spends about K shuffles instead of 5K (18 values: 20 shuffles, not 90). What a
// lane ends holding it stores at red[warp][index]; after one barrier, total(k) adds the warps'
// partials in warp order.
#ifndef BLOCK_ATTNRES_BLOCK_SUMS_CUH
#define BLOCK_ATTNRES_BLOCK_SUMS_CUH

namespace attnres {

// Values a lane holds after the steps with offsets O, O/2, ..., 1, starting from C.
__host__ __device__ constexpr int scatter_left(int c, int o) { return o == 0 ? c : scatter_left((c + 1) / 2, o / 2); }

// One step at offset O over C values: the lower lane of a pair keeps the first ceil(C/2), the
// upper the rest (padded with a zero). `base` and `cnt` track which indices the lane holds.
template <int C, int O> struct Scatter {
    static __device__ __forceinline__ void run(float *x, int lane, int &base, int &cnt)
    {
        if constexpr (O > 0) {
            if constexpr (C == 1) {
                x[0] += __shfl_xor_sync(0xffffffffu, x[0], O);
            } else {
                constexpr int H = (C + 1) / 2;
                const bool up = (lane & O) != 0;
#pragma unroll
                for (int j = 0; j < H; j++) {
                    const float lo = x[j], hi = H + j < C ? x[H + j < C ? H + j : 0] : 0.0f;
                    x[j] = (up ? hi : lo) + __shfl_xor_sync(0xffffffffu, up ? lo : hi, O);
                }
                if (up)
                    base += H, cnt = cnt > H ? cnt - H : 0;
                else
                    cnt = cnt < H ? cnt : H;
            }
            Scatter<C == 1 ? 1 : (C + 1) / 2, O / 2>::run(x, lane, base, cnt);
        }
    }
};

// buf: 2 * 32 * KMAX shared floats in two halves that successive reductions alternate, so one
// barrier per reduction suffices: a half is written again only after the next reduction's
// barrier, which every thread passes after its reads of the half.
template <int KMAX> struct BlockSums {
    float *buf;
    int ph = 0, k = 0;

    // Sums x[0..K) (destroyed) over the block; then total(j) is the block's sum of value j.
    template <int K> __device__ __forceinline__ void reduce(float *x)
    {
        static_assert(K <= KMAX, "BlockSums: more values than the buffer holds");
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        int base = 0, cnt = K;
        Scatter<K, 16>::run(x, lane, base, cnt);
        ph ^= 1, k = K;
        float *dst = buf + ph * 32 * KMAX + w * K + base;
        constexpr int left = scatter_left(K, 16);
#pragma unroll
        for (int j = 0; j < left; j++)
            if (j < cnt)
                dst[j] = x[j];
        __syncthreads();
    }

    __device__ __forceinline__ float total(int j) const
    {
        const int nw = blockDim.x >> 5;
        const float *src = buf + ph * 32 * KMAX + j;
        float s = 0.0f;
        for (int i = 0; i < nw; i++)
            s += src[i * k];
        return s;
    }
};

}  // namespace attnres

#endif
