/* Helpers shared by the Check suites. */
#ifndef K3RT_TESTUTIL_H
#define K3RT_TESTUTIL_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>

#include <k3rt/host.h>
#include <k3rt/k3rt.h>

#include "plugin/registry.h"

/* Fails the test with the k3rt error message when rc != K3RT_OK. */
#define TU_OK(rc, err) \
    ck_assert_msg((rc) == K3RT_OK, "%s:%d: status %d: %s", __FILE__, __LINE__, (rc), (err).msg)

/* Fresh empty directory under $TMPDIR (or /tmp); the path is written into buf. */
void tu_tmpdir(char *buf, size_t len);
/* Runs a shell command; returns its exit status (or -1) and, when out != NULL, its combined
 * stdout+stderr in a malloc'd string. */
int tu_run(const char *cmd, char **out);
/* Path of the k3rt binary (K3RT_BIN or the build tree) and of the source tree. */
const char *tu_k3rt_bin(void);
const char *tu_source_dir(void);
/* $K3RT_PYTHON, else the first python3 that imports numpy (the one on PATH may be a separate
 * installation without the distribution's packages); NULL when there is none. */
const char *tu_python_with_numpy(void);
/* Writes text to path (fails the test on error). */
void tu_write_file(const char *path, const char *text);
/* Failures collected so that one run reports every case: tu_fail_later prints one ("FAILED: ...")
 * and counts it; tu_expect_no_failures fails the test when any was counted since the last
 * reset (naming the first) and resets; tu_failures_reset forgets them (a test's start). */
void tu_fail_later(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tu_expect_no_failures(void);
void tu_failures_reset(void);
/* rms(ref - x) / rms(ref). */
double tu_rel_rms(const double *ref, const double *x, int64_t n);
/* Fills with N(0, scale^2) from a seeded generator. */
void tu_randn(double *x, int64_t n, double scale, uint64_t seed);
void tu_randnf(float *x, int64_t n, double scale, uint64_t seed);
/* A CPU stream with `threads` threads (destroyed by the caller). */
k3rt_stream *tu_cpu_stream(int threads);
/* Losses by step from <out>/metrics.jsonl into loss[step] (steps below max); returns the
 * largest step read. */
int tu_metrics_losses(const char *out, double *loss, int max);
/* The last validation loss in <out>/metrics.jsonl (NAN when it has none). */
double tu_metrics_final_val_loss(const char *out);
/* The one `k3rt train --profile` record of <out>/metrics.jsonl (the caller decrefs it), checked:
 * at step last_step, over `steps` steps from first_step, every part's time non-negative, their
 * sum within the step's wall time and the gap what is left of it. */
struct json_t *tu_metrics_profile(const char *out, int first_step, int last_step, int steps);
/* The part whose name starts with `prefix`, of `direction`, in a profile record (or NULL). */
const struct json_t *tu_profile_part(const struct json_t *prof, const char *prefix,
                                     const char *direction);
/* Checks that each of `layers` layers' mixer and FFN has a forward and a backward part, called
 * once per step, with a positive time, and that the residual and the optimizer have theirs. */
void tu_profile_check_modules(const struct json_t *prof, int layers);
/* Fails unless the two runs' metrics hold the same losses, bit for bit, for steps 1..steps. */
void tu_assert_same_losses(const char *out_a, const char *out_b, int steps);
/* Largest relative rms difference between same-named f32 tensors of two safetensors files. */
double tu_safetensors_max_rel_diff(const char *file_a, const char *file_b);
/* The plugin libk3rt_<name>.so of this build, loaded once per process: from the first folder
 * of K3RT_PLUGIN_PATH when set (the GPU machine's carried build), else the build tree. Fails the
 * test when it does not load. */
const plugin_entry *tu_plugin(const char *name);
/* A registry of this build's search path plus the option-only fixture plugins of every kind
 * (fixtures/recipe_fixture_<kind>.so: fixture_mixer, fixture_ffn, fixture_balancer,
 * fixture_opt, fixture_residual), for recipe tests. */
void tu_recipe_fixtures(registry *reg);
/* Whether every plugin of the recipe tiny_dense.lua (mla, dense_glu, standard, adamw) has a
 * CUDA path in this build; prints the first that has none. Usable outside a running test. */
int tu_dense_plugins_have_cuda(void);
/* Runs one suite and returns the process exit code. */
int tu_run_suite(Suite *s);
/* For tests/gpu: 77 (skip) without a CUDA device; else runs the suite without fork (CUDA
 * does not survive a fork of an initialised process), verbosely, and returns the exit code.
 * `stream`, when not NULL, receives a compute stream on device 0 first (destroyed after). */
int tu_run_gpu_suite(Suite *(*make)(void), k3rt_stream **stream);
int tu_has_cuda_device(void);

#endif
