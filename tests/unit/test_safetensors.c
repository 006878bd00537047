/* safetensors: round trips of every dtype, and every malformed file the reader must refuse
 * with a message that says what is wrong. */
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"
#include "util/fs.h"

static char g_dir[512];

static void setup(void) { tu_tmpdir(g_dir, sizeof g_dir); }
static void teardown(void) { fs_remove_tree(g_dir, NULL); }

static const char *tmp_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", g_dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(*n + 1);
    ck_assert_uint_eq(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

/* A file made by hand: u64 header length, the header text as given, `data` zero bytes. */
static void write_raw(const char *path, const char *header, size_t data)
{
    size_t h = strlen(header), n = 8 + h + data;
    unsigned char *p = calloc(1, n);
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(p + 8, header, h);
    write_bytes(path, p, n);
    free(p);
}

/* Opening must fail with `code` and a message that names the file and contains `what`. */
static void expect_reject(const char *path, int code, const char *what)
{
    st_file *f = NULL;
    k3rt_error err = {0};
    int rc = st_open(path, &f, &err);
    ck_assert_msg(rc == code, "expected status %d for '%s', got %d: %s", code, what, rc,
                  err.msg);
    ck_assert_ptr_null(f);
    ck_assert_msg(strstr(err.msg, path) == err.msg, "message does not start with the file: %s",
                  err.msg);
    ck_assert_msg(strstr(err.msg, what), "message lacks '%s': %s", what, err.msg);
}

static void expect_raw_reject(const char *header, size_t data, int code, const char *what)
{
    char path[600];
    write_raw(tmp_path(path, sizeof path, "raw.safetensors"), header, data);
    expect_reject(path, code, what);
}

/* ---- round trips ---------------------------------------------------------------------------- */

static double f64s[6] = {1.5, -2.25, 3e-300, 4e300, -0.0, 6};
static float f32s[4] = {1, -2, 0.5f, 3.25f};
static uint16_t bf16s[4] = {0x3f80, 0xbf80, 0x4000, 0x0001};
static uint8_t fp8s[5] = {0x38, 0xb8, 0x7e, 0x01, 0x00};
static int32_t i32s[1] = {-123456};
static uint8_t u8s[3] = {1, 2, 255};
static float f32b[3] = {7, 8, 9}; /* follows 3 U8 bytes: misaligned in the file */
static uint16_t u16s[2] = {65535, 7};
static int64_t i64s[2] = {INT64_MIN, INT64_MAX};

#define NENT 10
static st_entry g_entries[NENT] = {
    {"f64", K3RT_F64, 2, {2, 3}, f64s},
    {"f32", K3RT_F32, 1, {4}, f32s},
    {"bf16", K3RT_BF16, 2, {2, 2}, bf16s},
    {"layers.0.mixer.fp8", K3RT_FP8_E4M3, 1, {5}, fp8s},
    {"scalar.i32", K3RT_I32, 0, {0}, i32s},
    {"empty.i64", K3RT_I64, 3, {2, 0, 4}, NULL},
    {"u8", K3RT_U8, 1, {3}, u8s},
    {"f32.after.u8", K3RT_F32, 1, {3}, f32b},
    {"u16.4d", K3RT_U16, 4, {1, 1, 1, 2}, u16s},
    {"i64", K3RT_I64, 1, {2}, i64s},
};

static size_t entry_bytes(const st_entry *e)
{
    size_t n = k3rt_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++)
        n *= (size_t)e->shape[d];
    return n;
}

static void write_sample(const char *path, int with_meta)
{
    k3rt_error err = {0};
    json_t *meta = with_meta ? json_pack("{s:s, s:s}", "format", "pt", "k3rt.step", "100")
                             : NULL;
    TU_OK(st_write(path, g_entries, NENT, meta, &err), err);
    json_decref(meta);
}

