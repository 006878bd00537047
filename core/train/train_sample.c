/* Text generation from a model with the byte tokenizer: temperature and top-k sampling, by
 * incremental decoding when every token mixer has a cache (the context is then the whole
 * text), else over a sliding context of at most seq_len bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_internal.h"
#include "util/log.h"

typedef struct sample_opts {
    double temperature;
    int64_t top_k;
} sample_opts;

int32_t sample_draw(double *logits, int64_t V, double temperature, int64_t top_k, k3rt_rng *rng)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (temperature <= 0)
        return (int32_t)best;
    double cutoff = -INFINITY;
    if (top_k > 0 && top_k < V) {
        /* The k-th largest value, by repeated selection (V is small for byte models). */
        double *copy = malloc((size_t)V * sizeof *copy);
        if (copy) {
            memcpy(copy, logits, (size_t)V * sizeof *copy);
            for (int64_t k = 0; k < top_k; k++) {
                int64_t arg = k;
                for (int64_t v = k + 1; v < V; v++)
                    if (copy[v] > copy[arg])
                        arg = v;
                double t = copy[k];
                copy[k] = copy[arg];
                copy[arg] = t;
            }
            cutoff = copy[top_k - 1];
            free(copy);
        }
    }
    double total = 0, top = logits[best];
    for (int64_t v = 0; v < V; v++) {
        logits[v] = logits[v] >= cutoff ? exp((logits[v] - top) / temperature) : 0.0;
        total += logits[v];
    }
    double u = k3rt_rng_uniform(rng) * total;
    for (int64_t v = 0; v < V; v++) {
        u -= logits[v];
        if (u <= 0 && logits[v] > 0)
            return (int32_t)v;
    }
    return (int32_t)best;
}

/* The sliding-context path: every byte runs the model over the last seq_len bytes (for
 * models with a mixer that cannot decode incrementally, and on request). */
static int sample_recompute(model *m, int64_t seq_len, char *text, size_t *len, int64_t n,
                            double *logits, const sample_opts *o, k3rt_rng *rng,
                            k3rt_error *err)
{
    K3RT_TRY(model_set_shape(m, 1, seq_len, err));
    int32_t *ctx = calloc((size_t)seq_len, sizeof *ctx);
    if (!ctx)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "sample: out of memory");
    int rc = K3RT_OK;
    for (int64_t i = 0; i < n && !rc; i++) {
        int64_t take = (int64_t)*len < seq_len ? (int64_t)*len : seq_len;
        for (int64_t t = 0; t < seq_len; t++)
            ctx[t] = t < take ? (unsigned char)text[*len - (size_t)take + (size_t)t] : 0;
        rc = model_logits_at(m, ctx, take - 1, logits, err);
        if (!rc)
            text[(*len)++] = (char)sample_draw(logits, m->vocab, o->temperature, o->top_k, rng);
    }
    free(ctx);
    return rc;
}

/* The cached path, after model_decode_begin: the prompt, then each drawn byte, fed one token
 * at a time; the context is the whole text, however long (model.h: model_decode_*). */
static int sample_cached(model *m, char *text, size_t *len, int64_t n, double *logits,
                         const sample_opts *o, k3rt_rng *rng, k3rt_error *err)
{
    int rc = K3RT_OK;
    for (size_t i = 0; i < *len && !rc; i++) {
        int32_t tok = (unsigned char)text[i];
        rc = model_decode_step(m, &tok, i + 1 == *len ? logits : NULL, err);
    }
    for (int64_t i = 0; i < n && !rc; i++) {
        int32_t tok = sample_draw(logits, m->vocab, o->temperature, o->top_k, rng);
        text[(*len)++] = (char)tok;
        if (i + 1 < n)
            rc = model_decode_step(m, &tok, logits, err);
    }
    model_decode_end(m);
    return rc;
}

