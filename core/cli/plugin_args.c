/* --plugin-path and --plugin (plugin_args.h). */
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
