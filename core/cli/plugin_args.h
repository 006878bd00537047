/* The options shared by train, eval and sample: --plugin-path DIRS and --plugin PATH
 * (repeatable); --device auto|cpu|cuda for eval and sample. */
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

/* Consumes --device and its value into *device: 1 then, 0 when argv[*i] is not --device, -1
 * (with a message naming `cmd` on stderr) for a value other than auto, cpu or cuda. */
int cli_device_arg(const char *cmd, int argc, char **argv, int *i, const char **device);

#endif
