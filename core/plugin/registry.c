/* The plugin registry: the search path and lookups by name (registry.h). */
#define _GNU_SOURCE
#include "plugin/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"
#include "util/nearest.h"

int plugin_load_file(const char *path, plugin_entry *out, k3rt_error *err);

#ifndef K3RT_INSTALL_PLUGIN_DIR
#define K3RT_INSTALL_PLUGIN_DIR "/usr/local/lib/k3rt/plugins"
#endif
#ifndef K3RT_BUILD_PLUGIN_DIR
#define K3RT_BUILD_PLUGIN_DIR "build/plugins"
#endif
#ifndef K3RT_BUILD_LIB_DIR
#define K3RT_BUILD_LIB_DIR "build/lib"
#endif

/* The plugin folders that belong to this libk3rt, found from where the library itself was
 * loaded so that an installed tree works from any prefix: <libdir>/k3rt/plugins, and the build
 * tree's plugins/ only when this is the build tree's library (an installed k3rt does not pick
 * up plugins of the build it came from). Falls back to the configured paths. */
static void own_plugin_dirs(char *install, size_t ilen, char *build, size_t blen)
{
    snprintf(install, ilen, "%s", K3RT_INSTALL_PLUGIN_DIR);
    snprintf(build, blen, "%s", K3RT_BUILD_PLUGIN_DIR);
    Dl_info info;
    char lib[PATH_MAX], libdir[PATH_MAX], built[PATH_MAX];
    if (!dladdr((void *)own_plugin_dirs, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, lib))
        return;
    fs_dirname(libdir, sizeof libdir, lib);
    if (realpath(K3RT_BUILD_LIB_DIR, built) && !strcmp(built, libdir)) {
        install[0] = '\0';
        return;
    }
    build[0] = '\0';
    fs_join(install, ilen, libdir, "k3rt/plugins");
}

static int push_entry(registry *r, const plugin_entry *e, k3rt_error *err)
{
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 16;
        plugin_entry *p = realloc(r->entries, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "plugin registry: out of memory");
        r->entries = p;
        r->cap = cap;
    }
    r->entries[r->n] = *e;
    r->entries[r->n].shadowed = registry_find(r, e->desc.name, 0) != NULL;
    r->n++;
    return K3RT_OK;
}

static void push_failure(registry *r, const char *path, const char *reason)
{
    if (r->n_failures == r->cap_failures) {
        int cap = r->cap_failures ? r->cap_failures * 2 : 8;
        plugin_failure *p = realloc(r->failures, (size_t)cap * sizeof *p);
        if (!p)
            return;
        r->failures = p;
        r->cap_failures = cap;
    }
    plugin_failure *f = &r->failures[r->n_failures++];
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->reason, sizeof f->reason, "%s", reason);
}

static int is_plugin_file_name(const char *name)
{
    size_t n = strlen(name);
    return n > 9 && !strncmp(name, "libk3rt_", 8) && !strcmp(name + n - 3, ".so");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads every libk3rt_*.so in dir, in name order so the registry is reproducible. */
static int scan_dir(registry *r, const char *dir, const char *origin, k3rt_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return K3RT_OK;  /* a search-path entry that does not exist is not an error */
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 512)
        if (is_plugin_file_name(e->d_name))
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    int rc = K3RT_OK;
    for (int i = 0; i < n; i++) {
        char path[1024];
        fs_join(path, sizeof path, dir, names[i]);
        free(names[i]);
        if (rc)
            continue;
        int dup = 0;
        for (int j = 0; j < r->n && !dup; j++)
            dup = !strcmp(r->entries[j].path, path);
        if (dup)
            continue;
        plugin_entry pe;
        k3rt_error why = {0};
        if (plugin_load_file(path, &pe, &why) != K3RT_OK) {
            push_failure(r, path, why.msg);
            continue;
        }
        snprintf(pe.origin, sizeof pe.origin, "%s", origin);
        rc = push_entry(r, &pe, err);
    }
    return rc;
}

