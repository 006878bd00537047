/* Console output (k3rt/host.h; the core reaches it through util/log.h). */
#define _POSIX_C_SOURCE 200809L
#include <k3rt/host.h>

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int g_level = K3RT_LOG_INFO;

void k3rt_log_set_level(int level) { g_level = level; }
int k3rt_log_level(void) { return g_level; }

static void vlog(FILE *to, const char *prefix, const char *fmt, va_list ap)
{
    fputs(prefix, to);
    vfprintf(to, fmt, ap);
    fputc('\n', to);
    fflush(to);
}

void k3rt_log_info(const char *fmt, ...)
{
    if (g_level < K3RT_LOG_INFO)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(stdout, "", fmt, ap);
    va_end(ap);
}

void k3rt_log_debug(const char *fmt, ...)
{
    if (g_level < K3RT_LOG_DEBUG)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "debug: ", fmt, ap);
    va_end(ap);
}

void k3rt_log_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "warning: ", fmt, ap);
    va_end(ap);
}

double k3rt_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
