/* A checkpoint's manifest is data: what it names is checked before anything is built from it.
 * Its "config" goes through the recipe schema (doc_check.h), its "balancer" and every mid-run
 * change through the balancer schema, and the balancer in effect must be the last change's.
 * Plugins resolve by name on the search path; one named by its file resolves only to a file
 * the command line (--plugin) or the recipe already loaded. Options a spec lacks and the
 * schema fills with their defaults (a plugin that gained an option since) are filled in. */
#ifndef K3RT_CKPT_MANIFEST_H
#define K3RT_CKPT_MANIFEST_H

#include <jansson.h>
#include <k3rt/errors.h>

#include "plugin/registry.h"

/* m as read by ckpt_read_manifest from dir, completed in place; messages start with
 * dir/manifest.json. */
int ckpt_check_manifest(json_t *m, registry *reg, const char *dir, k3rt_error *err);

#endif
