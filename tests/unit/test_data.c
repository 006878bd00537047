/* Training data: byte split, token shards (and every way a shard can be broken), batches,
 * validation windows. */
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/data.h"
#include "util/fs.h"

static char g_dir[512];

static void setup(void) { tu_tmpdir(g_dir, sizeof g_dir); }
static void teardown(void) { fs_remove_tree(g_dir, NULL); }

static const char *tmp_path(char *buf, size_t len, const char *name)
{
    return fs_join(buf, len, g_dir, name);
}

/* A stream over caller-owned tokens (not freed). */
static token_stream stream_of(int32_t *tokens, int64_t n)
{
    token_stream s = {tokens, n, 0, NULL, 0};
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] > s.max_token)
            s.max_token = tokens[i];
    return s;
}

/* ---- bytes ---------------------------------------------------------------------------------- */

START_TEST(test_byte_split_small)
{
    char path[600];
    const char *text = "First Citizen:\nBefore we proceed"; /* 32 bytes */
    tu_write_file(tmp_path(path, sizeof path, "small.txt"), text);
    token_stream tr, va;
    k3rt_error err = {0};
    /* validation = floor(32 * 0.2) = floor(6.4) = 6 bytes, training the other 26 */
    TU_OK(data_load_bytes(path, 0.2, &tr, &va, &err), err);
    ck_assert_int_eq(tr.n, 26);
    ck_assert_int_eq(va.n, 6);
    for (int i = 0; i < 26; i++)
        ck_assert_int_eq(tr.tokens[i], (unsigned char)text[i]);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(va.tokens[i], (unsigned char)text[26 + i]);
    ck_assert_int_eq(tr.max_token, 'z');
    ck_assert_int_eq(va.max_token, 'r');
    token_stream_free(&tr);
    token_stream_free(&va);
    ck_assert_ptr_null(tr.tokens);
    ck_assert_int_eq(tr.n, 0);

    /* A product that is whole on paper stays whole: 100 * 0.29 = 29 (28.999... in binary). */
    char hundred[101];
    memset(hundred, 'x', 100);
    hundred[100] = '\0';
    tu_write_file(path, hundred);
    TU_OK(data_load_bytes(path, 0.29, &tr, &va, &err), err);
    ck_assert_int_eq(va.n, 29);
    ck_assert_int_eq(tr.n, 71);
    token_stream_free(&tr);
    token_stream_free(&va);

    /* Bytes above 127 are tokens too. */
    unsigned char high[4] = {0xff, 0x80, 0x00, 0x7f};
    FILE *f = fopen(path, "wb");
    fwrite(high, 1, 4, f);
    fclose(f);
    TU_OK(data_load_bytes(path, 0.5, &tr, &va, &err), err);
    ck_assert_int_eq(tr.tokens[0], 255);
    ck_assert_int_eq(tr.max_token, 255);
    ck_assert_int_eq(va.tokens[0], 0);
    ck_assert_int_eq(va.max_token, 127);
    token_stream_free(&tr);
    token_stream_free(&va);
}
END_TEST

