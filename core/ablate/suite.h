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
 *     replicate = "all",                   -- optional: every variant under each seed
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
 * replicate: "base" (the default) replicates only the base, as above; "all" trains every
 * variant under each further seed too ("<name>-seed<N>", after it), so a variant is judged by
 * all of its seeds against all of the base's rather than one run against the spread.
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
    long long seed;             /* under `seeds`, of the runs it fixes (the base, the replicas,
                                 * every variant with replicate "all"): their seed; else 0 */
    int replica;                /* a variant again under another of `seeds` */
    int of;                     /* a replica: the index of the variant it repeats */
} ablate_variant;

typedef struct ablate_suite {
    char path[1024];            /* the suite file */
    char name[128];
    char base[2048];            /* the base recipe, resolved against the suite's folder */
    char description[1024];
    char **sets;                /* overrides of every variant (with `seeds`, the first seed's) */
    int n_sets;
    int n_seeds;                /* entries of `seeds` (0 without it) */
    int replicate_all;          /* replicate = "all" */
    char runs[1024];            /* the shared run folder, "" for <out>/<variant> */
    ablate_variant *variants;   /* [0] is the base itself; each variant's replicas follow it */
    int n_variants;
} ablate_suite;

/* replicate: "base" or "all" over the suite's own `replicate` (k3rt ablate --replicate), or
 * NULL. */
int suite_load(const char *path, const char *replicate, ablate_suite *s, k3rt_error *err);
void suite_free(ablate_suite *s);

#endif
