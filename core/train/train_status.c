/* The rank files k3rt launch reads (train_internal.h: status_open). One short line, "pid
 * step", rewritten in place after each step: the launcher reads it when a rank dies to say
 * which step it was at. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train_internal.h"

void status_open(run *r, int rank)
{
    const char *dir = getenv("K3RT_LAUNCH_DIR");
    r->status_fd = -1;
    if (!dir || !*dir)
        return;
    char path[1200];
    snprintf(path, sizeof path, "%s/rank.%d", dir, rank);
    r->status_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    status_step(r, 0);
}

void status_step(run *r, int64_t step)
{
    if (r->status_fd < 0)
        return;
    char line[64];
    int n = snprintf(line, sizeof line, "%ld %-20lld\n", (long)getpid(), (long long)step);
    if (pwrite(r->status_fd, line, (size_t)n, 0) != n)
        r->status_fd = -1;  /* best effort: the launcher then reports the step as unknown */
}

void status_close(run *r)
{
    if (r->status_fd >= 0)
        close(r->status_fd);
    r->status_fd = -1;
}
