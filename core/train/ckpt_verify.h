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

/* {name: "crc32:..."} of n entries as they will be written. */
json_t *ckpt_checksums(const st_entry *entries, int n);
/* Checks the files of checkpoint dir against manifest m (see above). A manifest without
 * "tensors" (written before k3rt recorded checksums) gets only the value checks. */
int ckpt_verify(const char *dir, const json_t *m, k3rt_error *err);

#endif
