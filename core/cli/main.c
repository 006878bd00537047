/* k3rt command-line entry: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void usage(FILE *to)
{
    fprintf(to,
            "usage: k3rt <command> [options]\n"
            "\n"
            "commands:\n"
            "  train RECIPE.lua      train a model (--resume, --set key=value, --out DIR, --dry-run)\n"
            "  eval CHECKPOINT       validation loss of a checkpoint\n"
            "  sample CHECKPOINT     generate text from a checkpoint\n"
            "  op NAME|PATH          run one plugin outside a model on safetensors in/out\n"
            "  plugins               list the plugins found on the search path\n"
            "  check-plugin PATH     conformance checks of one plugin (any kind)\n"
            "  plan RECIPE.lua       parameters, FLOPs and memory per GPU of a recipe on N GPUs\n"
            "  ablate SUITE.lua      train a base recipe and its variants, compare loss vs FLOPs\n"
            "\n"
            "Run 'k3rt <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version")) {
        printf("k3rt %s\n", cli_version());
        return 0;
    }
    for (const cli_command *c = cli_commands(); c->name; c++)
        if (!strcmp(c->name, cmd))
            return c->run(argc - 1, argv + 1);
    fprintf(stderr, "k3rt: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
