/* `k3rt train --profile N` (rank 0): which steps are profiled, and their table, printed and
 * written into metrics.jsonl as one {"step", "profile"} record. The run itself goes on as
 * without it: the timing only reads clocks and events, it changes no number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/profile.h"
#include "train/train_internal.h"

#define PROF_WARMUP 2

/* The N steps profiled follow up to two warm-up steps of this run (timed and dropped, so the
 * events exist and the caches are warm); a run shorter than N + 2 steps warms up less, and
 * one shorter than N profiles every step it runs. */
int train_profile_setup(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    int64_t end = r->opt.stop_after > 0 && r->opt.stop_after < r->steps ? r->opt.stop_after
                                                                         : r->steps;
    int64_t left = end - r->start_step;
    if (c->rank != 0 || r->opt.profile <= 0 || left <= 0)
        return K3RT_OK;
    int64_t n = r->opt.profile < left ? r->opt.profile : left;
    int64_t warm = left - n < PROF_WARMUP ? left - n : PROF_WARMUP;
    c->prof_first = r->start_step + warm + 1;
    c->prof_last = c->prof_first + n - 1;
    return profile_create(&c->prof, c->stream, r->device, err);
}

int train_profile_begin(rank_ctx *c, int64_t step, k3rt_error *err)
{
    if (!c->prof || step < c->prof_first - PROF_WARMUP || step > c->prof_last)
        return K3RT_OK;
    K3RT_TRY(profile_step_begin(c->prof, c->m.n_mods, err));
    c->m.prof = c->prof;
    return K3RT_OK;
}

typedef struct prof_row {
    char part[128];
    const char *direction;
    int64_t calls;
    double ms;
} prof_row;

static const struct {
    int row;
    const char *part, *direction;
} ENGINE_PARTS[] = {
    {PROF_DATA, "data", "step"},
    {PROF_EMBED_FWD, "embedding", "forward"},
    {PROF_NORM_FWD, "norms (engine RMSNorm)", "forward"},
    {PROF_HEAD_FWD, "head+loss", "forward"},
    {PROF_HEAD_BWD, "head+loss", "backward"},
    {PROF_NORM_BWD, "norms (engine RMSNorm)", "backward"},
    {PROF_EMBED_BWD, "embedding", "backward"},
    {PROF_STATS, "statistics", "step"},
    {PROF_COMM, "communication", "step"},
    {PROF_GRAD_NORM, "gradient norm+clip", "step"},
    {PROF_OPTIMIZER, "optimizer", "step"},
};

/* The table's rows in step order: the engine's parts, each module instance's forward and
 * backward (a balancer's calls as one "step" row), means per profiled step. */
static int collect_rows(const rank_ctx *c, prof_row **out, int *n_out, k3rt_error *err)
{
    const profile *p = c->prof;
    const model *m = &c->m;
    int n_engine = (int)(sizeof ENGINE_PARTS / sizeof ENGINE_PARTS[0]);
    prof_row *rows = calloc((size_t)(n_engine + 2 * m->n_mods), sizeof *rows);
    if (!rows)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "profile: out of memory");
    double steps = (double)p->steps;
    int n = 0;
    for (int i = 0; i < n_engine; i++) {
        int row = ENGINE_PARTS[i].row;
        if (row == PROF_OPTIMIZER)
            snprintf(rows[n].part, sizeof rows[n].part, "optimizer (%s)", c->opt.e->desc.name);
        else
            snprintf(rows[n].part, sizeof rows[n].part, "%s", ENGINE_PARTS[i].part);
        rows[n].direction = ENGINE_PARTS[i].direction;
        rows[n].calls = p->calls[row];
        rows[n++].ms = p->ms[row] / steps;
    }
    for (int mi = 0; mi < m->n_mods && profile_module_row(mi, 1) < p->n_rows; mi++) {
        const model_module *mm = &m->mods[mi];
        int bal = mm->kind == K3RT_KIND_BALANCER;
        for (int dir = 0; dir < 2 - bal; dir++) {
            int row = profile_module_row(mi, dir);
            /* the prefix without its dot: "layers.3.mixer (kda)" */
            snprintf(rows[n].part, sizeof rows[n].part, "%.*s (%s)",
                     (int)strlen(mm->prefix) - 1, mm->prefix, mm->r.e->desc.name);
            rows[n].direction = bal ? "step" : dir ? "backward" : "forward";
            rows[n].calls = p->calls[row];
            rows[n++].ms = p->ms[row] / steps;
        }
    }
    *out = rows;
    *n_out = n;
    return K3RT_OK;
}

