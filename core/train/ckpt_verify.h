/* What a checkpoint's tensors must be before anything loads them: what the manifest says they
 * are, bit for bit, and numbers a run can continue from.
 *
 * The manifest's "tensors" holds, per file (model.safetensors, state.safetensors), every
 * tensor's checksum as "crc32:<8 hex digits>" of its bytes in the file, so a bit flip is caught
 * on load. ckpt_verify then checks every floating-point tensor is finite (weights, optimizer
 * state, balancer biases) and every Adam second moment (optimizer state named "*.v", as the
 * optimizers that ship with k3rt name it) is >= 0. Messages name the file, the tensor, the
 * element and what was found. */
#ifndef K3RT_CKPT_VERIFY_H
#define K3RT_CKPT_VERIFY_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "train/safetensors.h"

/* ZeRO-1 checkpoints: the optimizer state is in one file per data-parallel rank, named
 * ckpt_shard_name(q), listed in the manifest's "optimizer_shards": {"dp": N, "files": [...],
 * "owners": [...]} (files[q] must be ckpt_shard_name(q), so a manifest cannot point outside
 * its directory). */
const char *ckpt_shard_name(int q, char *buf, size_t len);
/* *n = the number of shard files the manifest lists (0: none, the state is unsharded). */
int ckpt_shard_count(const char *dir, const json_t *m, int *n, k3rt_error *err);
/* {name: "crc32:..."} of n entries as they will be written. */
json_t *ckpt_checksums(const st_entry *entries, int n);
/* Checks the files of checkpoint dir against manifest m (see above). A manifest without
 * "tensors" (written before k3rt recorded checksums) gets only the value checks. */
int ckpt_verify(const char *dir, const json_t *m, k3rt_error *err);

#endif
