/* safetensors reader and writer (safetensors.h).
 *
 * The reader maps the file read-only and hands out pointers into the mapping, so opening a
 * multi-gigabyte checkpoint costs no copy. Before that it checks the file the way the reference
 * reader does (huggingface/safetensors, tensor.rs): header length bound, a JSON object header,
 * known dtype strings, offsets that tile the data buffer from 0, byte counts that match the
 * shapes, and a file that ends exactly at the last tensor. Files that are valid safetensors but
 * hold what k3rt cannot represent (an F16 tensor, five dims) fail with K3RT_ERR_UNSUPPORTED. */
#include "train/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <k3rt/tensor.h>

#include "util/fs.h"

#define ST_MAX_HEADER 100000000ull
#define ST_META_KEY "__metadata__"

/* Every dtype string of the format; k3rt represents some of them. */
static const struct {
    const char *name;
    int bits;
    int dtype;
} g_st_dtypes[] = {
    {"F64", 64, K3RT_F64},
    {"F32", 32, K3RT_F32},
    {"BF16", 16, K3RT_BF16},
    {"F8_E4M3", 8, K3RT_FP8_E4M3},
    {"I32", 32, K3RT_I32},
    {"I64", 64, K3RT_I64},
    {"U8", 8, K3RT_U8},
    {"U16", 16, K3RT_U16},
    {"BOOL", 8, K3RT_DTYPE_INVALID},
    {"I8", 8, K3RT_DTYPE_INVALID},
    {"I16", 16, K3RT_DTYPE_INVALID},
    {"F16", 16, K3RT_DTYPE_INVALID},
    {"U32", 32, K3RT_DTYPE_INVALID},
    {"U64", 64, K3RT_DTYPE_INVALID},
    {"C64", 64, K3RT_DTYPE_INVALID},
    {"F8_E5M2", 8, K3RT_DTYPE_INVALID},
    {"F8_E8M0", 8, K3RT_DTYPE_INVALID},
    {"F8_E4M3FNUZ", 8, K3RT_DTYPE_INVALID},
    {"F8_E5M2FNUZ", 8, K3RT_DTYPE_INVALID},
    {"F4", 4, K3RT_DTYPE_INVALID},
    {"F6_E2M3", 6, K3RT_DTYPE_INVALID},
    {"F6_E3M2", 6, K3RT_DTYPE_INVALID},
};
#define ST_NDTYPES (int)(sizeof g_st_dtypes / sizeof g_st_dtypes[0])
#define ST_SUPPORTED "F64, F32, BF16, F8_E4M3, I32, I64, U8, U16"

static int st_dtype_index(const char *name)
{
    for (int i = 0; i < ST_NDTYPES; i++)
        if (!strcmp(name, g_st_dtypes[i].name))
            return i;
    return -1;
}

const char *st_dtype_name(int dtype)
{
    for (int i = 0; i < ST_NDTYPES; i++)
        if (g_st_dtypes[i].dtype == dtype && dtype != K3RT_DTYPE_INVALID)
            return g_st_dtypes[i].name;
    return NULL;
}

int st_dtype_from_name(const char *name)
{
    int i = name ? st_dtype_index(name) : -1;
    return i < 0 ? K3RT_DTYPE_INVALID : g_st_dtypes[i].dtype;
}

static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t len)
{
    k3rt_tensor t = {0};
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < K3RT_MAX_DIMS; i++)
        t.shape[i] = shape[i];
    return k3rt_tensor_shape_str(&t, buf, len);
}

/* ---- writer -------------------------------------------------------------------------------- */

static int entry_bytes(const st_entry *e, int64_t *bytes, k3rt_error *err)
{
    const char *name = e->name ? e->name : "(null)";
    if (!st_dtype_name(e->dtype))
        return k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s': dtype %d has no safetensors name",
                         name, e->dtype);
    if (e->ndim < 0 || e->ndim > K3RT_MAX_DIMS)
        return k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s': %d dims; expected 0..%d", name,
                         e->ndim, K3RT_MAX_DIMS);
    int64_t n = (int64_t)k3rt_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s': shape[%d] is %lld", name, d,
                             (long long)e->shape[d]);
        if (__builtin_mul_overflow(n, e->shape[d], &n))
            return k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s': size overflows", name);
    }
    if (n > 0 && !e->data)
        return k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s': no data", name);
    *bytes = n;
    return K3RT_OK;
}

