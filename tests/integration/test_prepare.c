/* scripts/data/prepare.py with the checked-in tokenizer (tests/fixtures/tokenizer.json, byte-
 * level BPE of 512 tokens): Shakespeare split at blank lines and a JSON-lines file become
 * train.bin / val.bin with their .docs boundaries; k3rt's reader accepts both, their token and
 * document counts equal the manifest's, every document ends with <|endoftext|> (id 0) and has
 * no other; the main job's model trains on them with data.packed_documents (the losses differ
 * from the same batches without boundaries); a .docs file of another shard, or truncated, is
 * refused by name. Skips (77) when the `tokenizers` package is not importable (scripts/setup.sh installs
 * it into .deps/python). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil/testutil.h"
#include "train/data.h"
#include "util/fs.h"

static char g_py[4096];

static int have_tokenizers(void)
{
    snprintf(g_py, sizeof g_py, "PYTHONPATH='%s/.deps/python'${PYTHONPATH:+:$PYTHONPATH} python3",
             tu_source_dir());
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s -c 'import tokenizers' 2>/dev/null", g_py);
    return tu_run(cmd, NULL) == 0;
}

static void load(const char *dir, const char *file, token_stream *s)
{
    char path[1024];
    k3rt_error err = {0};
    snprintf(path, sizeof path, "%s/%s", dir, file);
    TU_OK(data_load_shard(path, s, &err), err);
}

/* Counts and end-of-text placement of a split against its manifest entry. */
static void check_split(const token_stream *s, const json_t *shard)
{
    ck_assert_int_eq(s->n, json_integer_value(json_object_get(shard, "tokens")));
    ck_assert_int_eq(s->n_docs, json_integer_value(json_object_get(shard, "documents")));
    ck_assert_int_lt(s->max_token, 512);
    int64_t eot = 0;
    for (int64_t i = 0; i < s->n; i++)
        eot += s->tokens[i] == 0;
    ck_assert_int_eq(eot, s->n_docs);
    for (int64_t j = 0; j < s->n_docs; j++) {
        ck_assert_int_gt(s->doc_starts[j + 1], s->doc_starts[j] + 1);
        ck_assert_int_eq(s->tokens[s->doc_starts[j + 1] - 1], 0);
    }
}