START_TEST(test_roundtrip_every_dtype)
{
    char path[600], tmp[700];
    tmp_path(path, sizeof path, "all.safetensors");
    write_sample(path, 1);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ck_assert_msg(!fs_exists(tmp), "temporary file left behind");

    st_file *f = NULL;
    k3rt_error err = {0};
    TU_OK(st_open(path, &f, &err), err);
    ck_assert_int_eq(st_count(f), NENT);
    for (int i = 0; i < NENT; i++) {
        const st_entry *want = &g_entries[i], *got = st_at(f, i);
        ck_assert_str_eq(got->name, want->name); /* file order = the order given */
        ck_assert_int_eq(got->dtype, want->dtype);
        ck_assert_int_eq(got->ndim, want->ndim);
        for (int d = 0; d < want->ndim; d++)
            ck_assert_int_eq(got->shape[d], want->shape[d]);
        size_t n = entry_bytes(want);
        if (n)
            ck_assert_msg(memcmp(got->data, want->data, n) == 0, "bytes of %s differ",
                          want->name);
        ck_assert_msg(n == 0 || (uintptr_t)got->data % k3rt_dtype_size(got->dtype) == 0,
                      "%s is not aligned for its dtype", got->name);
        ck_assert_ptr_eq(st_find(f, want->name), got);
    }
    ck_assert_ptr_null(st_find(f, "missing"));
    ck_assert_ptr_null(st_at(f, NENT));
    const json_t *m = st_metadata(f);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(json_object_size(m), 2);
    ck_assert_str_eq(json_string_value(json_object_get(m, "format")), "pt");
    ck_assert_str_eq(json_string_value(json_object_get(m, "k3rt.step")), "100");
    st_close(f);

    /* Layout: header padded with spaces to a multiple of 8, data contiguous after it. */
    size_t size;
    unsigned char *raw = read_bytes(path, &size);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)raw[i] << (8 * i);
    ck_assert_uint_eq(h % 8, 0);
    ck_assert_int_eq(raw[8], '{');
    size_t data = 0;
    for (int i = 0; i < NENT; i++)
        data += entry_bytes(&g_entries[i]);
    ck_assert_uint_eq(size, 8 + h + data);
    ck_assert_msg(memcmp(raw + 8 + h, f64s, sizeof f64s) == 0, "first tensor not at offset 0");
    free(raw);
}
END_TEST

START_TEST(test_no_metadata_and_overwrite)
{
    char path[600];
    tmp_path(path, sizeof path, "plain.safetensors");
    write_sample(path, 1);
    write_sample(path, 0); /* replaces the file */
    st_file *f = NULL;
    k3rt_error err = {0};
    TU_OK(st_open(path, &f, &err), err);
    ck_assert_ptr_null(st_metadata(f));
    ck_assert_int_eq(st_count(f), NENT);
    st_close(f);

    /* No tensors at all is a valid file too. */
    TU_OK(st_write(path, NULL, 0, NULL, &err), err);
    TU_OK(st_open(path, &f, &err), err);
    ck_assert_int_eq(st_count(f), 0);
    st_close(f);
}
END_TEST

START_TEST(test_dtype_names)
{
    const struct {
        const char *name;
        int dtype;
    } map[] = {{"F64", K3RT_F64}, {"F32", K3RT_F32},   {"BF16", K3RT_BF16},
               {"F8_E4M3", K3RT_FP8_E4M3}, {"I32", K3RT_I32}, {"I64", K3RT_I64},
               {"U8", K3RT_U8},   {"U16", K3RT_U16}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        ck_assert_str_eq(st_dtype_name(map[i].dtype), map[i].name);
        ck_assert_int_eq(st_dtype_from_name(map[i].name), map[i].dtype);
    }
    ck_assert_int_eq(st_dtype_from_name("F16"), K3RT_DTYPE_INVALID);
    ck_assert_int_eq(st_dtype_from_name("f32"), K3RT_DTYPE_INVALID);
    ck_assert_int_eq(st_dtype_from_name(NULL), K3RT_DTYPE_INVALID);
    ck_assert_ptr_null(st_dtype_name(K3RT_DTYPE_INVALID));
    ck_assert_ptr_null(st_dtype_name(99));
}
END_TEST

START_TEST(test_writer_rejects)
{
    char path[600];
    tmp_path(path, sizeof path, "bad.safetensors");
    k3rt_error err = {0};
    float x[2] = {1, 2};
    st_entry dup[2] = {{"w", K3RT_F32, 1, {2}, x}, {"w", K3RT_F32, 1, {2}, x}};
    ck_assert_int_eq(st_write(path, dup, 2, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "'w' given twice"), "%s", err.msg);
    st_entry five = {"t", K3RT_F32, 5, {1, 1, 1, 1}, x};
    ck_assert_int_eq(st_write(path, &five, 1, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "5 dims"), "%s", err.msg);
    st_entry neg = {"t", K3RT_F32, 1, {-2}, x};
    ck_assert_int_eq(st_write(path, &neg, 1, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "shape[0] is -2"), "%s", err.msg);
    st_entry meta_name = {"__metadata__", K3RT_F32, 1, {2}, x};
    ck_assert_int_eq(st_write(path, &meta_name, 1, NULL, &err), K3RT_ERR_INVALID);
    st_entry nodata = {"t", K3RT_F32, 1, {2}, NULL};
    ck_assert_int_eq(st_write(path, &nodata, 1, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "no data"), "%s", err.msg);
    json_t *meta = json_pack("{s:i}", "step", 3);
    st_entry ok = {"t", K3RT_F32, 1, {2}, x};
    ck_assert_int_eq(st_write(path, &ok, 1, meta, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "string values"), "%s", err.msg);
    json_decref(meta);
    ck_assert_msg(!fs_exists(path), "a refused write left a file");
    ck_assert_int_eq(st_write("/nonexistent/dir/w.safetensors", &ok, 1, NULL, &err),
                     K3RT_ERR_IO);
    ck_assert_msg(strstr(err.msg, "/nonexistent/dir/w.safetensors.tmp: cannot create"), "%s",
                  err.msg);
}
END_TEST

