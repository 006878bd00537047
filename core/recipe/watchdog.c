/* The sandbox watchdog thread (watchdog.h). */
#include "recipe/watchdog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

struct watchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int armed, quit;
    double deadline;
    char message[512];
};

static void *watch(void *arg)
{
    watchdog *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->quit) {
        if (!w->armed) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        if (time_now() >= w->deadline) {
            /* write(2) and _exit: nothing that could wait on a lock the stuck thread holds. */
            ssize_t ignored = write(STDERR_FILENO, w->message, strlen(w->message));
            (void)ignored;
            _exit(1);
        }
        struct timespec ts;
        double at = w->deadline + 0.01;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int watchdog_start(watchdog **out, k3rt_error *err)
{
    *out = NULL;
    watchdog *w = calloc(1, sizeof *w);
    if (!w)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "recipe sandbox: out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the clock time_now() reads */
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return k3rt_fail(err, K3RT_ERR_LIMIT, "recipe sandbox: cannot start its watchdog "
                         "thread");
    }
    *out = w;
    return K3RT_OK;
}

void watchdog_arm(watchdog *w, double deadline, const char *message)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->armed = 1;
    w->deadline = deadline;
    snprintf(w->message, sizeof w->message, "%s\n", message);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void watchdog_disarm(watchdog *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->armed = 0;
    pthread_mutex_unlock(&w->mu);
}

void watchdog_stop(watchdog *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
