/* Ablation suites: a Lua file (run in the recipe sandbox) naming a base recipe and variants of
 * it as --set overrides.
 *
 *   return {
 *     name = "attnres",                    -- optional; default: the file's stem
 *     base = "../tiny.lua",                -- relative to the suite's folder
 *     base_name = "standard",              -- optional; default "base"
 *     description = "...",                 -- optional, copied into the table
 *     set = { "train.steps=600", ... },    -- overrides of every variant, the base included
 *     variants = {
 *       { name = "block-attnres", set = { "model.residual=k3.block_attnres{block_layers=2}" } },
 *     },
 *   }
 * Each override is a `k3rt train --set` string (a key path and a Lua expression). Every
 * variant therefore starts from the same recipe, seed and data order unless an override
 * changes them. */
#ifndef K3RT_ABLATE_SUITE_H
#define K3RT_ABLATE_SUITE_H

#include <k3rt/errors.h>

typedef struct ablate_variant {
    char name[64];
    char **sets;                /* the variant's own overrides */
    int n_sets;
} ablate_variant;

typedef struct ablate_suite {
    char path[1024];            /* the suite file */
    char name[128];
    char base[2048];            /* the base recipe, resolved against the suite's folder */
    char description[1024];
    char **sets;                /* overrides of every variant */
    int n_sets;
    ablate_variant *variants;   /* [0] is the base itself */
    int n_variants;
} ablate_suite;

int suite_load(const char *path, ablate_suite *s, k3rt_error *err);
void suite_free(ablate_suite *s);

#endif
