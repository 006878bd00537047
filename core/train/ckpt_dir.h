/* Checkpoint directories, committed atomically.
 *
 *   <root>/step_00000100/            a complete checkpoint
 *       model.safetensors             parameters (names and [out, in] layout of DESIGN.md)
 *       state.safetensors             optimizer, balancer and other plugin state
 *       optimizer.rank<q>.safetensors ZeRO-1: rank q's optimizer state (then not in state.*)
 *       manifest.json                 recipe text + hash, plugins, plan, step, RNG, data cursor,
 *                                     mid-run changes (written by the trainer)
 *       DONE                          written last, before the directory is renamed into place
 *   <root>/step_00000200.tmp/         being written; ignored by readers, removed by the next
 *                                     commit (a crash leaves it behind)
 *
 * Commit: write every file into step_N.tmp/ (each fsynced), write DONE, fsync the directory,
 * rename step_N.tmp -> step_N, fsync root. A crash at any point leaves either the old set of
 * complete checkpoints or the new one. (Saving a step that already exists moves the old step_N
 * aside first; a crash between the two renames loses that step, never an earlier one.) */
#ifndef K3RT_CKPT_DIR_H
#define K3RT_CKPT_DIR_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <k3rt/errors.h>

/* Creates (emptying any stale one) <root>/step_N.tmp and returns its path in tmpdir. */
int ckpt_begin(const char *root, int64_t step, char *tmpdir, size_t len, k3rt_error *err);
/* Writes DONE into the tmp directory and renames it to <root>/step_N (replacing an existing
 * step_N), then keeps only the newest `keep` complete checkpoints (keep <= 0: keep all) of the
 * run `run_id`: a checkpoint whose manifest names another run (or none) is never removed.
 * run_id NULL prunes every complete checkpoint (tools and tests without manifests). */
int ckpt_commit(const char *root, int64_t step, int keep, const char *run_id, k3rt_error *err);
/* Steps of the complete checkpoints under root, newest first, into *steps (free it; NULL and
 * *n = 0 when there are none, or the root does not exist). */
int ckpt_list(const char *root, int64_t **steps, int *n, k3rt_error *err);
/* <root>/step_NNNNNNNN into buf. */
int ckpt_dir(const char *root, int64_t step, char *buf, size_t len, k3rt_error *err);
/* The run a checkpoint belongs to: its manifest's run.id into id, "" when it has none or the
 * manifest cannot be read. */
void ckpt_run_id(const char *dir, char *id, size_t len);
/* The newest complete checkpoint (has DONE, no .tmp suffix): its step and directory.
 * K3RT_ERR_NOT_FOUND when there is none. */
int ckpt_latest(const char *root, int64_t *step, char *dir, size_t len, k3rt_error *err);
/* Path of a checkpoint directory given either a checkpoint directory itself or a root holding
 * step_N directories (then the newest complete one). */
int ckpt_resolve(const char *path, char *dir, size_t len, k3rt_error *err);

/* Reads <dir>/manifest.json and checks it: a JSON object with "format" == 1, "step", and
 * "recipe": {"text", "sha256"} where sha256 is the hash of text (a mismatch is an error naming
 * both hashes). */
int ckpt_read_manifest(const char *dir, json_t **out, k3rt_error *err);

/* sha256 of a buffer as 64 lowercase hex characters + NUL. */
void sha256_hex(const void *data, size_t len, char out[65]);

#endif