static json_t *entry_json(const st_entry *e, int64_t begin, int64_t end)
{
    json_t *shape = json_array();
    for (int d = 0; d < e->ndim; d++)
        json_array_append_new(shape, json_integer(e->shape[d]));
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(e->dtype), "shape", shape,
                     "data_offsets", (json_int_t)begin, (json_int_t)end);
}

static int strings_only(const json_t *m)
{
    const char *k;
    json_t *v;
    if (!json_is_object(m))
        return 0;
    json_object_foreach((json_t *)m, k, v)
    {
        if (!json_is_string(v))
            return 0;
    }
    return 1;
}

/* The header text padded with spaces to a multiple of 8, so the data buffer starts aligned. */
static int build_header(const st_entry *entries, int n, const json_t *metadata, char **text,
                        size_t *len, k3rt_error *err)
{
    json_t *h = json_object();
    if (metadata && !strings_only(metadata)) {
        json_decref(h);
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "safetensors metadata must be a JSON object of string values");
    }
    if (metadata)
        json_object_set_new(h, ST_META_KEY, json_deep_copy(metadata));
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        int64_t bytes = 0;
        int rc = entry_bytes(e, &bytes, err);
        if (!rc && (!e->name || !e->name[0] || !strcmp(e->name, ST_META_KEY)))
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "entry %d: bad tensor name '%s'", i,
                           e->name ? e->name : "(null)");
        if (!rc && json_object_get(h, e->name))
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "tensor '%s' given twice", e->name);
        if (!rc && json_object_set_new(h, e->name, entry_json(e, at, at + bytes)) != 0)
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "tensor name '%s' is not valid UTF-8",
                           e->name);
        if (rc) {
            json_decref(h);
            return rc;
        }
        at += bytes;
    }
    char *s = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t sl = s ? strlen(s) : 0, padded = (sl + 7) / 8 * 8;
    char *buf = s ? realloc(s, padded + 1) : NULL;
    if (!buf) {
        free(s);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot build the safetensors header");
    }
    memset(buf + sl, ' ', padded - sl);
    buf[padded] = '\0';
    *text = buf;
    *len = padded;
    return K3RT_OK;
}

int st_write(const char *path, const st_entry *entries, int n, const json_t *metadata,
             k3rt_error *err)
{
    if (n < 0 || (n > 0 && !entries))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: bad entry list (%d entries)", path, n);
    char *header = NULL;
    size_t hlen = 0;
    int rc = build_header(entries, n, metadata, &header, &hlen, err);
    if (rc)
        return k3rt_error_prefix(err, "%s: ", path);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    fs_atomic a;
    rc = fs_atomic_open(&a, path, err);
    if (rc) {
        free(header);
        return rc;
    }
    fs_atomic_write(&a, len8, 8);
    fs_atomic_write(&a, header, hlen);
    free(header);
    for (int i = 0; i < n; i++) {
        int64_t bytes = 0;
        entry_bytes(&entries[i], &bytes, NULL);
        fs_atomic_write(&a, entries[i].data, (size_t)bytes);
    }
    return fs_atomic_commit(&a, err);
}

/* ---- reader -------------------------------------------------------------------------------- */

typedef struct st_parsed {
    int st_index;          /* into g_st_dtypes */
    int ndim;              /* as in the file, may exceed 4 */
    int64_t begin, end;
    int64_t numel;
    int order;             /* position in the header */
} st_parsed;

struct st_file {
    uint8_t *map;
    size_t map_len;
    json_t *header;   /* owns the names */
    json_t *index;    /* name -> position in entries */
    int n;
    st_entry *entries;  /* in data order */
    void **copies;      /* aligned copies of misaligned tensors, or NULL */
};