START_TEST(test_prepare)
{
    char dir[512], jsonl[700], cmd[8192], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    snprintf(jsonl, sizeof jsonl, "%s/docs.jsonl", dir);
    tu_write_file(jsonl, "{\"text\": \"To be, or not to be.\"}\n"
                         "{\"text\": \"That is the question.\"}\n\n"
                         "{\"text\": \"Whether 'tis nobler in the mind to suffer\"}\n");
    snprintf(cmd, sizeof cmd, "cd %s && %s scripts/data/prepare.py data/tinyshakespeare.txt %s "
             "--tokenizer tests/fixtures/tokenizer.json --doc-sep '\\n\\n' --eot --out %s/shards "
             "--quiet", tu_source_dir(), g_py, jsonl, dir);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s\n%s", cmd, out);
    free(out);
    char path[1024], shards[700];
    snprintf(shards, sizeof shards, "%s/shards", dir);
    json_t *m = json_load_file(fs_join(path, sizeof path, shards, "manifest.json"), 0, NULL);
    ck_assert_ptr_nonnull(m);
    const json_t *src = json_object_get(m, "sources");
    ck_assert_int_eq(json_array_size(src), 2);
    /* the JSON-lines file: three documents (the blank line is none) */
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(src, 1), "documents")), 3);
    int64_t src_docs = 0, src_tokens = 0;
    for (size_t i = 0; i < 2; i++) {
        src_docs += json_integer_value(json_object_get(json_array_get(src, i), "documents"));
        src_tokens += json_integer_value(json_object_get(json_array_get(src, i), "tokens"));
    }
    /* Shakespeare has thousands of blank-line-separated speeches; BPE-512 packs ~2 bytes a
     * token */
    ck_assert_int_gt(src_docs, 5000);
    ck_assert(src_tokens > 1115394 / 4 && src_tokens < 1115394);
    token_stream train, val;
    load(shards, "train.bin", &train);
    load(shards, "val.bin", &val);
    const json_t *sh = json_object_get(m, "shards");
    check_split(&train, json_array_get(sh, 0));
    check_split(&val, json_array_get(sh, 1));
    ck_assert_int_eq(train.n + val.n, src_tokens);
    ck_assert_int_eq(train.n_docs + val.n_docs, src_docs);
    ck_assert_int_eq(json_integer_value(json_object_get(m, "documents")), src_docs);
    /* the validation split is the last tenth of the documents, the JSON-lines ones last */
    ck_assert_int_eq(val.n_docs, (src_docs + 5) / 10);
    json_decref(m);

    /* the main job's model trains on them, with and without the boundaries: the same
     * batches, other losses (documents average ~80 tokens, so 4 windows of 64 cross some) */
    double loss[2][4];
    for (int packed = 0; packed < 2; packed++) {
        snprintf(cmd, sizeof cmd, "cd %s && %s train scripts/recipes/tiny.lua --out %s/run%d "
                 "--quiet --set model.vocab=512 --set 'data={tokenizer=\"shards\", "
                 "train=\"%s/train.bin\", val=\"%s/val.bin\", packed_documents=%s}' "
                 "--set 'model.mixers.K=k3.kda{heads=4, head_dim=32, max_documents=64}' "
                 "--set train.steps=2 --set train.log_interval=1 --set train.eval_batches=1 "
                 "--set plan.micro_batch=4 --set plan.seq_len=64", tu_source_dir(),
                 tu_k3rt_bin(), dir, packed, shards, shards, packed ? "true" : "false");
        ck_assert_msg(tu_run(cmd, &out) == 0, "%s\n%s", cmd, out);
        free(out);
        snprintf(path, sizeof path, "%s/run%d", dir, packed);
        ck_assert_int_eq(tu_metrics_losses(path, loss[packed], 4), 2);
    }
    for (int st = 1; st <= 2; st++) {
        ck_assert(loss[0][st] > 4 && loss[0][st] < 7 && loss[1][st] > 4 && loss[1][st] < 7);
        ck_assert_msg(loss[0][st] != loss[1][st], "step %d: packed_documents changed nothing "
                      "(%.17g)", st, loss[0][st]);
    }
    /* boundaries are for shards */
    snprintf(cmd, sizeof cmd, "cd %s && %s train scripts/recipes/tiny.lua --out %s/run2 "
             "--dry-run --set data.packed_documents=true", tu_source_dir(), tu_k3rt_bin(), dir);
    ck_assert_int_eq(tu_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "data.packed_documents: needs tokenizer = \"shards\""), "%s", out);
    free(out);

    /* boundaries of another shard, then a truncated file */
    k3rt_error err = {0};
    token_stream s;
    char docs[1100], vdocs[1100];
    snprintf(docs, sizeof docs, "%s/train.bin.docs", shards);
    snprintf(vdocs, sizeof vdocs, "%s/val.bin.docs", shards);
    ck_assert_int_eq(rename(vdocs, docs), 0);
    snprintf(path, sizeof path, "%s/train.bin", shards);
    ck_assert_int_eq(data_load_shard(path, &s, &err), K3RT_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "train.bin.docs") && strstr(err.msg, "written for a shard of"),
                  "%s", err.msg);
    TU_OK(data_write_docs(path, train.doc_starts, train.n_docs, train.n, &err), err);
    ck_assert_int_eq(truncate(docs, 1024 + 8 * train.n_docs), 0);
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(data_load_shard(path, &s, &err), K3RT_ERR_FORMAT);
    ck_assert_msg(strstr(err.msg, "train.bin.docs: file is"), "%s", err.msg);
    token_stream_free(&train);
    token_stream_free(&val);
}
END_TEST

int main(void)
{
    if (!have_tokenizers()) {
        fprintf(stderr, "test_prepare: skipped: python3 cannot import tokenizers (run "
                "scripts/setup.sh, which installs it into .deps/python)\n");
        return 77;
    }
    Suite *s = suite_create("prepare");
    TCase *tc = tcase_create("prepare");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_prepare);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
