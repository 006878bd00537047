/* Incremental decoding (model.h): every token mixer keeps a cache across steps (rig_cache),
 * the rest of the layer stack runs on the new token alone at the shape (B, 1); model_fwd.c's
 * forward hands each mixer's token to its cache while a step runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

int model_can_decode(const model *m, char *why, size_t len)
{
    for (int i = 0; i < m->n_layers; i++) {
        const model_module *mm = &m->mods[m->layers[i].mixer];
        if (!rig_can_decode(&mm->r)) {
            if (why && len)
                snprintf(why, len, "%s has no incremental decoding (decode_step)",
                         mm->r.where);
            return 0;
        }
    }
    return 1;
}

void model_decode_end(model *m)
{
    for (int i = 0; m->decode.caches && i < m->n_layers; i++)
        rig_cache_destroy(&m->mods[m->layers[i].mixer].r, &m->decode.caches[i]);
    free(m->decode.caches);
    memset(&m->decode, 0, sizeof m->decode);
}

int model_decode_begin(model *m, int64_t B, int64_t capacity, k3rt_error *err)
{
    char why[256];
    model_decode_end(m);
    if (!model_can_decode(m, why, sizeof why))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "model: cannot decode incrementally: %s",
                         why);
    /* the shape first: a mixer with only decode() needs its buffers bound at (B, 1) */
    K3RT_TRY(model_set_shape(m, B, 1, err));
    m->decode.caches = calloc((size_t)m->n_layers, sizeof *m->decode.caches);
    if (!m->decode.caches)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "model: out of memory");
    m->decode.B = B;
    for (int i = 0; i < m->n_layers; i++) {
        int rc = rig_cache_create(&m->mods[m->layers[i].mixer].r, B, capacity,
                                  &m->decode.caches[i], err);
        if (rc) {
            model_decode_end(m);
            return rc;
        }
    }
    return K3RT_OK;
}

int model_decode_step(model *m, const int32_t *tokens, double *logits, k3rt_error *err)
{
    if (!m->decode.caches)
        return k3rt_fail(err, K3RT_ERR_INVALID, "model: decode step before model_decode_begin");
    K3RT_TRY(model_set_shape(m, m->decode.B, 1, err));
    m->decode.active = 1;
    int rc = model_forward_body(m, tokens, 0, 0.0, err);
    m->decode.active = 0;
    for (int64_t b = 0; !rc && logits && b < m->decode.B; b++)
        rc = model_row_logits(m, b, logits + b * m->vocab, err);
    if (!rc)
        m->decode.pos++;
    return rc;
}

int64_t model_decode_pos(const model *m) { return m->decode.pos; }