/* ---- malformed files ------------------------------------------------------------------------ */

START_TEST(test_truncated)
{
    char path[600], cut[600];
    tmp_path(path, sizeof path, "full.safetensors");
    tmp_path(cut, sizeof cut, "cut.safetensors");
    write_sample(path, 1);
    size_t size;
    unsigned char *raw = read_bytes(path, &size);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)raw[i] << (8 * i);
    const struct {
        size_t at;
        const char *what;
    } cuts[] = {
        {0, "0 bytes, too short"},
        {5, "5 bytes, too short"},
        {8, "is larger than the 0 bytes after it"},
        {8 + h / 2, "is larger than"},
        {8 + h, "truncated"},
        {8 + h + 9, "truncated"},
        {size - 1, "truncated"},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(cut, raw, cuts[i].at);
        expect_reject(cut, K3RT_ERR_FORMAT, cuts[i].what);
    }
    free(raw);
}
END_TEST

START_TEST(test_garbage)
{
    char path[600];
    tmp_path(path, sizeof path, "garbage.safetensors");
    unsigned char junk[4096];
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 7, 0);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)k3rt_rng_u64(&rng);
    write_bytes(path, junk, sizeof junk);
    expect_reject(path, K3RT_ERR_FORMAT, "exceeds the limit");
    /* A plausible length followed by junk: not JSON. */
    junk[0] = 100;
    memset(junk + 1, 0, 7);
    write_bytes(path, junk, sizeof junk);
    expect_reject(path, K3RT_ERR_FORMAT, "header is not valid JSON");
    /* Text that is not a safetensors file at all. */
    tu_write_file(path, "hello, world: this is plain text, not tensors\n");
    expect_reject(path, K3RT_ERR_FORMAT, "not a safetensors file");
}
END_TEST

START_TEST(test_header_length)
{
    char path[600];
    tmp_path(path, sizeof path, "len.safetensors");
    unsigned char p[64] = {0};
    p[0] = 200; /* 200-byte header in a 64-byte file */
    write_bytes(path, p, sizeof p);
    expect_reject(path, K3RT_ERR_FORMAT, "header length 200 is larger than the 56 bytes");
    uint64_t big = 100000001;
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(big >> (8 * i));
    write_bytes(path, p, sizeof p);
    expect_reject(path, K3RT_ERR_FORMAT, "header length 100000001 exceeds the limit");
}
END_TEST

START_TEST(test_offsets)
{
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, K3RT_ERR_FORMAT, "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                      20, K3RT_ERR_FORMAT, "gap of 4 bytes before tensor 'b'");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                      K3RT_ERR_FORMAT, "gap of 4 bytes before tensor 'a'");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                      K3RT_ERR_FORMAT, "tensor 'a': data_offsets [8, 0] end before");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8,
                      K3RT_ERR_FORMAT, "tensor 'a': \"data_offsets\" must be [begin, end]");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                      K3RT_ERR_FORMAT, "\"data_offsets\" must be");
    /* Header order does not matter; offsets do. */
    char path[600];
    write_raw(tmp_path(path, sizeof path, "order.safetensors"),
              "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]},"
              "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]},"
              "\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}",
              10);
    st_file *f = NULL;
    k3rt_error err = {0};
    TU_OK(st_open(path, &f, &err), err);
    ck_assert_str_eq(st_at(f, 0)->name, "a");
    ck_assert_str_eq(st_at(f, 1)->name, "e");
    ck_assert_str_eq(st_at(f, 2)->name, "b");
    ck_assert_int_eq(st_at(f, 0)->ndim, 0);
    st_close(f);
}
END_TEST

START_TEST(test_byte_count_and_trailing)
{
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                      K3RT_ERR_FORMAT, "tensor 'a': data_offsets [0, 8] hold 8 bytes but F32 [3] "
                      "needs 12");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 11,
                      K3RT_ERR_FORMAT, "3 trailing bytes after the last tensor");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 5,
                      K3RT_ERR_FORMAT, "truncated");
    expect_raw_reject("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                      K3RT_ERR_FORMAT, "not a whole number of bytes");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                      "\"data_offsets\":[0,8]}}", 8, K3RT_ERR_FORMAT, "overflows");
}
END_TEST