START_TEST(test_byte_split_rejects)
{
    char path[600];
    token_stream tr, va;
    k3rt_error err = {0};
    tu_write_file(tmp_path(path, sizeof path, "short.txt"), "abcdefghij");
    ck_assert_int_eq(data_load_bytes(path, 0.1, &tr, &va, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "9 training and 1 validation") && strstr(err.msg, "short.txt"),
                  "%s", err.msg);
    ck_assert_ptr_null(tr.tokens);
    ck_assert_int_eq(data_load_bytes(path, 0.9, &tr, &va, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(data_load_bytes(path, 0.0, &tr, &va, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(data_load_bytes(path, 1.0, &tr, &va, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "(0, 1)"), "%s", err.msg);
    tu_write_file(path, "");
    ck_assert_int_eq(data_load_bytes(path, 0.5, &tr, &va, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(data_load_bytes(tmp_path(path, sizeof path, "missing.txt"), 0.1, &tr, &va,
                                     &err), K3RT_ERR_IO);
    ck_assert_msg(strstr(err.msg, "missing.txt"), "%s", err.msg);
}
END_TEST

START_TEST(test_tinyshakespeare_split)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", tu_source_dir());
    token_stream tr, va;
    k3rt_error err = {0};
    /* 1,115,394 bytes; validation = floor(111,539.4) = 111,539 */
    TU_OK(data_load_bytes(path, 0.1, &tr, &va, &err), err);
    ck_assert_int_eq(tr.n, 1003855);
    ck_assert_int_eq(va.n, 111539);
    ck_assert_int_lt(tr.max_token, 128);
    /* The split is contiguous: the corpus starts with "First Citizen". */
    ck_assert_int_eq(tr.tokens[0], 'F');
    ck_assert_int_eq(tr.tokens[6], 'C');
    token_stream_free(&tr);
    token_stream_free(&va);
}
END_TEST

/* ---- shards --------------------------------------------------------------------------------- */

static int32_t *ramp(int64_t n)
{
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 7919) % 50257);
    return t;
}

static void expect_roundtrip(const char *path, const int32_t *t, int64_t n, int force_u32,
                             int width)
{
    k3rt_error err = {0};
    TU_OK(data_write_shard(path, t, n, force_u32, &err), err);
    char *raw;
    size_t len;
    TU_OK(fs_read_file(path, &raw, &len, &err), err);
    ck_assert_uint_eq(len, 1024 + (size_t)n * (size_t)width);
    int32_t head[3];
    memcpy(head, raw, sizeof head);
    ck_assert_int_eq(head[0], width == 2 ? 20240520 : 20240801);
    ck_assert_int_eq(head[1], width == 2 ? 1 : 7);
    ck_assert_int_eq(head[2], n);
    free(raw);
    token_stream s;
    TU_OK(data_load_shard(path, &s, &err), err);
    ck_assert_int_eq(s.n, n);
    int32_t mx = 0;
    for (int64_t i = 0; i < n; i++) {
        ck_assert_int_eq(s.tokens[i], t[i]);
        if (t[i] > mx)
            mx = t[i];
    }
    ck_assert_int_eq(s.max_token, mx);
    token_stream_free(&s);
}

START_TEST(test_shard_roundtrip)
{
    char path[600];
    tmp_path(path, sizeof path, "tok.bin");
    int64_t n = 40000; /* several read/write buffers */
    int32_t *t = ramp(n);
    t[5] = 65535;
    expect_roundtrip(path, t, n, 0, 2);
    expect_roundtrip(path, t, n, 1, 4);
    t[7] = 128255; /* a Llama-3 id: uint32 without being asked */
    expect_roundtrip(path, t, n, 0, 4);
    int32_t one = 3;
    expect_roundtrip(path, &one, 1, 0, 2);
    free(t);

    k3rt_error err = {0};
    int32_t neg[2] = {1, -4};
    ck_assert_int_eq(data_write_shard(path, neg, 2, 0, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "token 1 is negative"), "%s", err.msg);
    ck_assert_int_eq(data_write_shard(path, neg, 0, 0, &err), K3RT_ERR_INVALID);
}
END_TEST

/* A shard with the given header and `ntok` tokens of `width` bytes. */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                            int64_t ntok, int width)
{
    size_t len = 1024 + (size_t)(ntok * width);
    unsigned char *p = calloc(1, len);
    int32_t head[3] = {magic, version, count};
    memcpy(p, head, sizeof head);
    for (int64_t i = 0; i < ntok; i++)
        p[1024 + i * width] = (unsigned char)(i % 200);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, len, f);
    fclose(f);
    free(p);
}

static void expect_shard_reject(const char *path, const char *what)
{
    token_stream s;
    k3rt_error err = {0};
    int rc = data_load_shard(path, &s, &err);
    ck_assert_msg(rc == K3RT_ERR_FORMAT, "'%s': status %d: %s", what, rc, err.msg);
    ck_assert_ptr_null(s.tokens);
    ck_assert_msg(strstr(err.msg, path) == err.msg, "no file name: %s", err.msg);
    ck_assert_msg(strstr(err.msg, what), "message lacks '%s': %s", what, err.msg);
}

START_TEST(test_shard_rejects)
{
    char path[600];
    tmp_path(path, sizeof path, "bad.bin");
    /* truncated: tokens missing, and the header itself cut */
    write_shard_raw(path, 20240520, 1, 100, 99, 2);
    expect_shard_reject(path, "file is 1222 bytes but its header promises 1024 + 100 tokens x "
                              "2 bytes = 1224: truncated");
    write_shard_raw(path, 20240801, 7, 100, 100, 2);
    expect_shard_reject(path, "truncated");
    tu_write_file(path, "short");
    expect_shard_reject(path, "file is 5 bytes, shorter than the 1024-byte shard header");
    /* extra bytes */
    write_shard_raw(path, 20240520, 1, 50, 51, 2);
    expect_shard_reject(path, "extra bytes after the tokens");
    /* magic and version */
    write_shard_raw(path, 20240521, 1, 10, 10, 2);
    expect_shard_reject(path, "bad magic 20240521");
    expect_shard_reject(path, "wrong file, or not a token shard");
    write_shard_raw(path, 20240520, 7, 10, 10, 2);
    expect_shard_reject(path, "version 7 with magic 20240520; expected version 1");
    write_shard_raw(path, 20240801, 1, 10, 10, 4);
    expect_shard_reject(path, "version 1 with magic 20240801; expected version 7");
    /* counts */
    write_shard_raw(path, 20240520, 1, 0, 0, 2);
    expect_shard_reject(path, "header says 0 tokens");
    write_shard_raw(path, 20240520, 1, -5, 0, 2);
    expect_shard_reject(path, "header says -5 tokens");
    /* garbage: random bytes, and a text file */
    unsigned char junk[3000];
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 11, 0);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)k3rt_rng_u64(&rng);
    FILE *f = fopen(path, "wb");
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    expect_shard_reject(path, "bad magic");
    char text[2000];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    tu_write_file(path, text);
    expect_shard_reject(path, "not a token shard");
    /* a uint32 id beyond int32 */
    write_shard_raw(path, 20240801, 7, 2, 2, 4);
    f = fopen(path, "r+b");
    fseek(f, 1024 + 4, SEEK_SET);
    unsigned char big[4] = {0, 0, 0, 0x80};
    fwrite(big, 1, 4, f);
    fclose(f);
    expect_shard_reject(path, "token 1 is 2147483648");

    token_stream s;
    k3rt_error err = {0};
    ck_assert_int_eq(data_load_shard(tmp_path(path, sizeof path, "none.bin"), &s, &err),
                     K3RT_ERR_NOT_FOUND);
}
END_TEST

