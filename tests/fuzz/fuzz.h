/* Shared by the fuzz targets: each defines LLVMFuzzerTestOneInput over one reader of
 * untrusted input. Built two ways (CMakeLists.txt): as libFuzzer binaries (clang, K3RT_FUZZ)
 * that scripts/fuzz.sh runs for a fixed time, and with replay.c's main() in every ordinary
 * build, where ctest runs the seed corpus and the regression inputs once each. */
#ifndef K3RT_FUZZ_H
#define K3RT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "plugin/registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A file holding data that the readers can open by path: a memfd, named /proc/self/fd/N,
 * rewritten for each input. */
const char *fuzz_file(const uint8_t *data, size_t size);
/* Writes data to path (created or truncated); aborts on failure (a broken harness). */
void fuzz_write(const char *path, const uint8_t *data, size_t size);
/* With K3RT_FUZZ_VERBOSE set, prints where an input stopped (err's message, or "accepted"):
 * for checking that a seed reaches deep. */
void fuzz_note(int rc, const char *msg);
/* The search path plus the option-only fixture plugins of every kind (fixture_mixer,
 * fixture_ffn, fixture_balancer, fixture_opt, fixture_residual): what the recipe and manifest
 * targets may name. */
void fuzz_fixture_registry(registry *reg);
/* A fresh directory for this process, made once. */
const char *fuzz_dir(void);

#endif
