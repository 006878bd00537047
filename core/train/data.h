/* Training data: text through the byte tokenizer, or llm.c-format token shards.
 *
 * Bytes: every byte is a token (vocabulary 256); the last val_fraction of the file is the
 * validation split, all of it, and the rest is training data. Validation gets
 * floor(n * val_fraction) bytes (rounded down; tinyshakespeare at 0.1: 111,539 of 1,115,394).
 * Shards: a 256 x int32 little-endian header — [0] magic, [1] version, [2] token count — then
 * the tokens: magic 20240520 / version 1 = uint16 tokens (GPT-2), magic 20240801 / version 7
 * = uint32 tokens (Llama-3). The reader checks magic, version, count > 0 and that the file
 * size is exactly 1024 + count * token size, and says how to fix a mismatch. */
#ifndef K3RT_DATA_H
#define K3RT_DATA_H

#include <stdint.h>
#include <k3rt/errors.h>

typedef struct token_stream {
    int32_t *tokens;    /* owned */
    int64_t n;
    int32_t max_token;  /* largest token id present */
    /* Document boundaries, when the shard has a <shard>.docs file: document j covers tokens
     * [doc_starts[j], doc_starts[j + 1]); n_docs + 1 entries, doc_starts[0] = 0, the last = n.
     * NULL and 0 without one (bytes, or a shard without boundaries). */
    int64_t *doc_starts;
    int64_t n_docs;
} token_stream;

int data_load_bytes(const char *path, double val_fraction, token_stream *train,
                    token_stream *val, k3rt_error *err);
/* Also reads <path>.docs when it exists (data_docs.c). */
int data_load_shard(const char *path, token_stream *out, k3rt_error *err);
/* Document boundaries beside a shard: <shard>.docs holds a 256 x int32 little-endian header —
 * [0] magic 20261202, [1] version 1, [2] document count D, [3] the shard's token count — then
 * D + 1 int64 little-endian token offsets: 0, the start of each later document, the token
 * count. The reader checks every field and that the offsets increase strictly, and names the
 * file. data_load_docs fills s->doc_starts when the file exists (s holds the shard's tokens);
 * data_write_docs writes one (tools and tests). */
int data_load_docs(const char *shard_path, token_stream *s, k3rt_error *err);
int data_write_docs(const char *shard_path, const int64_t *starts, int64_t n_docs,
                    int64_t n_tokens, k3rt_error *err);
/* Writes a shard (tests and tools): version 1 (uint16) when every token < 65536 and
 * force_u32 is 0, else version 7 (uint32). */
int data_write_shard(const char *path, const int32_t *tokens, int64_t n, int force_u32,
                     k3rt_error *err);
void token_stream_free(token_stream *s);

/* One training batch: B windows of T+1 tokens, inputs [B,T] and targets [B,T] (shifted by 1).
 * Row r = index * B + b starts at a counter-based hash of (seed, r), so the batch of a given
 * index is the same on every run and after every resume (`index` is the data cursor: batches
 * consumed so far over all ranks and micro-batches), and batches of B/2 at indices 2i and
 * 2i+1 are exactly the two halves of the batch of B at index i — which makes data-parallel
 * ranks and gradient accumulation see the data one rank with the whole batch sees. Starts are
 * uniform over [0, n - T), so the stream needs at least T + 2 tokens. */
int data_batch(const token_stream *s, uint64_t seed, int64_t index, int64_t B, int64_t T,
               int32_t *inputs, int32_t *targets, k3rt_error *err);
/* The first token of training row `row`'s window (s->n >= T + 2). */
int64_t data_window_start(const token_stream *s, uint64_t seed, int64_t row, int64_t T);
/* Packed documents of B windows of T tokens starting at starts[b] (-1: a padding row, one
 * document), as plugin.h's doc_offsets over the B * T tokens: every row start, and every
 * document start of s->doc_starts inside a window. offsets holds B * T + 1; returns the
 * document count (data_docs.c). */
int64_t data_window_docs(const token_stream *s, const int64_t *starts, int64_t B, int64_t T,
                         int32_t *offsets);
/* Validation windows cover every target of the split exactly once: window w has inputs
 * s[w*T .. w*T+T) and targets s[w*T+1 .. w*T+T+1). The last window may be short: its missing
 * positions get input 0 and target -1 (ignored by the loss). */
int64_t data_val_windows(const token_stream *s, int64_t T);
/* A split gives a loss only with at least one (input, target) pair: 2 tokens. Refuses a
 * shorter one, naming `what` (its file) and the fix. */
int data_check_val(const token_stream *s, const char *what, k3rt_error *err);
int data_val_window(const token_stream *s, int64_t w, int64_t T, int32_t *inputs,
                    int32_t *targets, k3rt_error *err);

#endif
