/* `k3rt eval CHECKPOINT --grads FILE`: one training forward and backward of a checkpoint's
 * model on the micro-batch its next step would train on (rank 0, micro-batch 0), written as
 * safetensors for comparisons with other implementations (scripts/bench/torch_k3.py):
 * the batch, the loss, every parameter's gradient and every routed layer's expert choice.
 * The balancers' state is the checkpoint's, so the routing is the one the step would use. */
#include <stdio.h>
#include <stdlib.h>

#include "model/model_internal.h"
#include "train/ckpt_model.h"
#include "train/safetensors.h"
#include "train/train_internal.h"

/* The names of the entries: "grad.<param>" and "routing.layers.<i>.selected". */
typedef struct dump_names {
    char (*name)[200];
    int n;
} dump_names;

/* Fills e (3 + parameters + routed layers entries) and *n; gradients and expert choices on a
 * GPU are copied to the host (into owned[], one per entry, which the caller frees). */
static int build_entries(model *m, const int32_t *in, const int32_t *tg, const double *loss,
                         st_entry *e, dump_names *nm, void **owned, int *n, k3rt_error *err)
{
    *n = 0;
    st_entry tok = {"tokens", K3RT_I32, 2, {m->B, m->T}, in};
    st_entry tgt = {"targets", K3RT_I32, 2, {m->B, m->T}, tg};
    st_entry lo = {"loss", K3RT_F64, 1, {2}, loss};  /* {token loss, auxiliary loss} */
    e[(*n)++] = tok, e[(*n)++] = tgt, e[(*n)++] = lo;
    for (int i = 0; i < m->n_params; i++) {
        snprintf(nm->name[nm->n], sizeof nm->name[0], "grad.%s", m->params[i].name);
        e[*n].name = nm->name[nm->n++];
        K3RT_TRY(ckpt_entry_data(&e[*n], &m->params[i].grad, m->opt.stream, &owned[*n], err));
        ++*n;
    }
    for (int i = 0; i < m->n_layers; i++) {
        const k3rt_routing *r = &m->a->routing[i];
        if (!model_balancer(m, i) || r->selected.ndim != 2)
            continue;
        snprintf(nm->name[nm->n], sizeof nm->name[0], "routing.layers.%d.selected", i);
        e[*n].name = nm->name[nm->n++];
        K3RT_TRY(ckpt_entry_data(&e[*n], &r->selected, m->opt.stream, &owned[*n], err));
        ++*n;
    }
    return K3RT_OK;
}

int grad_dump(ckpt_model *c, const token_stream *train, const char *path, k3rt_error *err)
{
    model *m = &c->m;
    const json_t *plan = json_object_get(c->doc, "plan");
    const json_t *tr = json_object_get(c->doc, "train");
    int64_t B = json_integer_value(json_object_get(plan, "micro_batch"));
    int64_t T = json_integer_value(json_object_get(plan, "seq_len"));
    int64_t accum = json_integer_value(json_object_get(plan, "grad_accum"));
    int64_t dp = json_integer_value(json_object_get(plan, "dp"));
    int64_t step = json_integer_value(json_object_get(c->manifest, "step"));
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(tr, "seed"));
    int64_t N = B * T;
    K3RT_TRY(model_set_shape(m, B, T, err));
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    int cap = 3 + m->n_params + m->n_layers;
    st_entry *e = calloc((size_t)cap, sizeof *e);
    dump_names nm = {calloc((size_t)cap, sizeof *nm.name), 0};
    void **owned = calloc((size_t)cap, sizeof *owned);
    int rc = in && tg && e && nm.name && owned ? K3RT_OK
                                      : k3rt_fail(err, K3RT_ERR_NOMEM, "eval --grads: out of memory");
    /* the index train_loop.c gives step + 1's first micro-batch on rank 0 */
    if (!rc)
        rc = data_batch(train, seed, step * (accum > 0 ? accum : 1) * (dp > 0 ? dp : 1), B, T,
                        in, tg, err);
    double loss[2] = {0, 0};
    if (!rc) {
        model_zero_grads(m);
        model_reset_routed(m);
        rc = model_train_step(m, in, tg, 1.0 / (double)N, 1.0, &loss[0], err);
        /* on a GPU the auxiliary loss is staged on the device until flushed, and an
         * out-of-range token is recorded there rather than trapped (as train_loop.c reads them) */
        if (!rc)
            rc = model_flush_routed(m, err);
        if (!rc)
            rc = k3rt_stream_index_error(c->stream, err);
        loss[0] /= (double)N;
        loss[1] = m->aux_loss;
    }
    int n = 0;
    if (!rc)
        rc = build_entries(m, in, tg, loss, e, &nm, owned, &n, err);
    if (!rc)
        rc = st_write(path, e, n, NULL, err);
    for (int i = 0; owned && i < cap; i++)
        free(owned[i]);
    free(owned);
    if (!rc)
        printf("%s: step %lld's first micro-batch (%lld x %lld): loss %.9g, %d gradients -> %s\n",
               c->dir, (long long)step + 1, (long long)B, (long long)T, loss[0], m->n_params,
               path);
    free(in), free(tg), free(e), free(nm.name);
    return rc;
}