int sample_text(model *m, int64_t seq_len, const json_t *cfg, char **out, sample_stats *st,
                k3rt_error *err)
{
    sample_opts o;
    int64_t n = json_integer_value(json_object_get(cfg, "bytes"));
    o.temperature = json_number_value(json_object_get(cfg, "temperature"));
    o.top_k = json_integer_value(json_object_get(cfg, "top_k"));
    const char *prompt = json_string_value(json_object_get(cfg, "prompt"));
    uint64_t seed = (uint64_t)json_integer_value(json_object_get(cfg, "seed"));
    int recompute = json_is_true(json_object_get(cfg, "recompute"));
    if (!prompt || !*prompt)
        prompt = "\n";
    if (m->vocab < 256)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "sample: text sampling needs the byte "
                         "tokenizer (vocab >= 256), this model has vocab %lld",
                         (long long)m->vocab);
    if (n < 1)
        n = 1;
    size_t plen = strlen(prompt);
    char *text = malloc(plen + (size_t)n + 1);
    double *logits = malloc((size_t)m->vocab * sizeof *logits);
    if (!text || !logits) {
        free(text), free(logits);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "sample: out of memory");
    }
    memcpy(text, prompt, plen);
    size_t len = plen;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0x5a3b1eull);
    sample_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.cached = !recompute && model_can_decode(m, stats.why, sizeof stats.why);
    if (recompute)
        snprintf(stats.why, sizeof stats.why, "asked for");
    double t0 = k3rt_time_now();
    int rc = stats.cached ? model_decode_begin(m, 1, (int64_t)plen + n, err) : K3RT_OK;
    if (!rc)
        rc = stats.cached ? sample_cached(m, text, &len, n, logits, &o, &rng, err)
                          : sample_recompute(m, seq_len, text, &len, n, logits, &o, &rng, err);
    stats.seconds = k3rt_time_now() - t0;
    stats.tokens = (int64_t)(len - plen);
    stats.context = (int64_t)len;
    text[len] = '\0';
    free(logits);
    if (rc) {
        free(text);
        return rc;
    }
    /* The prompt is context, not output. */
    memmove(text, text + plen, len - plen + 1);
    *out = text;
    if (st)
        *st = stats;
    return K3RT_OK;
}

/* ---- how much of a sample is made of real words ------------------------------------------- */

typedef struct word_set {
    const char **word;   /* pointers into the corpus */
    uint32_t *len;
    uint64_t cap;
} word_set;

static uint64_t word_hash(const char *w, uint32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)w[i]) * 0x100000001b3ull;
    return h;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Finds (insert = 0) or adds (insert = 1) a word; returns whether it was present. */
static int word_set_probe(word_set *s, const char *w, uint32_t n, int insert)
{
    for (uint64_t i = word_hash(w, n) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (!s->word[i]) {
            if (insert) {
                s->word[i] = w;
                s->len[i] = n;
            }
            return 0;
        }
        if (s->len[i] == n && !memcmp(s->word[i], w, n))
            return 1;
    }
}

int sample_word_coverage(const char *corpus, int64_t n, const char *text, double *fraction,
                         int64_t *words, k3rt_error *err)
{
    word_set s = {0};
    s.cap = 1;
    while (s.cap < (uint64_t)n / 2 + 1024)  /* far more slots than distinct words */
        s.cap <<= 1;
    s.word = calloc(s.cap, sizeof *s.word);
    s.len = calloc(s.cap, sizeof *s.len);
    if (!s.word || !s.len) {
        free(s.word), free(s.len);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n;) {
        while (i < n && is_space(corpus[i]))
            i++;
        int64_t j = i;
        while (j < n && !is_space(corpus[j]))
            j++;
        if (j > i)
            word_set_probe(&s, corpus + i, (uint32_t)(j - i), 1);
        i = j;
    }
    int64_t total = 0, found = 0, m = (int64_t)strlen(text);
    for (int64_t i = 0; i < m;) {
        while (i < m && is_space(text[i]))
            i++;
        int64_t j = i;
        while (j < m && !is_space(text[j]))
            j++;
        if (j > i) {
            total++;
            found += word_set_probe(&s, text + i, (uint32_t)(j - i), 0);
        }
        i = j;
    }
    free(s.word);
    free(s.len);
    *words = total;
    *fraction = total ? (double)found / (double)total : 0.0;
    return K3RT_OK;
}
