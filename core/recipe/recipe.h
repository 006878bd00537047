/* Recipes: a Lua 5.4 file, run in a sandbox, that returns the model, optimizer, parallel plan,
 * training run and data of one job. This module loads it, applies --set overrides, validates
 * it against the schema (core sections here, plugin options from each plugin's descriptor),
 * and hands the engine one JSON document. It also keeps the Lua state alive for the optional
 * on_step hook.
 *
 * The validated document (every default filled in):
 * {
 *   "model": { "d_model": int, "vocab": int, "layers": int,
 *              "pattern": "KKKMKKKM...",          // expanded to exactly `layers` letters
 *              "mixers": { "K": SPEC, "M": SPEC }, // every letter used by pattern, and no other
 *              "ffn": SPEC, "dense_ffn": SPEC|null, "dense_layers": int,
 *              "balancer": SPEC, "residual": SPEC,
 *              "norm_eps": num, "init_std": num },
 *   "optimizer": SPEC plus "lr": num,
 *   "plan":  { "dp", "ep", "cp", "micro_batch", "seq_len", "grad_accum": int,
 *              "device": "auto"|"cpu"|"cuda", "dtype": "auto"|"f32"|"f64"|"bf16",
 *              "threads": int (0 = all cores), "deterministic": bool,
 *              "shard_optimizer": bool, "comm": "auto"|"local"|"mpi"|"tcp"|"nccl" },
 *   "train": { "steps", "warmup": int, "schedule": "cosine"|"linear"|"constant",
 *              "min_lr_ratio": num, "seed": int, "grad_clip": num (0 = off),
 *              "log_interval", "eval_interval", "eval_batches" (0 = whole split),
 *              "checkpoint_interval", "keep_checkpoints", "max_bad_steps": int,
 *              "changes": [ { "step": int, "balancer": SPEC }, ... ] },
 *   "data":  { "tokenizer": "bytes"|"shards", "path": str|null, "val_fraction": num,
 *              "train": str|null, "val": str|null },
 *   "sample": { "bytes": int, "temperature": num, "top_k": int, "prompt": str, "seed": int },
 *   "out": str,                       // output directory, default "runs/<recipe file stem>"
 *   "has_on_step": bool
 * }
 * SPEC = { "plugin": "kda", "kind": "attention", "path": str|null, "config": { ...all options } }
 * (the optimizer's SPEC also has "lr", taken out of its options: the schedule owns it).
 * Defaults: model.balancer none{} (built in), model.residual standard{}, model.dense_ffn
 * dense_glu{} when that plugin is registered, else null (then dense_layers must be 0).
 * eval_interval 0 = only at the end, checkpoint_interval 0 = never, keep_checkpoints 0 = all.
 * In Lua a SPEC comes from the generated sugar k3.NAME{...} or k3.plugin("path.so", {...})
 * (a path relative to the recipe's folder; k3.plugin("name", {...}) reaches a registered name);
 * `k3.none` stands for an explicit none (JSON null), e.g. lower_bound = k3.none, and k3.none{}
 * is the built-in `none` balancer.
 *
 * The sandbox: base functions without load/loadfile/dofile/collectgarbage/require (and
 * setmetatable refuses __gc), string without dump, table, math (seeded with 0), utf8, k3; text
 * chunks only; a memory cap, an instruction budget and a wall-clock limit per entry into Lua
 * (recipe_limits), with the C functions that could run long in one call metered (sandbox.h).
 * k3.plugin loads a plugin file only while the recipe loads (its top level and --set); from
 * on_step it reaches only files already loaded.
 * Messages read "file:line: what: ..." with the line of the k3.NAME{} or k3.recipe{} call;
 * when the recipe alone is valid but not after --set, they start with the overrides instead.
 */
#ifndef K3RT_RECIPE_H
#define K3RT_RECIPE_H

#include <stdint.h>
#include <jansson.h>
#include <k3rt/errors.h>

#include "plugin/registry.h"

typedef struct recipe recipe;

typedef struct recipe_limits {
    size_t memory_bytes;        /* Lua allocations cap, including the recipe's conversion to
                                   JSON (default 64 MiB) */
    int64_t instructions;       /* VM instruction budget per entry into Lua (default 1e8) */
    double seconds;             /* wall-clock limit per entry into Lua (default 10 s) */
} recipe_limits;

/* Loads and validates `path`. reg must outlive the recipe (on_step and recipe_spec_plugin
 * resolve through it). overrides are "a.b.c=value" strings (value parsed as a Lua
 * expression in the sandbox, so --set model.balancer=k3.quantile{} works). reg resolves
 * plugin names and is used to generate the k3.NAME sugar; plugins loaded by path are added to
 * it. limits may be NULL for the defaults. Every failure fills err with "file:line: message"
 * where a line is known. */
int recipe_load(const char *path, registry *reg, const char *const *overrides, int n_overrides,
                const recipe_limits *limits, recipe **out, k3rt_error *err);
/* The same from text in memory; `name` is used in messages ("recipe.lua"). */
int recipe_load_string(const char *text, const char *name, registry *reg,
                       const char *const *overrides, int n_overrides,
                       const recipe_limits *limits, recipe **out, k3rt_error *err);
void recipe_free(recipe *r);

const json_t *recipe_json(const recipe *r);     /* the validated document (owned by r) */
const char *recipe_text(const recipe *r);       /* the file as read */
const char *recipe_hash(const recipe *r);       /* sha256 hex of the text */
const char *recipe_path(const recipe *r);
/* The plugin a SPEC of the document names: by its path when it was loaded by path, else by
 * name and kind, looked up in reg on each call. NULL for anything else (e.g. a null
 * dense_ffn). */
const plugin_entry *recipe_spec_plugin(const recipe *r, const json_t *spec);

/* Calls on_step(step, metrics) if the recipe defined it. metrics is a JSON object (numbers
 * and strings) converted to a Lua table. *changes receives NULL (nothing to change) or a
 * validated object of mid-run changes, currently { "balancer": SPEC }; anything else it
 * returns is an error naming the key. */
int recipe_on_step(recipe *r, int64_t step, const json_t *metrics, json_t **changes,
                   k3rt_error *err);

#endif
