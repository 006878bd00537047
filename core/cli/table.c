/* The table of subcommands. */
#include <k3rt/plugin.h>

#include "cli/commands.h"

static const cli_command g_commands[] = {
    {"train", cmd_train},
    {"eval", cmd_eval},
    {"sample", cmd_sample},
    {"op", cmd_op},
    {"plugins", cmd_plugins},
    {"check-plugin", cmd_check_plugin},
    {"plan", cmd_plan},
    {"ablate", cmd_ablate},
    {"launch", cmd_launch},
    {"plot", cmd_plot},
    {"export", cmd_export},
    {"import", cmd_import},
    {0, 0},
};

const cli_command *cli_commands(void) { return g_commands; }
const char *cli_version(void) { return k3rt_version_string(); }
