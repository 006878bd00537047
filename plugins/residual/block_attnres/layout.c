/* block_attnres: the block schedule and where everything lives in saved and workspace. */
#include "attnres.h"

static int64_t align64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }

static int64_t elem(const attnres *r) { return (int64_t)k3rt_dtype_size(r->dtype); }

int attnres_closed(const attnres *r, int s) { return s <= 0 ? 0 : (s - 1) / r->kb + 1; }

int attnres_sources(const attnres *r, int s) { return s <= 0 ? 1 : attnres_closed(r, s) + 1; }

int attnres_opens(const attnres *r, int s) { return s >= 0 && s < r->S && s % r->kb == 0; }

int64_t attnres_op_bytes(const attnres *r, int64_t N, int s)
{
    if (s <= 0)
        return 0;
    return align64(N * attnres_sources(r, s) * elem(r)) + 2 * align64(N * elem(r));
}

void attnres_layout_make(const attnres *r, int64_t N, attnres_layout *l)
{
    int64_t e = elem(r);
    l->N = N;
    l->row = align64(N * r->d * e);
    l->src = 0;
    l->partial = l->src + r->nb * l->row;
    l->dsrc = l->partial + l->row;
    l->dpartial = l->dsrc + r->nb * l->row;
    l->ops = l->dpartial + l->row;
    l->saved_bytes = l->ops;
    for (int s = 1; s <= r->S; s++)
        l->saved_bytes += attnres_op_bytes(r, N, s);
    int64_t scratch = align64(N * (r->nb + 1) * e);
    l->ws_q = 0;
    l->ws_dq = align64(r->d * e);
    l->ws_a = 2 * l->ws_dq;
    l->ws_c = l->ws_a + scratch;
    l->ws_row = l->ws_c + scratch;
    l->workspace_bytes = l->ws_row + l->row;
}

void attnres_op_offsets(const attnres *r, const attnres_layout *l, int s, int64_t *alpha,
                        int64_t *rho, int64_t *z)
{
    int64_t off = l->ops;
    for (int j = 1; j < s; j++)
        off += attnres_op_bytes(r, l->N, j);
    *alpha = off;
    *rho = off + align64(l->N * attnres_sources(r, s) * elem(r));
    *z = *rho + align64(l->N * elem(r));
}
