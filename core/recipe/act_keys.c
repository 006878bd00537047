/* The recipe's activation keys (act_keys.h). */
#include "recipe/act_keys.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const NAMES[ACT_POLICIES] = {"keep", "recompute", "offload", "fp8"};

const char *act_policy_name(int policy)
{
    return policy >= 0 && policy < ACT_POLICIES ? NAMES[policy] : "?";
}

int act_policy_parse(const char *name)
{
    for (int i = 0; name && i < ACT_POLICIES; i++)
        if (!strcmp(name, NAMES[i]))
            return i;
    return -1;
}

int act_glob_valid(const char *p)
{
    if (!p || !*p)
        return 0;
    for (; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("_.*?", *p))
            return 0;
    return 1;
}

int act_budget_parse(const char *text, double *bytes, double *fraction)
{
    static const struct { const char *unit; double scale; } UNITS[] = {
        {"%", 0}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"TiB", 1099511627776.0},
        {"GiB", 1073741824.0}, {"MiB", 1048576.0}};
    char *end;
    *bytes = *fraction = 0;
    if (!text)
        return -1;
    double v = strtod(text, &end);
    if (end == text || !(v > 0) || v > 1e18)
        return -1;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcasecmp(end, UNITS[i].unit))
            continue;
        if (!UNITS[i].scale) {
            if (v > 100)
                return -1;
            *fraction = v / 100;
        } else {
            *bytes = v * UNITS[i].scale;
        }
        return 0;
    }
    return -1;
}