/* A malformed file: K3RT_ERR_FORMAT with "<path>: <what is wrong>". */
static int bad(k3rt_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(k3rt_error *err, const char *path, const char *fmt, ...)
{
    char msg[K3RT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: %s", path, msg);
}

static int get_nonneg_int(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = json_integer_value(v);
    return 1;
}

static int parse_entry(const char *path, const char *name, json_t *v, st_parsed *p,
                       st_entry *e, k3rt_error *err)
{
    if (!json_is_object(v))
        return bad(err, path, "tensor '%s': expected an object with dtype, shape and "
                   "data_offsets", name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return bad(err, path, "tensor '%s': missing \"dtype\" string", name);
    p->st_index = st_dtype_index(json_string_value(dt));
    if (p->st_index < 0)
        return bad(err, path, "tensor '%s': unknown dtype '%s'", name, json_string_value(dt));
    if (!json_is_array(shape))
        return bad(err, path, "tensor '%s': missing \"shape\" array", name);
    p->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < p->ndim; d++) {
        int64_t s;
        if (!get_nonneg_int(json_array_get(shape, (size_t)d), &s))
            return bad(err, path, "tensor '%s': shape[%d] is not a non-negative integer", name,
                       d);
        if (__builtin_mul_overflow(numel, (uint64_t)s, &numel) || numel > INT64_MAX)
            return bad(err, path, "tensor '%s': element count overflows", name);
        if (d < K3RT_MAX_DIMS)
            e->shape[d] = s;
    }
    p->numel = (int64_t)numel;
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !get_nonneg_int(json_array_get(off, 0), &p->begin) ||
        !get_nonneg_int(json_array_get(off, 1), &p->end))
        return bad(err, path, "tensor '%s': \"data_offsets\" must be [begin, end] with "
                   "non-negative integers", name);
    if (p->begin > p->end)
        return bad(err, path, "tensor '%s': data_offsets [%lld, %lld] end before they begin",
                   name, (long long)p->begin, (long long)p->end);
    e->name = name;
    e->dtype = g_st_dtypes[p->st_index].dtype;
    e->ndim = p->ndim;
    return K3RT_OK;
}

static int check_metadata(const char *path, const json_t *m, k3rt_error *err)
{
    if (!json_is_object(m))
        return bad(err, path, "\"%s\" must be an object of strings", ST_META_KEY);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v)
    {
        if (!json_is_string(v))
            return bad(err, path, "\"%s\" key '%s' must hold a string", ST_META_KEY, k);
    }
    return K3RT_OK;
}

static int cmp_offsets(const void *a, const void *b)
{
    const st_parsed *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* The tensors, sorted by offset, must tile [0, data_len) exactly with the right byte counts. */
static int check_layout(const char *path, st_parsed *p, st_entry *e, int n, uint64_t hlen,
                        uint64_t file_size, k3rt_error *err)
{
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *name = e[p[i].order].name;
        const char *prev = i ? e[p[i - 1].order].name : NULL;
        if (p[i].begin < at)
            return bad(err, path, "tensor '%s' (data_offsets [%lld, %lld]) overlaps tensor "
                       "'%s', which ends at %lld", name, (long long)p[i].begin,
                       (long long)p[i].end, prev, (long long)at);
        if (p[i].begin > at)
            return bad(err, path, "gap of %lld bytes before tensor '%s' (data_offsets [%lld, "
                       "%lld]); %s ends at %lld", (long long)(p[i].begin - at), name,
                       (long long)p[i].begin, (long long)p[i].end,
                       prev ? "the previous tensor" : "the data buffer start", (long long)at);
        int bits = g_st_dtypes[p[i].st_index].bits;
        uint64_t nbits;
        if (__builtin_mul_overflow((uint64_t)p[i].numel, (uint64_t)bits, &nbits))
            return bad(err, path, "tensor '%s': byte count overflows", name);
        if (nbits % 8)
            return bad(err, path, "tensor '%s': %llu %s elements are not a whole number of "
                       "bytes", name, (unsigned long long)p[i].numel,
                       g_st_dtypes[p[i].st_index].name);
        if ((uint64_t)(p[i].end - p[i].begin) != nbits / 8) {
            char sh[160];
            return bad(err, path, "tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but "
                       "%s %s needs %llu", name, (long long)p[i].begin, (long long)p[i].end,
                       (long long)(p[i].end - p[i].begin), g_st_dtypes[p[i].st_index].name,
                       p[i].ndim <= K3RT_MAX_DIMS
                           ? shape_str(e[p[i].order].shape, p[i].ndim, sh, sizeof sh)
                           : "(more than 4 dims)",
                       (unsigned long long)(nbits / 8));
        }
        at = p[i].end;
    }
    uint64_t expect = 8 + hlen + (uint64_t)at;
    if (file_size < expect)
        return bad(err, path, "file is %llu bytes but its header describes 8 + %llu + %lld = "
                   "%llu: truncated", (unsigned long long)file_size, (unsigned long long)hlen,
                   (long long)at, (unsigned long long)expect);
    if (file_size > expect)
        return bad(err, path, "%llu trailing bytes after the last tensor (file is %llu bytes, "
                   "header describes %llu)", (unsigned long long)(file_size - expect),
                   (unsigned long long)file_size, (unsigned long long)expect);
    return K3RT_OK;
}

