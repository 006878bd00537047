/* --plugin-path, --plugin and --device (plugin_args.h). */
#include "cli/plugin_args.h"

#include <stdio.h>
#include <string.h>

int cli_plugin_arg(int argc, char **argv, int *i, plugin_sources *src)
{
    const char *a = argv[*i];
    if (*i + 1 >= argc)
        return 0;
    if (!strcmp(a, "--plugin-path")) {
        src->dirs = argv[++*i];
        return 1;
    }
    if (strcmp(a, "--plugin"))
        return 0;
    if (src->n_files == PLUGIN_SOURCES_MAX_FILES) {
        fprintf(stderr, "k3rt: more than %d --plugin files\n", PLUGIN_SOURCES_MAX_FILES);
        return -1;
    }
    src->files[src->n_files++] = argv[++*i];
    return 1;
}

int cli_device_arg(const char *cmd, int argc, char **argv, int *i, const char **device)
{
    if (strcmp(argv[*i], "--device") || *i + 1 >= argc)
        return 0;
    const char *v = argv[++*i];
    if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")) {
        fprintf(stderr, "k3rt %s: --device %s: expected auto, cpu or cuda\n", cmd, v);
        return -1;
    }
    *device = v;
    return 1;
}
