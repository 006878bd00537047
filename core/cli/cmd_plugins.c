/* k3rt plugins: every plugin on the search path with kind, version and capabilities, and every
 * file that failed to load with the reason. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <k3rt/plugin.h>

#include "cli/commands.h"
#include "plugin/registry.h"

static void print_options(const plugin_entry *e)
{
    for (uint32_t i = 0; i < e->desc.n_options; i++) {
        const k3rt_option *o =
            (const k3rt_option *)((const char *)e->desc.options + (size_t)i * e->desc.option_size);
        /* help is the last field: entries built without it end before it */
        const char *help =
            e->desc.option_size >= offsetof(k3rt_option, help) + sizeof o->help ? o->help : 0;
        printf("      %-16s = %-10s %s\n", o->name, o->default_json ? o->default_json : "(required)",
               help ? help : "");
    }
}

int cmd_plugins(int argc, char **argv)
{
    const char *extra = NULL;
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--plugin-path") && i + 1 < argc)
            extra = argv[++i];
        else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v"))
            verbose = 1;
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: k3rt plugins [--plugin-path DIR[:DIR]] [--verbose]\n"
                   "Lists plugins found on --plugin-path, K3RT_PLUGIN_PATH, the install and "
                   "the build directories (in that order; the first of a name wins).\n");
            return 0;
        } else {
            fprintf(stderr, "k3rt plugins: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    registry reg;
    k3rt_error err = {0};
    if (registry_init(&reg, extra, &err)) {
        fprintf(stderr, "k3rt plugins: %s\n", err.msg);
        return 1;
    }
    printf("%-14s %-10s %-8s %-36s %s\n", "NAME", "KIND", "VERSION", "CAPABILITIES", "FILE");
    for (int i = 0; i < reg.n; i++) {
        const plugin_entry *e = &reg.entries[i];
        char caps[192];
        plugin_caps_str(e, 1, caps, sizeof caps);
        printf("%-14s %-10s %-8s %-36s %s%s\n", e->desc.name, k3rt_kind_name(e->desc.kind),
               e->desc.version ? e->desc.version : "?", caps, e->path,
               e->shadowed ? "  (shadowed by an earlier one)" : "");
        if (verbose) {
            if (e->desc.description)
                printf("      %s\n", e->desc.description);
            print_options(e);
        }
    }
    for (int i = 0; i < reg.n_failures; i++)
        fprintf(stderr, "error: %s\n", reg.failures[i].reason);
    int rc = reg.n_failures ? 1 : 0;
    registry_free(&reg);
    return rc;
}
