/* Where a command's plugins come from: the search path (--plugin-path DIRS, K3RT_PLUGIN_PATH,
 * this libk3rt's own plugins) and plugin files named one by one on the command line
 * (`--plugin PATH`, repeatable). Besides a recipe's k3.plugin, a file named this way is the
 * only plugin k3rt loads by its path: checkpoints name such plugins by path in their
 * manifests, and those specs resolve only to files loaded here or by the recipe. */
#ifndef K3RT_PLUGIN_NAMED_H
#define K3RT_PLUGIN_NAMED_H

#include "plugin/registry.h"

#define PLUGIN_SOURCES_MAX_FILES 64

typedef struct plugin_sources {
    const char *dirs;           /* extra search directories, ':'-separated; may be NULL */
    const char *files[PLUGIN_SOURCES_MAX_FILES];  /* plugin files to load by path */
    int n_files;
} plugin_sources;

/* The entry loaded from `path` (the same file: equal paths, or equal canonical paths, so a
 * file found through --plugin-path counts as named), of `kind` (0: any); NULL when none. Never
 * loads anything. */
const plugin_entry *registry_find_file(const registry *reg, const char *path, int kind);

/* registry_init with src->dirs, then each file by its canonical path (realpath): the form
 * recipes and manifests record. src may be NULL (the search path only). */
int registry_open(registry *reg, const plugin_sources *src, k3rt_error *err);

#endif
