/* Document boundaries beside a token shard: <shard>.docs (data.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/data.h"
#include "util/fs.h"

#define DOCS_MAGIC 20261202
#define DOCS_VERSION 1
#define DOCS_HEADER_BYTES 1024

static int64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return (int64_t)v;
}

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* The header's fields against the shard and the file size. */
static int check_header(const char *path, const unsigned char *h, int64_t size, int64_t n,
                        int64_t *docs, k3rt_error *err)
{
    int32_t magic = le32(h), version = le32(h + 4), tokens = le32(h + 12);
    *docs = le32(h + 8);
    if (magic != DOCS_MAGIC || version != DOCS_VERSION)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: magic %d version %d; a document boundary "
                         "file has magic %d version %d (scripts/data/prepare.py writes them)",
                         path, magic, version, DOCS_MAGIC, DOCS_VERSION);
    if (tokens != n)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: written for a shard of %d tokens, but the "
                         "shard beside it holds %lld: re-run the preparation that wrote both",
                         path, tokens, (long long)n);
    if (*docs < 1 || *docs > n)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %lld documents in a shard of %lld tokens "
                         "(1 to one per token)", path, (long long)*docs, (long long)n);
    int64_t want = DOCS_HEADER_BYTES + (*docs + 1) * 8;
    if (size != want)
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: file is %lld bytes, %lld documents need "
                         "%d + %lld x 8 = %lld", path, (long long)size, (long long)*docs,
                         DOCS_HEADER_BYTES, (long long)(*docs + 1), (long long)want);
    return K3RT_OK;
}

static int read_offsets(FILE *f, const char *path, token_stream *s, int64_t docs,
                        k3rt_error *err)
{
    s->doc_starts = malloc((size_t)(docs + 1) * sizeof *s->doc_starts);
    if (!s->doc_starts)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    unsigned char b[8];
    for (int64_t j = 0; j <= docs; j++) {
        if (fread(b, 1, 8, f) != 8)
            return k3rt_fail(err, K3RT_ERR_IO, "%s: short read at offset %lld", path,
                             (long long)j);
        int64_t v = le64(b);
        int64_t lo = j ? s->doc_starts[j - 1] + 1 : 0;
        if ((j == 0 && v != 0) || (j == docs && v != s->n) || (j > 0 && v < lo) || v > s->n)
            return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: offset %lld is %lld; offsets start at "
                             "0, increase strictly and end at the token count %lld", path,
                             (long long)j, (long long)v, (long long)s->n);
        s->doc_starts[j] = v;
    }
    s->n_docs = docs;
    return K3RT_OK;
}

int data_load_docs(const char *shard_path, token_stream *s, k3rt_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.docs", shard_path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? K3RT_OK
                               : k3rt_fail(err, K3RT_ERR_IO, "%s: cannot open: %s", path,
                                           strerror(errno));
    struct stat st;
    unsigned char h[DOCS_HEADER_BYTES];
    int64_t docs = 0;
    int rc = K3RT_OK;
    if (fstat(fileno(f), &st) != 0 || st.st_size < DOCS_HEADER_BYTES ||
        fread(h, 1, sizeof h, f) != sizeof h)
        rc = k3rt_fail(err, K3RT_ERR_FORMAT, "%s: shorter than its %d-byte header", path,
                       DOCS_HEADER_BYTES);
    if (!rc)
        rc = check_header(path, h, (int64_t)st.st_size, s->n, &docs, err);
    if (!rc)
        rc = read_offsets(f, path, s, docs, err);
    fclose(f);
    if (rc) {
        free(s->doc_starts);
        s->doc_starts = NULL;
        s->n_docs = 0;
    }
    return rc;
}

int data_write_docs(const char *shard_path, const int64_t *starts, int64_t n_docs,
                    int64_t n_tokens, k3rt_error *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.docs", shard_path);
    size_t bytes = DOCS_HEADER_BYTES + (size_t)(n_docs + 1) * 8;
    unsigned char *buf = calloc(1, bytes);
    if (!buf)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    uint32_t head[4] = {DOCS_MAGIC, DOCS_VERSION, (uint32_t)n_docs, (uint32_t)n_tokens};
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++)
            buf[4 * k + i] = (unsigned char)(head[k] >> (8 * i));
    for (int64_t j = 0; j <= n_docs; j++)
        for (int i = 0; i < 8; i++)
            buf[DOCS_HEADER_BYTES + 8 * j + i] = (unsigned char)((uint64_t)starts[j] >> (8 * i));
    int rc = fs_write_atomic(path, buf, bytes, err);
    free(buf);
    return rc;
}

int64_t data_window_docs(const token_stream *s, const int64_t *starts, int64_t B, int64_t T,
                         int32_t *offsets)
{
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++) {
        offsets[n++] = (int32_t)(b * T);
        int64_t start = starts[b];
        if (start < 0 || !s->doc_starts)
            continue;
        /* the first document start after the window's first token */
        int64_t lo = 0, hi = s->n_docs;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (s->doc_starts[mid] <= start)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (int64_t j = lo; j < s->n_docs && s->doc_starts[j] < start + T; j++)
            offsets[n++] = (int32_t)(b * T + s->doc_starts[j] - start);
    }
    offsets[n] = (int32_t)(B * T);
    return n;
}