static void print_table(const rank_ctx *c, const prof_row *rows, int n, double parts,
                        double wall)
{
    const profile *p = c->prof;
    printf("profile of step%s %lld-%lld (%lld warm-up step%s before), mean per step, %s:\n",
           p->steps > 1 ? "s" : "", (long long)c->prof_first, (long long)c->prof_last,
           (long long)(c->prof_first - 1 - c->r->start_step),
           c->prof_first - 1 - c->r->start_step == 1 ? "" : "s",
           c->r->device == K3RT_DEVICE_CPU ? "host clock (the CPU stream runs inline)"
                                           : "CUDA events on the compute stream");
    printf("  %-44s %-9s %9s %11s %7s\n", "part", "direction", "calls", "ms", "share");
    for (int i = 0; i < n; i++)
        printf("  %-44s %-9s %9.1f %11.3f %6.1f%%\n", rows[i].part, rows[i].direction,
               (double)rows[i].calls / (double)p->steps, rows[i].ms,
               wall > 0 ? 100 * rows[i].ms / wall : 0);
    printf("  %-44s %-9s %9s %11.3f %6.1f%%\n", "sum of the parts", "", "", parts,
           wall > 0 ? 100 * parts / wall : 0);
    printf("  %-44s %-9s %9s %11.3f %6.1f%%\n", "gap (launches, host work, syncs)", "", "",
           wall - parts, wall > 0 ? 100 * (wall - parts) / wall : 0);
    printf("  %-44s %-9s %9s %11.3f\n", "step (wall)", "", "", wall);
    printf("  host waits per step: %.1f (k3rt_stream_sync calls and copies from the device to "
           "the host%s)\n", (double)p->waits / (double)p->steps,
           c->r->device == K3RT_DEVICE_CPU ? "; on the CPU the calls wait nowhere" : "");
    fflush(stdout);
}

static int report(rank_ctx *c, k3rt_error *err)
{
    const profile *p = c->prof;
    prof_row *rows = NULL;
    int n = 0;
    K3RT_TRY(collect_rows(c, &rows, &n, err));
    double parts = 0, wall = p->wall_ms / (double)p->steps;
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        parts += rows[i].ms;
        json_array_append_new(list, json_pack("{s:s, s:s, s:f, s:f}", "part", rows[i].part,
                                              "direction", rows[i].direction, "calls",
                                              (double)rows[i].calls / (double)p->steps, "ms",
                                              rows[i].ms));
    }
    print_table(c, rows, n, parts, wall);
    free(rows);
    json_t *rec = json_pack("{s:I, s:{s:I, s:I, s:I, s:s, s:f, s:f, s:f, s:f, s:o}}", "step",
                            (json_int_t)c->prof_last, "profile", "first_step",
                            (json_int_t)c->prof_first, "last_step", (json_int_t)c->prof_last,
                            "steps", (json_int_t)p->steps, "timer",
                            c->r->device == K3RT_DEVICE_CPU ? "host" : "cuda_events",
                            "step_ms", wall, "parts_ms", parts, "gap_ms", wall - parts,
                            "host_waits_per_step", (double)p->waits / (double)p->steps, "parts",
                            list);
    int rc = train_write_record(c->r, rec, err);
    json_decref(rec);
    return rc;
}

int train_profile_end(rank_ctx *c, int64_t step, k3rt_error *err)
{
    if (!c->m.prof)
        return K3RT_OK;
    c->m.prof = NULL;
    K3RT_TRY(profile_step_end(c->prof, step >= c->prof_first, err));
    return step == c->prof_last ? report(c, err) : K3RT_OK;
}

void train_profile_free(rank_ctx *c)
{
    c->m.prof = NULL;
    profile_free(c->prof);
    c->prof = NULL;
}
