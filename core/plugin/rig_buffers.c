/* The instance rig: saved parts and workspace of one (batch, seq) (rig.h). */
#include "plugin/rig.h"

#include <stdlib.h>
#include <string.h>

enum { GUARD = 64, GUARD_BYTE = 0xA5 };

static int64_t align64(int64_t n) { return (n + 63) & ~(int64_t)63; }

int rig_saved_parts(rig *r, int64_t batch, int64_t seq, k3rt_error *err)
{
    r->n_parts = 0;
    if (!r->e->inst.saved) {
        k3rt_memory mem;
        K3RT_TRY(rig_memory(r, batch, seq, &mem, err));
        memset(&r->parts[0], 0, sizeof r->parts[0]);
        r->parts[0].struct_size = sizeof r->parts[0];
        r->parts[0].name = "saved";
        r->parts[0].bytes = mem.saved_bytes;
        r->n_parts = 1;
        return K3RT_OK;
    }
    struct k3rt_saved_sink sink;
    memset(&sink, 0, sizeof sink);
    int rc = rig_fail(r, r->e->inst.saved(r->self, batch, seq, &sink, err), err);
    if (!rc && sink.n > RIG_MAX_SAVED)
        rc = k3rt_fail(err, K3RT_ERR_LIMIT, "%s: declares %d saved parts; the host keeps at "
                       "most %d", r->where, sink.n, RIG_MAX_SAVED);
    for (int i = 0; !rc && i < sink.n; i++) {
        r->parts[i] = sink.items[i].decl;
        snprintf(r->part_names[i], sizeof r->part_names[i], "%s", sink.items[i].name);
        r->parts[i].name = r->part_names[i];
    }
    if (!rc)
        r->n_parts = sink.n;
    saved_sink_free(&sink);
    return rc;
}

int rig_saved_total(rig *r, int64_t batch, int64_t seq, int64_t *bytes, k3rt_error *err)
{
    K3RT_TRY(rig_saved_parts(r, batch, seq, err));
    int64_t total = 0;
    for (int i = 0; i < r->n_parts; i++)
        total += align64(r->parts[i].bytes);
    *bytes = total;
    return K3RT_OK;
}

/* The layout of (batch, seq): saved parts, workspace size and the state layout. */
static int plan_shape(rig *r, int64_t batch, int64_t seq, k3rt_error *err)
{
    if (batch < 1 || seq < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: batch and seq must be >= 1, got %lld x "
                         "%lld", r->where, (long long)batch, (long long)seq);
    K3RT_TRY(rig_memory(r, batch, seq, &r->mem, err));
    K3RT_TRY(rig_saved_parts(r, batch, seq, err));
    r->n_saved = r->n_parts;
    for (int i = 0; i < r->n_saved; i++)
        r->saved_bytes[i] = r->parts[i].bytes;
    memset(&r->state, 0, sizeof r->state);
    if (r->kind == K3RT_KIND_ATTENTION && r->e->vt.attention.state_layout) {
        r->state.struct_size = sizeof r->state;
        K3RT_TRY(rig_fail(r, r->e->vt.attention.state_layout(r->self, batch, &r->state, err),
                          err));
        k3rt_tensor *t[3] = {&r->state.state, &r->state.summary_m, &r->state.summary_b};
        for (int i = 0; i < 3; i++)
            t[i]->device = r->device;
    }
    r->B = batch;
    r->T = seq;
    return K3RT_OK;
}

/* Points the parts into one block, back to back on 64-byte boundaries. */
static void place_parts(rig *r, char *base)
{
    int64_t at = 0;
    r->saved_block = base;
    for (int i = 0; i < r->n_saved; i++) {
        r->saved[i] = base + at;
        at += align64(r->saved_bytes[i]);
    }
}

/* Where the last part ends: a write past it reaches the guard. */
static int64_t saved_end(const rig *r)
{
    int64_t at = 0, end = 0;
    for (int i = 0; i < r->n_saved; i++) {
        end = at + r->saved_bytes[i];
        at += align64(r->saved_bytes[i]);
    }
    return end;
}

