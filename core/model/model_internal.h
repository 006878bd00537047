/* Activation storage of a model for one (B, T) and helpers shared by the model's files. */
#ifndef K3RT_MODEL_INTERNAL_H
#define K3RT_MODEL_INTERNAL_H

#include "model/model.h"

/* N = B*T rows of d; S = 2 * layers sublayers. Host or device memory of the compute dtype. */
typedef struct model_acts {
    int32_t *tokens, *targets;    /* [N] (device) */
    void *h0;                     /* [N, d] embedding output */
    void *hs;                     /* [S, N, d] each sublayer's residual input (pre-norm) */
    void *rstd;                   /* [S, N] its RMSNorm statistics (master dtype) */
    void *xn, *ys;                /* [N, d] normed sublayer input, sublayer output */
    void *hf, *hn, *rstd_f;       /* final hidden, its norm, statistics */
    void *dhn, *dh, *dxn, *dys;   /* gradients [N, d] */
    void *logits, *lse;           /* one head chunk: [chunk, V], [chunk] (master dtype) */
    void *row_loss;               /* [N] (master dtype): summed once per micro-batch, so a GPU
                                     run waits for the host once, not once per chunk */
    int64_t chunk;
    void *saved;                  /* the residual's saved region, then (at managed_offset) the
                                     activation manager's regions (model/actman.h) */
    int64_t managed_offset;
    void *ws;                     /* one workspace, the largest any module asks for */
    k3rt_routing *routing;        /* [layers] */
    float **d_scores;             /* [layers] -> [N, experts] or NULL (no aux loss) */
} model_acts;

void model_free_acts(model *m);
/* Shape/dtype helpers. */
static inline void *model_row(const model *m, void *base, int64_t row)
{
    return (char *)base + row * m->d * (int64_t)m->elem;
}
static inline void *model_sub(const model *m, void *base, int s)
{
    return (char *)base + (int64_t)s * m->B * m->T * m->d * (int64_t)m->elem;
}
static inline k3rt_tensor model_act_tensor(const model *m, void *data)
{
    return k3rt_tensor_view(data, m->opt.dtype, m->opt.device, 3, m->B, m->T, m->d, 0);
}
/* embed -> residual stack -> final norm into hn, over the current shape (model_fwd.c); while
 * m->decode.active, each mixer takes its token through its cache instead of forward. */
int model_forward_body(model *m, const int32_t *tokens, int training, double aux_scale,
                       k3rt_error *err);
/* Logits of row `row` of hn into host doubles (waits for the stream). */
int model_row_logits(model *m, int64_t row, double *logits, k3rt_error *err);

/* The module of sublayer s (2i mixer, 2i+1 FFN) and its pre-norm gain parameter. */
int model_sub_module(const model *m, int s);
int model_sub_norm(const model *m, int s);

#endif
