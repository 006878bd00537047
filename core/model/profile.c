/* Timed spans of a training step (profile.h). */
#include "model/profile.h"

#include <k3rt/host.h>

#include <stdlib.h>
#include <string.h>

int profile_create(profile **out, k3rt_stream *s, int device, k3rt_error *err)
{
    profile *p = calloc(1, sizeof *p);
    if (!p)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "profile: out of memory");
    p->stream = s;
    p->device = device;
    *out = p;
    return K3RT_OK;
}

void profile_free(profile *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_ev; i++)
        k3rt_event_destroy(p->ev[i]);
    free(p->ev);
    free(p->span_row);
    free(p->ms);
    free(p->calls);
    free(p);
}

static int grow_rows(profile *p, int n, k3rt_error *err)
{
    if (n <= p->n_rows)
        return K3RT_OK;
    double *ms = realloc(p->ms, (size_t)n * sizeof *ms);
    if (ms)
        p->ms = ms;
    int64_t *calls = realloc(p->calls, (size_t)n * sizeof *calls);
    if (calls)
        p->calls = calls;
    if (!ms || !calls)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "profile: out of memory");
    memset(p->ms + p->n_rows, 0, (size_t)(n - p->n_rows) * sizeof *ms);
    memset(p->calls + p->n_rows, 0, (size_t)(n - p->n_rows) * sizeof *calls);
    p->n_rows = n;
    return K3RT_OK;
}

int profile_step_begin(profile *p, int n_mods, k3rt_error *err)
{
    K3RT_TRY(grow_rows(p, profile_module_row(n_mods, 0), err));
    p->n_span = 0;
    p->depth = 0;
    K3RT_TRY(k3rt_stream_sync(p->stream, err));
    p->t0 = k3rt_time_now();
    p->waits0 = k3rt_host_wait_count();  /* after the profiler's own wait */
    return K3RT_OK;
}

/* Span i records into events 2i and 2i + 1; span_row holds 2 row + (a resumed span: the outer
 * part of a nested one, which is no new call). */
static int open_span(profile *p, int row, int resumed, k3rt_error *err)
{
    if (p->n_span == p->cap_span) {
        int cap = p->cap_span ? 2 * p->cap_span : 256;
        int *rows = realloc(p->span_row, (size_t)cap * sizeof *rows);
        if (!rows)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "profile: out of memory");
        p->span_row = rows;
        p->cap_span = cap;
    }
    while (p->n_ev < 2 * (p->n_span + 1)) {
        k3rt_event **ev = realloc(p->ev, (size_t)(p->n_ev + 1) * sizeof *ev);
        if (!ev)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "profile: out of memory");
        p->ev = ev;
        K3RT_TRY(k3rt_event_create_timed(p->device, &p->ev[p->n_ev], err));
        p->n_ev++;
    }
    p->span_row[p->n_span] = 2 * row + resumed;
    return k3rt_event_record(p->ev[2 * p->n_span], p->stream, err);
}

static int close_span(profile *p, k3rt_error *err)
{
    K3RT_TRY(k3rt_event_record(p->ev[2 * p->n_span + 1], p->stream, err));
    p->n_span++;
    return K3RT_OK;
}

int profile_begin(profile *p, int row, k3rt_error *err)
{
    if (row < 0 || row >= p->n_rows || p->depth == PROF_DEPTH)
        return k3rt_fail(err, K3RT_ERR_INVALID, "profile: part %d at depth %d (of %d parts, "
                         "%d deep at most)", row, p->depth, p->n_rows, PROF_DEPTH);
    if (p->depth)
        K3RT_TRY(close_span(p, err));
    p->stack[p->depth++] = row;
    return open_span(p, row, 0, err);
}

int profile_end(profile *p, k3rt_error *err)
{
    if (!p->depth)
        return k3rt_fail(err, K3RT_ERR_INVALID, "profile: a part ends that never began");
    K3RT_TRY(close_span(p, err));
    p->depth--;
    return p->depth ? open_span(p, p->stack[p->depth - 1], 1, err) : K3RT_OK;
}

int profile_step_end(profile *p, int count, k3rt_error *err)
{
    if (p->depth)
        return k3rt_fail(err, K3RT_ERR_INVALID, "profile: part %d still open at the end of "
                         "the step", p->stack[p->depth - 1]);
    int64_t waits = k3rt_host_wait_count() - p->waits0;  /* before the profiler's own wait */
    K3RT_TRY(k3rt_stream_sync(p->stream, err));
    double wall = 1e3 * (k3rt_time_now() - p->t0);
    if (!count)
        return K3RT_OK;
    p->waits += waits;
    for (int i = 0; i < p->n_span; i++) {
        double ms;
        K3RT_TRY(k3rt_event_elapsed_ms(p->ev[2 * i], p->ev[2 * i + 1], &ms, err));
        int row = p->span_row[i] / 2;
        p->ms[row] += ms;
        p->calls[row] += !(p->span_row[i] % 2);
    }
    p->wall_ms += wall;
    p->steps++;
    return K3RT_OK;
}
