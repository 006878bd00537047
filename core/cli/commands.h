/* The k3rt subcommands. Each returns the process exit status: 0 ok, 1 failure, 2 usage. */
#ifndef K3RT_CLI_COMMANDS_H
#define K3RT_CLI_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <k3rt/errors.h>

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);  /* argv[0] is the command name */
} cli_command;

const cli_command *cli_commands(void);  /* terminated by a NULL name */
const char *cli_version(void);

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_op(int argc, char **argv);
int cmd_plugins(int argc, char **argv);
int cmd_check_plugin(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_ablate(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);

/* Shared by the commands: capability bits as "cpu,f64,...", and a --config JSON|@file (NULL
 * gives {}) parsed into a JSON object. */
int cli_load_config(const char *text, json_t **out, k3rt_error *err);

#endif
