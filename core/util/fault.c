/* Fault injection (fault.h). */
#include "util/fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fault_point(const char *point, int64_t step)
{
    const char *want = getenv("K3RT_FAULT");
    if (!want)
        return;
    char here[96];
    snprintf(here, sizeof here, "%s:%lld", point, (long long)step);
    if (!strcmp(want, here))
        raise(SIGKILL);
}
