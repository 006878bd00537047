/* Ablation suites: a Lua file (run in the recipe sandbox) naming a base recipe and variants of
 * it as --set overrides.
 *
 *   return {
 *     name = "attnres",                    -- optional; default: the file's stem
 *     base = "../tiny.lua",                -- relative to the suite's folder
 *     base_name = "standard",              -- optional; default "base"
 *     description = "...",                 -- optional, copied into the table
 *     set = { "train.steps=600", ... },    -- overrides of every variant, the base included
 *     seeds = { 1, 2 },                    -- optional: the base under each seed (below)
 *     runs = "out/shared_runs",            -- optional: a run folder shared between suites
 *     variants = {
 *       { name = "block-attnres", set = { "model.residual=k3.block_attnres{block_layers=2}" } },
 *     },
 *   }
 * Each override is a `k3rt train --set` string (a key path and a Lua expression). Every
 * variant therefore starts from the same recipe, seed and data order unless an override
 * changes them.
 *
 * seeds: every run trains under seeds[1] (a train.seed override after the suite's `set`), and
 * the base again under each further seed, as a variant named "<base_name>-seed<N>" (its
 * override "train.seed=N"), placed after the base. The base's rows measure the seed-to-seed
 * spread the variants' differences are read against (ablate_spread.c).
 *
 * runs: a folder (relative to the working directory) holding the runs, each in a folder named
 * by the hash of its recipe and command, so suites sharing a base configuration share its
 * runs (with --reuse, a run another suite finished is not trained again). Without it, each
 * run's folder is <out>/<variant>. */
#ifndef K3RT_ABLATE_SUITE_H
#define K3RT_ABLATE_SUITE_H

#include <k3rt/errors.h>

typedef struct ablate_variant {
    char name[64];
    char **sets;                /* the variant's own overrides */
    int n_sets;
    long long seed;             /* the base and its seed replicas under `seeds`: their seed */
    int replica;                /* the base again under another of `seeds` */
} ablate_variant;

typedef struct ablate_suite {
    char path[1024];            /* the suite file */
    char name[128];
    char base[2048];            /* the base recipe, resolved against the suite's folder */
    char description[1024];
    char **sets;                /* overrides of every variant (with `seeds`, the first seed's) */
    int n_sets;
    int n_seeds;                /* entries of `seeds` (0 without it) */
    char runs[1024];            /* the shared run folder, "" for <out>/<variant> */
    ablate_variant *variants;   /* [0] is the base itself, then its seed replicas */
    int n_variants;
} ablate_suite;

int suite_load(const char *path, ablate_suite *s, k3rt_error *err);
void suite_free(ablate_suite *s);

#endif