static int unsupported(const char *path, const st_parsed *p, const st_entry *e, int n,
                       k3rt_error *err)
{
    for (int i = 0; i < n; i++) {
        const char *name = e[p[i].order].name;
        if (g_st_dtypes[p[i].st_index].dtype == K3RT_DTYPE_INVALID)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not "
                             "supported by k3rt (supported: " ST_SUPPORTED ")", path, name,
                             g_st_dtypes[p[i].st_index].name);
        if (p[i].ndim > K3RT_MAX_DIMS)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dims; k3rt "
                             "tensors have at most %d", path, name, p[i].ndim, K3RT_MAX_DIMS);
    }
    return K3RT_OK;
}

/* Parses and validates the header; fills f->header, f->index, f->n and f->entries (data
 * pointers still unset, offsets in `begin`). */
static int parse_header(const char *path, const char *text, uint64_t hlen, uint64_t file_size,
                        st_file *f, st_parsed **parsed, k3rt_error *err)
{
    json_error_t je;
    f->header = json_loadb(text, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!f->header) {
        if (json_error_code(&je) == json_error_duplicate_key)
            return bad(err, path, "duplicate tensor name in the header (%s)", je.text);
        return bad(err, path, "header is not valid JSON: %s (header line %d, column %d)",
                   je.text, je.line, je.column);
    }
    if (!json_is_object(f->header))
        return bad(err, path, "header is not a JSON object");
    json_t *meta = json_object_get(f->header, ST_META_KEY);
    if (meta)
        K3RT_TRY(check_metadata(path, meta, err));
    size_t count = json_object_size(f->header) - (meta ? 1 : 0);
    f->index = json_object();
    f->entries = calloc(count ? count : 1, sizeof *f->entries);
    st_parsed *p = calloc(count ? count : 1, sizeof *p);
    *parsed = p;
    if (!f->index || !f->entries || !p)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: cannot allocate %zu entries", path, count);
    const char *name;
    json_t *v;
    json_object_foreach(f->header, name, v)
    {
        if (!strcmp(name, ST_META_KEY))
            continue;
        st_entry tmp = {0};
        K3RT_TRY(parse_entry(path, name, v, &p[f->n], &tmp, err));
        p[f->n].order = f->n;
        f->entries[f->n++] = tmp;
    }
    qsort(p, (size_t)f->n, sizeof *p, cmp_offsets);
    K3RT_TRY(check_layout(path, p, f->entries, f->n, hlen, file_size, err));
    return unsupported(path, p, f->entries, f->n, err);
}

/* Puts the entries in data order, points them into the mapping, and copies any tensor whose
 * address is not a multiple of its element size (possible in files from other writers). */
