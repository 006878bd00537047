/* A command's plugin sources (named.h). */
#define _GNU_SOURCE /* realpath */
#include "plugin/named.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

const plugin_entry *registry_find_file(const registry *reg, const char *path, int kind)
{
    char want[PATH_MAX], have[PATH_MAX];
    int canonical = realpath(path, want) != NULL;
    for (int i = 0; i < reg->n; i++) {
        const plugin_entry *e = &reg->entries[i];
        if (kind && e->desc.kind != kind)
            continue;
        if (!strcmp(e->path, path) ||
            (canonical && realpath(e->path, have) && !strcmp(have, want)))
            return e;
    }
    return NULL;
}

int registry_open(registry *reg, const plugin_sources *src, k3rt_error *err)
{
    K3RT_TRY(registry_init(reg, src ? src->dirs : NULL, err));
    for (int i = 0; src && i < src->n_files; i++) {
        char full[PATH_MAX];
        if (!realpath(src->files[i], full))
            return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "--plugin %s: %s", src->files[i],
                             strerror(errno));
        const plugin_entry *e;
        K3RT_TRY(registry_load_file(reg, full, &e, err));
    }
    return K3RT_OK;
}
