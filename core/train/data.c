/* Training data: byte-tokenised text and llm.c token shards (data.h). */
#include "train/data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/fs.h"

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_MAGIC_U16 20240520
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U16 1
#define SHARD_VERSION_U32 7
#define SHARD_HINT "wrong file, or not a token shard? (llm.c's data preparation scripts " \
                   "write them; for plain text use the byte tokenizer)"

void token_stream_free(token_stream *s)
{
    if (!s)
        return;
    free(s->tokens);
    free(s->doc_starts);
    memset(s, 0, sizeof *s);
}

static int stream_alloc(token_stream *s, int64_t n, const char *path, k3rt_error *err)
{
    memset(s, 0, sizeof *s);
    s->tokens = malloc((size_t)(n > 0 ? n : 1) * sizeof *s->tokens);
    if (!s->tokens)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: cannot allocate %lld tokens", path,
                         (long long)n);
    s->n = n;
    return K3RT_OK;
}

/* ---- bytes --------------------------------------------------------------------------------- */

static int bytes_stream(token_stream *s, const unsigned char *p, int64_t n, const char *path,
                        k3rt_error *err)
{
    K3RT_TRY(stream_alloc(s, n, path, err));
    for (int64_t i = 0; i < n; i++) {
        s->tokens[i] = p[i];
        if (p[i] > s->max_token)
            s->max_token = p[i];
    }
    return K3RT_OK;
}

int data_load_bytes(const char *path, double val_fraction, token_stream *train,
                    token_stream *val, k3rt_error *err)
{
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    if (!(val_fraction > 0 && val_fraction < 1))
        return k3rt_fail(err, K3RT_ERR_INVALID, "validation fraction must be in (0, 1), got %g",
                         val_fraction);
    char *text;
    size_t len;
    K3RT_TRY(fs_read_file(path, &text, &len, err));
    /* Validation = the last floor(n * fraction) bytes. The small tolerance keeps products that
     * are whole numbers on paper (0.29 * 100) from rounding down a whole byte in binary. */
    int64_t n = (int64_t)len;
    int64_t nval = (int64_t)floor((double)n * val_fraction + 1e-6);
    int64_t ntrain = n - nval;
    int rc = K3RT_OK;
    if (ntrain < 2 || nval < 2)
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: %lld bytes split into %lld training and "
                       "%lld validation tokens at validation fraction %g; each split needs at "
                       "least 2", path, (long long)n, (long long)ntrain, (long long)nval,
                       val_fraction);
    if (!rc)
        rc = bytes_stream(train, (const unsigned char *)text, ntrain, path, err);
    if (!rc)
        rc = bytes_stream(val, (const unsigned char *)text + ntrain, nval, path, err);
    free(text);
    if (rc) {
        token_stream_free(train);
        token_stream_free(val);
    }
    return rc;
}

/* ---- shards -------------------------------------------------------------------------------- */

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Token width in bytes from the header, or an error saying what is wrong with it. */
static int shard_header(const char *path, const unsigned char *h, int64_t size, int *width,
                        int64_t *count, k3rt_error *err)
{
    int32_t magic = le32(h), version = le32(h + 4);
    *count = le32(h + 8);
    if (magic == SHARD_MAGIC_U16 || magic == SHARD_MAGIC_U32) {
        int u16 = magic == SHARD_MAGIC_U16;
        int want = u16 ? SHARD_VERSION_U16 : SHARD_VERSION_U32;
        if (version != want)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: version %d with magic %d; expected "
                             "version %d (%s tokens): written by a newer data format?", path,
                             version, magic, want, u16 ? "uint16" : "uint32");
        *width = u16 ? 2 : 4;
    } else {
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: bad magic %d (expected %d for uint16 or %d "
                         "for uint32 token shards): " SHARD_HINT, path, magic,
                         SHARD_MAGIC_U16, SHARD_MAGIC_U32);
    }
    if (*count <= 0)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: header says %lld tokens; a shard holds at "
                         "least 1", path, (long long)*count);
    int64_t want = SHARD_HEADER_BYTES + *count * *width;
    if (size != want)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: file is %lld bytes but its header promises "
                         "%d + %lld tokens x %d bytes = %lld: %s (re-run the data preparation "
                         "that wrote it)", path, (long long)size, SHARD_HEADER_BYTES,
                         (long long)*count, *width, (long long)want,
                         size < want ? "truncated" : "extra bytes after the tokens");
    return K3RT_OK;
}

static int read_tokens(FILE *f, const char *path, int width, token_stream *s, k3rt_error *err)
{
    unsigned char buf[1 << 16];
    int64_t at = 0;
    while (at < s->n) {
        int64_t want = s->n - at, cap = (int64_t)sizeof buf / width;
        size_t k = (size_t)(want < cap ? want : cap);
        if (fread(buf, (size_t)width, k, f) != k)
            return k3rt_fail(err, K3RT_ERR_IO, "%s: short read at token %lld", path,
                             (long long)at);
        for (size_t i = 0; i < k; i++, at++) {
            const unsigned char *p = buf + i * (size_t)width;
            uint32_t v = width == 2 ? (uint32_t)(p[0] | p[1] << 8) : (uint32_t)le32(p);
            if (v > INT32_MAX)
                return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: token %lld is %u, beyond the "
                                 "largest id k3rt supports (2^31 - 1)", path, (long long)at, v);
            s->tokens[at] = (int32_t)v;
            if ((int32_t)v > s->max_token)
                s->max_token = (int32_t)v;
        }
    }
    return K3RT_OK;
}