static int place_entries(st_file *f, const st_parsed *p, uint64_t data_start, k3rt_error *err)
{
    st_entry *sorted = calloc((size_t)(f->n ? f->n : 1), sizeof *sorted);
    f->copies = calloc((size_t)(f->n ? f->n : 1), sizeof *f->copies);
    if (!sorted || !f->copies) {
        free(sorted);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot allocate the tensor table");
    }
    for (int i = 0; i < f->n; i++) {
        st_entry e = f->entries[p[i].order];
        const uint8_t *src = f->map + data_start + p[i].begin;
        size_t bytes = (size_t)(p[i].end - p[i].begin), align = k3rt_dtype_size(e.dtype);
        e.data = src;
        if (bytes && (uintptr_t)src % align) {
            f->copies[i] = malloc(bytes);
            if (!f->copies[i]) {
                free(sorted);
                return k3rt_fail(err, K3RT_ERR_NOMEM, "tensor '%s': cannot allocate %zu bytes",
                                 e.name, bytes);
            }
            memcpy(f->copies[i], src, bytes);
            e.data = f->copies[i];
        }
        sorted[i] = e;
        json_object_set_new(f->index, e.name, json_integer(i));
    }
    free(f->entries);
    f->entries = sorted;
    return K3RT_OK;
}

static int read_header(int fd, const char *path, uint64_t size, uint64_t *hlen, char **text,
                       k3rt_error *err)
{
    uint8_t len8[8];
    if (size < 8)
        return bad(err, path, "file is %llu bytes, too short for the 8-byte header length: "
                   "truncated or not a safetensors file", (unsigned long long)size);
    if (pread(fd, len8, 8, 0) != 8)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)len8[i] << (8 * i);
    if (n > ST_MAX_HEADER)
        return bad(err, path, "header length %llu exceeds the limit of %llu bytes: not a "
                   "safetensors file, or corrupt", (unsigned long long)n, ST_MAX_HEADER);
    if (n > size - 8)
        return bad(err, path, "header length %llu is larger than the %llu bytes after it: "
                   "truncated or not a safetensors file", (unsigned long long)n,
                   (unsigned long long)(size - 8));
    char *buf = malloc(n + 1);
    if (!buf)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: cannot allocate the header", path);
    if (pread(fd, buf, n, 8) != (ssize_t)n) {
        free(buf);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: short read of the header", path);
    }
    buf[n] = '\0';
    *hlen = n;
    *text = buf;
    return K3RT_OK;
}

static int open_mapped(const char *path, st_file *f, st_parsed **parsed, k3rt_error *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return k3rt_fail(err, errno == ENOENT ? K3RT_ERR_NOT_FOUND : K3RT_ERR_IO,
                         "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return k3rt_fail(err, K3RT_ERR_IO, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size, hlen = 0;
    char *text = NULL;
    int rc = read_header(fd, path, size, &hlen, &text, err);
    if (!rc)
        rc = parse_header(path, text, hlen, size, f, parsed, err);
    free(text);
    if (!rc) {
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            rc = k3rt_fail(err, K3RT_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        else {
            f->map = m;
            f->map_len = (size_t)size;
        }
    }
    close(fd);
    if (!rc)
        rc = place_entries(f, *parsed, 8 + hlen, err);
    return rc;
}

int st_open(const char *path, st_file **out, k3rt_error *err)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: cannot allocate", path);
    st_parsed *parsed = NULL;
    int rc = open_mapped(path, f, &parsed, err);
    free(parsed);
    if (rc) {
        st_close(f);
        return rc;
    }
    *out = f;
    return K3RT_OK;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    if (f->copies)
        for (int i = 0; i < f->n; i++)
            free(f->copies[i]);
    free(f->copies);
    free(f->entries);
    if (f->map)
        munmap(f->map, f->map_len);
    json_decref(f->index);
    json_decref(f->header);
    free(f);
}

int st_count(const st_file *f) { return f->n; }

const st_entry *st_at(const st_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->entries[i] : NULL;
}

const st_entry *st_find(const st_file *f, const char *name)
{
    json_t *i = json_object_get(f->index, name);
    return i ? &f->entries[json_integer_value(i)] : NULL;
}

const json_t *st_metadata(const st_file *f) { return json_object_get(f->header, ST_META_KEY); }
