/* k3rt command-line entry: dispatches to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"

/* OpenMP worker threads spin while they wait for the next parallel region (libgomp spins
 * 300,000 times by default) unless told otherwise. On a machine whose cores are busy with
 * other work, a spinning worker takes the core the thread it waits for needs: on a loaded
 * 2-core machine plan.threads = 2 ran 4x slower than 1. So k3rt waits passively (the workers
 * sleep in the kernel) unless the user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT).
 * libgomp reads its settings while it is being loaded, before main(), and a setenv() from the
 * executable's preinit array does not survive libc's own start-up; so the setting reaches
 * libgomp through one re-exec of this binary with it in the environment (a few milliseconds).
 * If the exec fails, k3rt runs on with the default. */
static void passive_openmp(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) == 0)
        execv("/proc/self/exe", argv);
}

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
            "  launch -n N RECIPE    train with N ranks as processes of this machine\n"
            "  plot RUN_DIR...       loss vs tokens and FLOPs, MaxVio per MoE layer, of runs (SVG)\n"
            "  export CKPT --hf DIR  a checkpoint as a Hugging Face folder (Kimi-Linear layout)\n"
            "  import DIR --recipe R a Hugging Face folder as k3rt weights and a recipe\n"
            "\n"
            "Run 'k3rt <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    passive_openmp(argv);
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