START_TEST(test_header_content)
{
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, K3RT_ERR_FORMAT, "duplicate tensor name");
    expect_raw_reject("{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                      K3RT_ERR_FORMAT, "tensor 'a': unknown dtype 'F17'");
    expect_raw_reject("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, K3RT_ERR_FORMAT,
                      "tensor 'a': missing \"dtype\"");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                      K3RT_ERR_FORMAT, "tensor 'a': shape[0] is not a non-negative integer");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, K3RT_ERR_FORMAT,
                      "missing \"shape\"");
    expect_raw_reject("{\"a\":[1,2]}", 0, K3RT_ERR_FORMAT, "tensor 'a': expected an object");
    expect_raw_reject("[1, 2]  ", 0, K3RT_ERR_FORMAT, "header is not a JSON object");
    expect_raw_reject("{\"__metadata__\":{\"step\":3}}", 0, K3RT_ERR_FORMAT,
                      "\"__metadata__\" key 'step' must hold a string");
    expect_raw_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4,
                      K3RT_ERR_FORMAT, "header is not valid JSON");
}
END_TEST

START_TEST(test_unsupported)
{
    expect_raw_reject("{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                      K3RT_ERR_UNSUPPORTED, "tensor 'h': dtype F16 is not supported");
    expect_raw_reject("{\"five\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,2]}}",
                      2, K3RT_ERR_UNSUPPORTED, "tensor 'five' has 5 dims");
    /* A format error elsewhere in the file is reported before the unsupported dtype. */
    expect_raw_reject("{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 6,
                      K3RT_ERR_FORMAT, "trailing");
}
END_TEST

/* Random damage to a valid file: every outcome is a clean open or a clean refusal. */
START_TEST(test_mutations_never_crash)
{
    char path[600], bad[600];
    tmp_path(path, sizeof path, "good.safetensors");
    tmp_path(bad, sizeof bad, "mutant.safetensors");
    write_sample(path, 1);
    size_t size;
    unsigned char *raw = read_bytes(path, &size), *m = malloc(size);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 2024, 0);
    int opened = 0, refused = 0;
    for (int it = 0; it < 400; it++) {
        memcpy(m, raw, size);
        int flips = 1 + (int)(k3rt_rng_u64(&rng) % 3);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(k3rt_rng_u64(&rng) % size);
            m[at] = it % 2 ? (unsigned char)k3rt_rng_u64(&rng) : (unsigned char)(m[at] ^ 1);
        }
        size_t len = it % 5 == 0 ? (size_t)(k3rt_rng_u64(&rng) % size) : size;
        write_bytes(bad, m, len);
        st_file *f = NULL;
        k3rt_error err = {0};
        if (st_open(bad, &f, &err) == K3RT_OK) {
            opened++;
            for (int i = 0; i < st_count(f); i++)
                ck_assert_ptr_nonnull(st_at(f, i)->name);
            st_close(f);
        } else {
            refused++;
            ck_assert_msg(strstr(err.msg, bad) == err.msg, "message without file: %s", err.msg);
        }
    }
    ck_assert_int_gt(refused, 100);
    ck_assert_int_eq(opened + refused, 400);
    free(raw);
    free(m);
}
END_TEST

/* An open file keeps its contents when the path is rewritten (rename gives a new file). */
START_TEST(test_open_survives_rewrite)
{
    char path[600];
    tmp_path(path, sizeof path, "live.safetensors");
    float a[2] = {1, 2}, b[2] = {3, 4};
    st_entry e = {"x", K3RT_F32, 1, {2}, a};
    k3rt_error err = {0};
    TU_OK(st_write(path, &e, 1, NULL, &err), err);
    st_file *f = NULL;
    TU_OK(st_open(path, &f, &err), err);
    e.data = b;
    TU_OK(st_write(path, &e, 1, NULL, &err), err);
    const float *x = st_find(f, "x")->data;
    ck_assert_float_eq(x[0], 1);
    ck_assert_float_eq(x[1], 2);
    st_close(f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip_every_dtype);
    tcase_add_test(tc, test_no_metadata_and_overwrite);
    tcase_add_test(tc, test_dtype_names);
    tcase_add_test(tc, test_writer_rejects);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_header_length);
    tcase_add_test(tc, test_offsets);
    tcase_add_test(tc, test_byte_count_and_trailing);
    tcase_add_test(tc, test_header_content);
    tcase_add_test(tc, test_unsupported);
    tcase_add_test(tc, test_mutations_never_crash);
    tcase_add_test(tc, test_open_survives_rewrite);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
