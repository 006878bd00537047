/* The plugin options shared by train, eval and sample: --plugin-path DIRS and --plugin PATH
 * (repeatable). */
#ifndef K3RT_CLI_PLUGIN_ARGS_H
#define K3RT_CLI_PLUGIN_ARGS_H

#include "plugin/named.h"

#define CLI_PLUGIN_USAGE                                                                    \
    "  --plugin-path DIRS   extra plugin directories (':'-separated), searched first\n"       \
    "  --plugin PATH        load this plugin file (repeatable); a checkpoint that names a\n"  \
    "                       plugin by its file needs it named here or in the recipe\n"

/* Consumes argv[*i] and its value when it is one of the two options: returns 1 then, 0 when it
 * is not one of them, -1 (with a message on stderr) for more --plugin files than fit. */
int cli_plugin_arg(int argc, char **argv, int *i, plugin_sources *src);

#endif
