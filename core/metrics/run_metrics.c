/* metrics.jsonl read back as columns (run_metrics.h). */
#include "metrics/run_metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"

static double number_or_nan(const json_t *v)
{
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int grow(void **p, size_t elem, int cap)
{
    void *q = realloc(*p, (size_t)cap * elem);
    if (!q)
        return K3RT_ERR_NOMEM;
    *p = q;
    return K3RT_OK;
}

static int reserve(run_metrics *m, int *cap)
{
    if (m->n < *cap)
        return K3RT_OK;
    int c = *cap ? 2 * *cap : 64;
    if (grow((void **)&m->step, sizeof *m->step, c) ||
        grow((void **)&m->tokens, sizeof(double), c) ||
        grow((void **)&m->flops, sizeof(double), c) ||
        grow((void **)&m->train_loss, sizeof(double), c) ||
        grow((void **)&m->val_loss, sizeof(double), c) ||
        grow((void **)&m->tokens_per_s, sizeof(double), c) ||
        grow((void **)&m->mfu, sizeof(double), c) ||
        grow((void **)&m->maxvio_worst, sizeof(double), c) ||
        (m->n_moe && grow((void **)&m->maxvio, sizeof(double) * (size_t)m->n_moe, c)))
        return K3RT_ERR_NOMEM;
    *cap = c;
    return K3RT_OK;
}

/* The MoE layers come from the first record that has them (every record of a run holds the
 * same layers); a later record naming a new one is ignored rather than reshaping the table. */
static int moe_layers(run_metrics *m, const json_t *moe, int cap)
{
    const char *key;
    const json_t *v;
    int n = 0;
    json_object_foreach((json_t *)moe, key, v)
        n += !strncmp(key, "layers.", 7);
    if (!n)
        return K3RT_OK;
    m->moe_layer = malloc((size_t)n * sizeof *m->moe_layer);
    m->maxvio = malloc((size_t)n * (size_t)(cap ? cap : 1) * sizeof *m->maxvio);
    if (!m->moe_layer || !m->maxvio)
        return K3RT_ERR_NOMEM;
    json_object_foreach((json_t *)moe, key, v)
        if (!strncmp(key, "layers.", 7)) {
            int layer = atoi(key + 7), k = m->n_moe++;
            while (k > 0 && m->moe_layer[k - 1] > layer) {
                m->moe_layer[k] = m->moe_layer[k - 1];
                k--;
            }
            m->moe_layer[k] = layer;
        }
    for (int i = 0; i < m->n * m->n_moe; i++)
        m->maxvio[i] = NAN;
    return K3RT_OK;
}

static int add_record(run_metrics *m, const json_t *rec, int *cap)
{
    const json_t *moe = json_object_get(rec, "moe");
    if (json_is_object(moe) && !m->n_moe)
        K3RT_TRY(moe_layers(m, moe, *cap));
    K3RT_TRY(reserve(m, cap));
    int i = m->n++;
    m->step[i] = json_integer_value(json_object_get(rec, "step"));
    m->tokens[i] = number_or_nan(json_object_get(rec, "tokens"));
    m->flops[i] = number_or_nan(json_object_get(rec, "flops"));
    /* the trainer writes -1 for a mean that was not finite */
    double tl = number_or_nan(json_object_get(rec, "train_loss_mean"));
    m->train_loss[i] = tl >= 0 ? tl : NAN;
    m->val_loss[i] = number_or_nan(json_object_get(rec, "val_loss"));
    m->tokens_per_s[i] = number_or_nan(json_object_get(rec, "tokens_per_s"));
    m->mfu[i] = number_or_nan(json_object_get(rec, "mfu"));
    m->maxvio_worst[i] = number_or_nan(json_object_get(rec, "maxvio_worst"));
    for (int k = 0; k < m->n_moe; k++) {
        char key[32];
        snprintf(key, sizeof key, "layers.%d", m->moe_layer[k]);
        m->maxvio[(size_t)i * (size_t)m->n_moe + (size_t)k] =
            number_or_nan(json_object_get(json_object_get(moe, key), "maxvio"));
    }
    return K3RT_OK;
}

int run_metrics_read(const char *dir, run_metrics *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    fs_join(path, sizeof path, dir, "metrics.jsonl");
    FILE *f = fopen(path, "rb");
    if (!f)
        return k3rt_fail(err, errno == ENOENT ? K3RT_ERR_NOT_FOUND : K3RT_ERR_IO, "%s: %s",
                         path, strerror(errno));
    char *line = NULL;
    size_t len = 0;
    int cap = 0, rc = K3RT_OK;
    while (!rc && getline(&line, &len, f) >= 0) {
        json_t *rec = json_loads(line, 0, NULL);
        if (json_is_object(rec) && json_is_number(json_object_get(rec, "tokens")))
            rc = add_record(out, rec, &cap);
        json_decref(rec);
    }
    free(line);
    fclose(f);
    if (rc) {
        run_metrics_free(out);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    }
    return K3RT_OK;
}

void run_metrics_free(run_metrics *m)
{
    free(m->step);
    free(m->tokens);
    free(m->flops);
    free(m->train_loss);
    free(m->val_loss);
    free(m->tokens_per_s);
    free(m->mfu);
    free(m->maxvio_worst);
    free(m->moe_layer);
    free(m->maxvio);
    memset(m, 0, sizeof *m);
}
