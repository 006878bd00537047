/* Plugin loader and registry: finds plugin shared objects on the search path, checks their
 * ABI before touching anything else, and keeps zero-extended copies of their descriptors and
 * vtables (fields beyond a plugin's struct_size read as NULL). Plugins are never unloaded. */
#ifndef K3RT_PLUGIN_REGISTRY_H
#define K3RT_PLUGIN_REGISTRY_H

#include <k3rt/host.h>
#include <k3rt/plugin.h>

#include "plugin/options.h"

typedef struct plugin_entry {
    k3rt_plugin_descriptor desc;
    k3rt_instance_vtable inst;
    union {
        k3rt_attention_vtable attention;
        k3rt_moe_vtable moe;
        k3rt_balancer_vtable balancer;
        k3rt_optimizer_vtable optimizer;
        k3rt_residual_vtable residual;
    } vt;
    char path[1024];   /* "(built-in)" for plugins compiled into the core */
    char origin[64];   /* which search-path entry found it */
    int shadowed;      /* a plugin of the same name was found earlier on the path */
} plugin_entry;

typedef struct plugin_failure {
    char path[1024];
    char reason[K3RT_ERROR_MSG_MAX];
} plugin_failure;

typedef struct registry {
    plugin_entry *entries;
    int n, cap;
    plugin_failure *failures;  /* files on the search path that could not be loaded */
    int n_failures, cap_failures;
} registry;

/* Scans, in order: extra_dirs (':'-separated, from the CLI; may be NULL), K3RT_PLUGIN_PATH,
 * then the plugins of this libk3rt: <libdir>/k3rt/plugins beside the loaded library when
 * installed (any prefix), the build tree's plugins/ when it is the build tree's library.
 * Files that fail to load are recorded in failures, not fatal: a recipe that needs one of
 * them gets its reason. */
int registry_init(registry *r, const char *extra_dirs, k3rt_error *err);
void registry_free(registry *r);
/* Loads one plugin file by path (recipe `k3.plugin(path, ...)` or CLI); the same path twice
 * returns the same entry. Every failure names the file and the reason. */
int registry_load_file(registry *r, const char *path, const plugin_entry **out, k3rt_error *err);
/* By name; kind 0 matches any kind. NULL when absent. Shadowed duplicates are skipped. */
const plugin_entry *registry_find(const registry *r, const char *name, int kind);
/* Error for a name that is not registered: suggests the nearest name of that kind, and gives
 * the load failure of a file that looks like it (libk3rt_<name>.so) if there is one. */
int registry_not_found(const registry *r, const char *name, int kind, const char *where,
                       k3rt_error *err);

/* Checks a descriptor as returned by an entry point and fills a zero-extended entry. */
int plugin_entry_from_descriptor(const k3rt_plugin_descriptor *d, const char *path,
                                 plugin_entry *out, k3rt_error *err);

/* The caps bits in words ("cpu,cuda,f64"), with_functions adding the optional functions it
 * provides ("state,context-parallel,aux-loss"). Returns buf. */
const char *plugin_caps_str(const plugin_entry *e, int with_functions, char *buf, size_t len);

/* Built-in plugins (the `none` balancer). */
const k3rt_plugin_descriptor *builtin_none_balancer(void);

#endif