static int scan_list(registry *r, const char *list, const char *origin, k3rt_error *err)
{
    if (!list || !*list)
        return K3RT_OK;
    char *copy = strdup(list), *save = NULL;
    int rc = K3RT_OK;
    for (char *tok = strtok_r(copy, ":", &save); tok && !rc; tok = strtok_r(NULL, ":", &save))
        rc = scan_dir(r, tok, origin, err);
    free(copy);
    return rc;
}

int registry_init(registry *r, const char *extra_dirs, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    plugin_entry none;
    K3RT_TRY(plugin_entry_from_descriptor(builtin_none_balancer(), "(built-in)", &none, err));
    snprintf(none.origin, sizeof none.origin, "built-in");
    K3RT_TRY(push_entry(r, &none, err));
    K3RT_TRY(scan_list(r, extra_dirs, "--plugin-path", err));
    K3RT_TRY(scan_list(r, getenv("K3RT_PLUGIN_PATH"), "K3RT_PLUGIN_PATH", err));
    char install[1024], build[1024];
    own_plugin_dirs(install, sizeof install, build, sizeof build);
    if (install[0])
        K3RT_TRY(scan_dir(r, install, "install", err));
    if (build[0])
        K3RT_TRY(scan_dir(r, build, "build", err));
    return K3RT_OK;
}

void registry_free(registry *r)
{
    free(r->entries);
    free(r->failures);
    memset(r, 0, sizeof *r);
}

int registry_load_file(registry *r, const char *path, const plugin_entry **out, k3rt_error *err)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->entries[i].path, path)) {
            *out = &r->entries[i];
            return K3RT_OK;
        }
    plugin_entry pe;
    K3RT_TRY(plugin_load_file(path, &pe, err));
    snprintf(pe.origin, sizeof pe.origin, "by path");
    K3RT_TRY(push_entry(r, &pe, err));
    /* A plugin loaded by path serves under its name even if the path found another first. */
    r->entries[r->n - 1].shadowed = 0;
    *out = &r->entries[r->n - 1];
    return K3RT_OK;
}

const plugin_entry *registry_find(const registry *r, const char *name, int kind)
{
    const plugin_entry *found = NULL;
    for (int i = 0; i < r->n; i++) {
        const plugin_entry *e = &r->entries[i];
        if (!strcmp(e->desc.name, name) && (!kind || e->desc.kind == kind)) {
            if (!e->shadowed)
                return e;
            if (!found)
                found = e;
        }
    }
    return found;
}

int registry_not_found(const registry *r, const char *name, int kind, const char *where,
                       k3rt_error *err)
{
    char file[96];
    snprintf(file, sizeof file, "/libk3rt_%s.so", name);
    for (int i = 0; i < r->n_failures; i++) {
        const char *p = r->failures[i].path;
        size_t lp = strlen(p), lf = strlen(file);
        if (lp >= lf && !strcmp(p + lp - lf, file))
            return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: plugin '%s' could not be loaded: %s",
                             where, name, r->failures[i].reason);
    }
    const char *names[512];
    int n = 0;
    for (int i = 0; i < r->n && n < 512; i++)
        if (!kind || r->entries[i].desc.kind == kind)
            names[n++] = r->entries[i].desc.name;
    const char *near = nearest_word(name, names, n);
    char list[512] = "";
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "", names[i]);
    if (near)
        return k3rt_fail(err, K3RT_ERR_NOT_FOUND,
                         "%s: no %s%splugin named '%s'; did you mean '%s'?", where,
                         kind ? k3rt_kind_name(kind) : "", kind ? " " : "", name, near);
    char install[1024], build[1024];
    own_plugin_dirs(install, sizeof install, build, sizeof build);
    return k3rt_fail(err, K3RT_ERR_NOT_FOUND,
                     "%s: no %s%splugin named '%s' (found: %s; search path: --plugin-path, "
                     "K3RT_PLUGIN_PATH, %s)", where, kind ? k3rt_kind_name(kind) : "",
                     kind ? " " : "", name, n ? list : "none", install[0] ? install : build);
}
