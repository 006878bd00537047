/* block_attnres: the block schedule and where everything lives in saved and workspace. */
#include "attnres.h"

static int64_t align64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

static int64_t elem(const attnres *r) { return (int64_t)k3rt_dtype_size(r->dtype); }

static int64_t acc_elem(const attnres *r) { return (int64_t)k3rt_dtype_size(r->acc); }

static int on_cuda(const attnres *r) { return r->device != K3RT_DEVICE_CPU; }

int attnres_closed(const attnres *r, int s) { return s <= 0 ? 0 : (s - 1) / r->kb + 1; }

int attnres_sources(const attnres *r, int s) { return s <= 0 ? 1 : attnres_closed(r, s) + 1; }

int attnres_opens(const attnres *r, int s) { return s >= 0 && s < r->S && s % r->kb == 0; }

int64_t attnres_op_bytes(const attnres *r, int64_t N, int s)
{
    if (s <= 0)
        return 0;
    return align64(N * attnres_sources(r, s) * acc_elem(r)) + 2 * align64(N * acc_elem(r));
}

static int64_t cuda_scratch(const attnres *r, int64_t N)
{
#ifdef K3RT_PLUGIN_HAVE_CUDA
    if (on_cuda(r))
        return align64(attnres_cuda_scratch_bytes(N, r->d));
#endif
    (void)r, (void)N;
    return 0;
}

void attnres_layout_make(const attnres *r, int64_t N, attnres_layout *l)
{
    int64_t e = elem(r), ea = acc_elem(r);
    l->N = N;
    l->row = align64(N * r->d * e);
    l->acc_row = align64(N * r->d * ea);
    l->src = 0;
    l->partial = l->src + r->nb * l->row;
    l->dsrc = l->partial + l->row;
    l->dpartial = l->dsrc + r->nb * l->acc_row;
    l->ops = l->dpartial + l->acc_row;
    l->saved_bytes = l->ops;
    for (int s = 1; s <= r->S; s++)
        l->saved_bytes += attnres_op_bytes(r, N, s);
    int64_t row32 = on_cuda(r) ? align64(N * r->d * 4) : 0;
    l->out32 = l->saved_bytes;
    l->saved_bytes += row32;
    int64_t scratch = align64(N * (r->nb + 1) * ea);
    l->ws_q = 0;
    l->ws_dq = align64(r->d * ea);
    l->ws_a = 2 * l->ws_dq;
    l->ws_c = l->ws_a + scratch;
    l->ws_row = l->ws_c + scratch;
    l->ws_dh = l->ws_row + l->row;
    l->ws_h32 = l->ws_dh + l->row;
    l->ws_part = l->ws_h32 + row32;
    l->workspace_bytes = l->ws_part + cuda_scratch(r, N);
}

void attnres_op_offsets(const attnres *r, const attnres_layout *l, int s, int64_t *alpha,
                        int64_t *rho, int64_t *z)
{
    int64_t off = l->ops;
    for (int j = 1; j < s; j++)
        off += attnres_op_bytes(r, l->N, j);
    *alpha = off;
    *rho = off + align64(l->N * attnres_sources(r, s) * acc_elem(r));
    *z = *rho + align64(l->N * acc_elem(r));
}