/* ---- batches -------------------------------------------------------------------------------- */

START_TEST(test_batch_determinism)
{
    int64_t n = 5000, B = 4, T = 16;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)i; /* token = position, so a window reveals its start */
    token_stream s = stream_of(tok, n);
    int32_t in1[64], tg1[64], in2[64], tg2[64];
    k3rt_error err = {0};
    TU_OK(data_batch(&s, 42, 7, B, T, in1, tg1, &err), err);
    /* Another call in between must not matter: the batch depends on its arguments alone. */
    TU_OK(data_batch(&s, 42, 8, B, T, in2, tg2, &err), err);
    TU_OK(data_batch(&s, 42, 7, B, T, in2, tg2, &err), err);
    ck_assert_mem_eq(in1, in2, sizeof in1);
    ck_assert_mem_eq(tg1, tg2, sizeof tg1);
    for (int64_t b = 0; b < B; b++) {
        int32_t start = in1[b * T];
        ck_assert_int_ge(start, 0);
        ck_assert_int_lt(start, n - T - 1);
        for (int64_t t = 0; t < T; t++) {
            ck_assert_int_eq(in1[b * T + t], start + t);
            ck_assert_int_eq(tg1[b * T + t], start + t + 1);
        }
    }
    TU_OK(data_batch(&s, 42, 8, B, T, in2, tg2, &err), err);
    ck_assert_msg(memcmp(in1, in2, sizeof in1) != 0, "index 7 and 8 gave the same batch");
    TU_OK(data_batch(&s, 43, 7, B, T, in2, tg2, &err), err);
    ck_assert_msg(memcmp(in1, in2, sizeof in1) != 0, "seeds 42 and 43 gave the same batch");
    /* Rows of one batch differ, and starts spread over the whole range. */
    ck_assert_int_ne(in1[0], in1[T]);
    int lo = 0, hi = 0;
    for (int64_t idx = 0; idx < 500; idx++) {
        TU_OK(data_batch(&s, 1, idx, 1, T, in2, tg2, &err), err);
        lo += in2[0] < (n - T - 1) / 4;
        hi += in2[0] >= 3 * (n - T - 1) / 4;
    }
    ck_assert_msg(lo > 80 && hi > 80, "starts not spread: %d low, %d high of 500", lo, hi);

    ck_assert_int_eq(data_batch(&s, 1, -1, B, T, in2, tg2, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(data_batch(&s, 1, 0, 0, T, in2, tg2, &err), K3RT_ERR_INVALID);
    token_stream tiny = stream_of(tok, T + 1);
    ck_assert_int_eq(data_batch(&tiny, 1, 0, 1, T, in2, tg2, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "17 tokens"), "%s", err.msg);
    free(tok);
}
END_TEST

/* Every target of the split appears exactly once, in order, across the windows. */
static void check_windows(int64_t n, int64_t T)
{
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)(1 + (i * 31) % 97);
    token_stream s = stream_of(tok, n);
    int64_t nw = data_val_windows(&s, T);
    ck_assert_int_eq(nw, (n - 1 + T - 1) / T);
    int32_t *in = malloc((size_t)T * sizeof *in), *tg = malloc((size_t)T * sizeof *tg);
    int64_t seen = 0;
    k3rt_error err = {0};
    for (int64_t w = 0; w < nw; w++) {
        TU_OK(data_val_window(&s, w, T, in, tg, &err), err);
        for (int64_t t = 0; t < T; t++) {
            if (tg[t] == -1) {
                ck_assert_int_eq(w, nw - 1); /* padding only in the last window */
                ck_assert_int_eq(in[t], 0);
                continue;
            }
            ck_assert_int_eq(w * T + t, seen); /* no target skipped or repeated */
            ck_assert_int_eq(in[t], tok[seen]);
            ck_assert_int_eq(tg[t], tok[seen + 1]);
            seen++;
        }
    }
    ck_assert_int_eq(seen, n - 1);
    ck_assert_int_eq(data_val_window(&s, nw, T, in, tg, &err), K3RT_ERR_INVALID);
    ck_assert_int_eq(data_val_window(&s, -1, T, in, tg, &err), K3RT_ERR_INVALID);
    free(in);
    free(tg);
    free(tok);
}

START_TEST(test_val_windows)
{
    check_windows(23, 5);  /* 22 targets: 4 full windows + 2 */
    check_windows(21, 5);  /* 20 targets: exactly 4 windows, no padding */
    check_windows(2, 8);   /* one target */
    check_windows(1000, 1);
    int32_t one = 5;
    token_stream s = stream_of(&one, 1);
    ck_assert_int_eq(data_val_windows(&s, 4), 0);
    ck_assert_int_eq(data_val_windows(&s, 0), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_byte_split_small);
    tcase_add_test(tc, test_byte_split_rejects);
    tcase_add_test(tc, test_tinyshakespeare_split);
    tcase_add_test(tc, test_shard_roundtrip);
    tcase_add_test(tc, test_shard_rejects);
    tcase_add_test(tc, test_batch_determinism);
    tcase_add_test(tc, test_val_windows);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