int data_load_shard(const char *path, token_stream *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return k3rt_fail(err, errno == ENOENT ? K3RT_ERR_NOT_FOUND : K3RT_ERR_IO,
                         "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    unsigned char h[SHARD_HEADER_BYTES];
    int rc = K3RT_OK, width = 0;
    int64_t count = 0;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        rc = k3rt_fail(err, K3RT_ERR_IO, "%s: not a regular file", path);
    else if (st.st_size < SHARD_HEADER_BYTES)
        rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: file is %lld bytes, shorter than the %d-byte "
                       "shard header: truncated, or " SHARD_HINT, path, (long long)st.st_size,
                       SHARD_HEADER_BYTES);
    else if (fread(h, 1, sizeof h, f) != sizeof h)
        rc = k3rt_fail(err, K3RT_ERR_IO, "%s: cannot read the header", path);
    if (!rc)
        rc = shard_header(path, h, (int64_t)st.st_size, &width, &count, err);
    if (!rc)
        rc = stream_alloc(out, count, path, err);
    if (!rc)
        rc = read_tokens(f, path, width, out, err);
    fclose(f);
    if (!rc)
        rc = data_load_docs(path, out, err);
    if (rc)
        token_stream_free(out);
    return rc;
}

int data_write_shard(const char *path, const int32_t *tokens, int64_t n, int force_u32,
                     k3rt_error *err)
{
    if (n <= 0 || n > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a shard holds 1 to 2^31 - 1 tokens, got "
                         "%lld", path, (long long)n);
    int width = force_u32 ? 4 : 2;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: token %lld is negative (%d)", path,
                             (long long)i, tokens[i]);
        if (tokens[i] > 65535)
            width = 4;
    }
    unsigned char h[SHARD_HEADER_BYTES] = {0};
    put_le32(h, width == 2 ? SHARD_MAGIC_U16 : SHARD_MAGIC_U32);
    put_le32(h + 4, width == 2 ? SHARD_VERSION_U16 : SHARD_VERSION_U32);
    put_le32(h + 8, (uint32_t)n);
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    fs_atomic_write(&a, h, sizeof h);
    unsigned char buf[1 << 16];
    size_t used = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int b = 0; b < width; b++)
            buf[used++] = (unsigned char)((uint32_t)tokens[i] >> (8 * b));
        if (used + 4 > sizeof buf || i == n - 1) {
            fs_atomic_write(&a, buf, used);
            used = 0;
        }
    }
    return fs_atomic_commit(&a, err);
}

/* ---- batches ------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Counter-based: a pure function of (seed, row), so any batch can be drawn again without
 * replaying the ones before it. */
static uint64_t window_hash(uint64_t seed, int64_t row)
{
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
    return mix64(h ^ ((uint64_t)row + 0x632be59bd9b4e019ull));
}

int64_t data_window_start(const token_stream *s, uint64_t seed, int64_t row, int64_t T)
{
    return (int64_t)(window_hash(seed, row) % (uint64_t)(s->n - T));
}

int data_batch(const token_stream *s, uint64_t seed, int64_t index, int64_t B, int64_t T,
               int32_t *inputs, int32_t *targets, k3rt_error *err)
{
    if (B < 1 || T < 1 || index < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "data batch: need B >= 1, T >= 1, index >= 0; "
                         "got B=%lld T=%lld index=%lld", (long long)B, (long long)T,
                         (long long)index);
    if (s->n < T + 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "data has %lld tokens; windows of %lld + 1 "
                         "tokens need at least %lld (shorten seq_len or use more data)",
                         (long long)s->n, (long long)T, (long long)(T + 2));
    for (int64_t b = 0; b < B; b++) {
        /* Rows are numbered globally (index * B + b): data-parallel ranks and gradient
         * accumulation that split a batch draw exactly the rows one rank would draw whole. */
        int64_t start = data_window_start(s, seed, index * B + b, T);
        memcpy(inputs + b * T, s->tokens + start, (size_t)T * sizeof *inputs);
        memcpy(targets + b * T, s->tokens + start + 1, (size_t)T * sizeof *targets);
    }
    return K3RT_OK;
}

int64_t data_val_windows(const token_stream *s, int64_t T)
{
    if (T < 1 || s->n < 2)
        return 0;
    return (s->n - 1 + T - 1) / T;
}

int data_check_val(const token_stream *s, const char *what, k3rt_error *err)
{
    if (s->n >= 2)
        return K3RT_OK;
    return k3rt_fail(err, K3RT_ERR_INVALID, "%s: the validation split has %lld token%s; a "
                     "loss needs at least 2 (an input and its target): give a longer "
                     "validation shard, or a larger data.val_fraction", what, (long long)s->n,
                     s->n == 1 ? "" : "s");
}

int data_val_window(const token_stream *s, int64_t w, int64_t T, int32_t *inputs,
                    int32_t *targets, k3rt_error *err)
{
    int64_t nw = data_val_windows(s, T);
    if (w < 0 || w >= nw)
        return k3rt_fail(err, K3RT_ERR_INVALID, "validation window %lld out of range: %lld "
                         "windows of %lld tokens", (long long)w, (long long)nw, (long long)T);
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = w * T + t;
        int has_target = pos + 1 < s->n;
        inputs[t] = has_target ? s->tokens[pos] : 0;
        targets[t] = has_target ? s->tokens[pos + 1] : -1;
    }
    return K3RT_OK;
}