int rig_bind_shape(rig *r, int64_t batch, int64_t seq, void *saved, int64_t saved_bytes,
                   void *ws, int64_t ws_bytes, k3rt_error *err)
{
    rig_unbind_shape(r);
    K3RT_TRY(plan_shape(r, batch, seq, err));
    int64_t need = 0;
    for (int i = 0; i < r->n_saved; i++)
        need += align64(r->saved_bytes[i]);
    if (!saved && saved_bytes == RIG_SAVED_POINTED) {
        memset(r->saved, 0, sizeof r->saved);
        r->ws = ws;
        return ws_bytes < r->mem.workspace_bytes || (r->mem.workspace_bytes && !ws)
                   ? k3rt_fail(err, K3RT_ERR_INVALID, "%s: the workspace holds %lld bytes, "
                               "memory() asks %lld", r->where, (long long)ws_bytes,
                               (long long)r->mem.workspace_bytes)
                   : K3RT_OK;
    }
    if ((need && !saved) || saved_bytes < need)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: the saved buffer holds %lld bytes, the "
                         "plugin declares %lld for B=%lld T=%lld", r->where,
                         saved ? (long long)saved_bytes : 0LL, (long long)need,
                         (long long)batch, (long long)seq);
    if ((r->mem.workspace_bytes && !ws) || ws_bytes < r->mem.workspace_bytes)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: the workspace holds %lld bytes, memory() "
                         "asks %lld for B=%lld T=%lld", r->where, ws ? (long long)ws_bytes : 0LL,
                         (long long)r->mem.workspace_bytes, (long long)batch, (long long)seq);
    place_parts(r, saved);
    r->ws = ws;
    return K3RT_OK;
}

static void *alloc_guarded(rig *r, int64_t bytes, k3rt_error *err)
{
    size_t extra = r->guard ? GUARD : 0;
    char *p = k3rt_alloc(r->device, (size_t)bytes + extra + (bytes || extra ? 0 : 1), err);
    if (p && r->guard)
        memset(p + bytes, GUARD_BYTE, GUARD);
    return p;
}

int rig_alloc_shape(rig *r, int64_t batch, int64_t seq, int guard, k3rt_error *err)
{
    rig_unbind_shape(r);
    K3RT_TRY(plan_shape(r, batch, seq, err));
    r->guard = guard && r->device == K3RT_DEVICE_CPU;
    r->own_buffers = 1;
    int64_t end = saved_end(r);
    char *saved = alloc_guarded(r, end, err);
    r->ws = saved ? alloc_guarded(r, r->mem.workspace_bytes, err) : NULL;
    place_parts(r, saved);
    if (!saved || !r->ws) {
        rig_unbind_shape(r);
        return rig_fail(r, err && err->code ? err->code : K3RT_ERR_NOMEM, err);
    }
    return K3RT_OK;
}

static int guard_ok(const void *p, int64_t bytes)
{
    const unsigned char *c = (const unsigned char *)p + bytes;
    for (int i = 0; i < GUARD; i++)
        if (c[i] != GUARD_BYTE)
            return 0;
    return 1;
}

int rig_guards_ok(const rig *r)
{
    if (!r->guard)
        return 1;
    return guard_ok(r->saved_block, saved_end(r)) && guard_ok(r->ws, r->mem.workspace_bytes);
}

int rig_fill_buffers(rig *r, int value, k3rt_error *err)
{
    for (int i = 0; i < r->n_saved; i++)
        if (r->saved_bytes[i])
            K3RT_TRY(k3rt_memset(r->stream, r->saved[i], r->device, value,
                                 (size_t)r->saved_bytes[i], err));
    if (r->mem.workspace_bytes)
        K3RT_TRY(k3rt_memset(r->stream, r->ws, r->device, value,
                             (size_t)r->mem.workspace_bytes, err));
    return K3RT_OK;
}

void rig_point_saved(rig *r, int i, void *p)
{
    if (i >= 0 && i < r->n_saved)
        r->saved[i] = p;
}
