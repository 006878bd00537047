/* The activation manager (actman.h): classes and policies, the regions, and the calls around
 * each module's forward and backward. */
#include "model/actman.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

static int64_t align64(int64_t n) { return (n + 63) & ~(int64_t)63; }

static int managed(const model_module *mm)
{
    return mm->kind == K3RT_KIND_ATTENTION || mm->kind == K3RT_KIND_MOE;
}

static void class_name(const model *m, const model_module *mm, const char *part, char *buf,
                       size_t len)
{
    if (mm->kind == K3RT_KIND_ATTENTION)
        snprintf(buf, len, "mixer.%c.%s", m->layers[mm->layer].mixer_letter, part);
    else
        snprintf(buf, len, "ffn.%s.%s", mm->r.e->desc.name, part);
}

static int find_class(const actman *am, const char *name)
{
    for (int i = 0; i < am->n_cls; i++)
        if (!strcmp(am->cls[i].name, name))
            return i;
    return -1;
}

static int fp8_part(const k3rt_saved_decl *d)
{
    return (d->flags & K3RT_SAVED_GEMM_ONLY) &&
           (d->dtype == K3RT_F32 || d->dtype == K3RT_F64);
}

/* One class entry per (slot, tag, part); parts in module order. */
static int collect(model *m, int64_t B, int64_t T, actman *am, k3rt_error *err)
{
    int cap = 0;
    for (int mi = 0; mi < m->n_mods; mi++) {
        model_module *mm = &m->mods[mi];
        am->mods[mi].moved = -1;
        if (!managed(mm))
            continue;
        K3RT_TRY(rig_saved_parts(&mm->r, B, T, err));
        k3rt_flops fl;
        K3RT_TRY(rig_flops(&mm->r, B, T, &fl, err));
        am->mods[mi].first = am->n_parts;
        am->mods[mi].n = mm->r.n_parts;
        for (int i = 0; i < mm->r.n_parts; i++) {
            const k3rt_saved_decl *d = &mm->r.parts[i];
            if (am->n_parts == cap) {
                cap = cap ? 2 * cap : 64;
                act_part *p = realloc(am->parts, (size_t)cap * sizeof *p);
                act_class *c = realloc(am->cls, (size_t)cap * sizeof *c);
                if (p)
                    am->parts = p;
                if (c)
                    am->cls = c;
                if (!p || !c)
                    return k3rt_fail(err, K3RT_ERR_NOMEM, "activations: out of memory");
            }
            char name[96];
            class_name(m, mm, d->name, name, sizeof name);
            int ci = find_class(am, name);
            if (ci < 0) {
                ci = am->n_cls++;
                act_class *c = &am->cls[ci];
                memset(c, 0, sizeof *c);
                snprintf(c->name, sizeof c->name, "%s", name);
                c->fp8_ok = 1;
                c->module_kind = mm->kind;
            }
            act_class *c = &am->cls[ci];
            c->instances++;
            c->bytes = d->bytes > c->bytes ? d->bytes : c->bytes;
            c->fp8_ok &= fp8_part(d);
            /* Recomputing any part re-runs the whole forward. */
            c->recompute_flops = fl.forward > c->recompute_flops ? fl.forward
                                                                 : c->recompute_flops;
            act_part *p = &am->parts[am->n_parts++];
            memset(p, 0, sizeof *p);
            p->module = mi;
            p->index = i;
            p->cls = ci;
            p->dtype = d->dtype;
            p->bytes = d->bytes;
        }
    }
    return K3RT_OK;
}

static void list_classes(const actman *am, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < am->n_cls && at + 1 < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? ", " : "", am->cls[i].name);
}

/* The pattern that decides class ci: an exact name, else the longest matching pattern. */
static const char *deciding(const json_t *policies, const char *name)
{
    const char *best = NULL, *key;
    json_t *v;
    json_object_foreach((json_t *)policies, key, v) {
        if (!act_glob(key, name))
            continue;
        if (!strcmp(key, name))
            return key;
        if (!best || strlen(key) > strlen(best))
            best = key;
    }
    return best;
}

static int apply_policies(const model *m, actman *am, const json_t *policies, k3rt_error *err)
{
    char classes[2048];
    list_classes(am, classes, sizeof classes);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)policies, key, v) {
        int pol = act_policy_parse(json_string_value(v)), hits = 0, fp8 = 0;
        if (pol < 0 || !act_glob_valid(key))
            return k3rt_fail(err, K3RT_ERR_INVALID, "plan.activations[\"%s\"]: expected a "
                             "class pattern and one of %s", key, ACT_POLICY_LIST);
        for (int i = 0; i < am->n_cls; i++)
            if (act_glob(key, am->cls[i].name)) {
                hits++;
                fp8 += am->cls[i].fp8_ok;
            }
        if (!hits)
            return k3rt_fail(err, K3RT_ERR_INVALID, "plan.activations[\"%s\"] matches no saved "
                             "tensor class; the classes are: %s", key, classes);
        if (pol == ACT_FP8 && !fp8)
            return k3rt_fail(err, K3RT_ERR_INVALID, "plan.activations[\"%s\"] = \"fp8\": none "
                             "of the classes it matches is read only by matrix products "
                             "(K3RT_SAVED_GEMM_ONLY); fp8 never stores norm statistics, softmax "
                             "or router values, recurrent states or gates. Use keep, recompute "
                             "or offload", key);
        if (pol == ACT_FP8 && m->opt.device != K3RT_DEVICE_CPU)
            return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.activations[\"%s\"] = \"fp8\": "
                             "fp8 storage has no CUDA path yet (CPU runs only); use offload or "
                             "recompute on the GPU", key);
    }
    for (int i = 0; i < am->n_cls; i++) {
        const char *k = deciding(policies, am->cls[i].name);
        if (!k)
            continue;
        int pol = act_policy_parse(json_string_value(json_object_get(policies, k)));
        if (pol == ACT_FP8 && !am->cls[i].fp8_ok)
            continue;  /* a glob's fp8 reaches only the eligible classes it matches */
        am->cls[i].policy = pol;
        am->cls[i].fixed = 1;
    }
    return K3RT_OK;
}

/* Offsets and region sizes from the classes' policies. */
static void lay_out(actman *am)
{
    am->keep_bytes = am->scratch_bytes = am->slot_bytes = am->fp8_bytes = am->host_bytes = 0;
    am->n_moved = 0;
    for (int mi = 0; mi < am->n_mods; mi++) {
        act_mod *md = &am->mods[mi];
        md->recompute = 0;
        md->moved = -1;
        for (int i = md->first; i < md->first + md->n; i++)
            md->recompute |= am->cls[am->parts[i].cls].policy == ACT_RECOMPUTE;
        int64_t scratch = 0, slot = 0;
        for (int i = md->first; i < md->first + md->n; i++) {
            act_part *p = &am->parts[i];
            p->policy = md->recompute ? ACT_RECOMPUTE : am->cls[p->cls].policy;
            int64_t b = align64(p->bytes);
            switch (p->policy) {
            case ACT_KEEP: p->home = am->keep_bytes; am->keep_bytes += b; break;
            case ACT_RECOMPUTE: p->home = scratch; scratch += b; break;
            case ACT_OFFLOAD:
                p->home = slot;
                slot += b;
                p->copy = am->host_bytes;
                am->host_bytes += b;
                break;
            default: /* ACT_FP8 */
                p->home = slot;
                slot += b;
                p->copy = am->fp8_bytes;
                am->fp8_bytes += align64(act_fp8_bytes(p->bytes / (int64_t)k3rt_dtype_size(
                                                                         p->dtype)));
            }
        }
        if (md->n && slot) {
            md->moved = am->n_moved;
            am->moved_mod[am->n_moved++] = mi;
        }
        am->scratch_bytes = scratch > am->scratch_bytes ? scratch : am->scratch_bytes;
        am->slot_bytes = slot > am->slot_bytes ? slot : am->slot_bytes;
    }
    /* A module in its backward, `prefetch` layers (two modules each) loading ahead. */
    int want = 2 * am->prefetch + 1;
    am->n_slots = am->n_moved < want ? am->n_moved : want;
}

/* The planner's choice: exact names, only classes the recipe left free. */
static int apply_planned(actman *am, const json_t *planned, k3rt_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)planned, key, v) {
        int pol = act_policy_parse(json_string_value(v)), hit = 0;
        for (int i = 0; i < am->n_cls; i++) {
            if (strcmp(key, am->cls[i].name))
                continue;
            hit = 1;
            if (!am->cls[i].fixed && pol >= 0 && (pol != ACT_FP8 || am->cls[i].fp8_ok))
                am->cls[i].policy = pol;
        }
        if (!hit || pol < 0)
            return k3rt_fail(err, K3RT_ERR_INVALID, "activations: the planner chose '%s' for "
                             "'%s', which is not a saved-tensor class of this model",
                             json_string_value(v) ? json_string_value(v) : "?", key);
    }
    return K3RT_OK;
}

int actman_plan(model *m, int64_t B, int64_t T, const json_t *policies, actman *am,
                k3rt_error *err)
{
    return actman_plan_with(m, B, T, policies, NULL, am, err);
}

int actman_plan_with(model *m, int64_t B, int64_t T, const json_t *policies,
                     const json_t *planned, actman *am, k3rt_error *err)
{
    memset(am, 0, sizeof *am);
    am->n_mods = m->n_mods;
    am->prefetch = 1;
    am->poison = 1;
    am->mods = calloc((size_t)m->n_mods, sizeof *am->mods);
    am->moved_mod = calloc((size_t)m->n_mods, sizeof *am->moved_mod);
    int rc = am->mods && am->moved_mod ? K3RT_OK
                                       : k3rt_fail(err, K3RT_ERR_NOMEM, "activations: out of "
                                                   "memory");
    if (!rc)
        rc = collect(m, B, T, am, err);
    if (!rc && policies)
        rc = apply_policies(m, am, policies, err);
    if (!rc && planned)
        rc = apply_planned(am, planned, err);
    if (rc) {
        actman_free(am);
        return rc;
    }
    lay_out(am);
    return K3RT_OK;
}

int64_t actman_device_bytes(const actman *am)
{
    return am->keep_bytes + am->scratch_bytes + (int64_t)am->n_slots * am->slot_bytes +
           am->fp8_bytes;
}

static char *slot_base(const actman *am, int k)
{
    return am->dev + am->keep_bytes + am->scratch_bytes +
           (int64_t)(k % am->n_slots) * am->slot_bytes;
}

/* Points module mi's parts; moved parts into the slot of sequence number k. */
static void point(model *m, int mi, int k)
{
    actman *am = m->am;
    const act_mod *md = &am->mods[mi];
    for (int i = md->first; i < md->first + md->n; i++) {
        const act_part *p = &am->parts[i];
        char *at = p->policy == ACT_KEEP        ? am->dev + p->home
                   : p->policy == ACT_RECOMPUTE ? am->dev + am->keep_bytes + p->home
                                                : slot_base(am, k) + p->home;
        rig_point_saved(&m->mods[mi].r, p->index, at);
    }
}

int actman_place(model *m, actman *am, void *dev, k3rt_error *err)
{
    am->dev = dev;
    if (am->host_bytes) {
        am->host = k3rt_alloc(K3RT_DEVICE_CPU, (size_t)am->host_bytes, err);
        if (!am->host)
            return err ? err->code : K3RT_ERR_NOMEM;
    }
    for (int mi = 0; mi < m->n_mods; mi++)
        if (managed(&m->mods[mi]))
            point(m, mi, 0);
    return K3RT_OK;
}

void actman_free(actman *am)
{
    free(am->cls);
    free(am->parts);
    free(am->mods);
    free(am->moved_mod);
    k3rt_free(K3RT_DEVICE_CPU, am->host);
    memset(am, 0, sizeof *am);
}

int actman_before_forward(model *m, int mi, k3rt_error *err)
{
    (void)err;
    if (!m->am || !managed(&m->mods[mi]))
        return K3RT_OK;
    /* On a copy stream this would wait for the store of the slot's previous user
     * (moved - n_slots); on the compute stream the order is given. */
    point(m, mi, m->am->mods[mi].moved < 0 ? 0 : m->am->mods[mi].moved);
    if (m->am->mods[mi].moved >= 0 && m->am->peak_slots < 1)
        m->am->peak_slots = 1;  /* the forward writes into one slot at a time */
    return K3RT_OK;
}

/* Store issue: the moved parts of module mi leave the slot; the slot is poisoned. */
static int store(model *m, int mi, k3rt_error *err)
{
    actman *am = m->am;
    const act_mod *md = &am->mods[mi];
    k3rt_stream *st = m->opt.stream;
    for (int i = md->first; i < md->first + md->n; i++) {
        const act_part *p = &am->parts[i];
        char *src = slot_base(am, md->moved) + p->home;
        if (p->policy == ACT_OFFLOAD)
            K3RT_TRY(k3rt_memcpy(st, am->host + p->copy, K3RT_DEVICE_CPU, src, m->opt.device,
                                 (size_t)p->bytes, err));
        else if (p->policy == ACT_FP8)
            act_fp8_store(src, p->dtype, p->bytes / (int64_t)k3rt_dtype_size(p->dtype),
                          am->dev + am->keep_bytes + am->scratch_bytes +
                              (int64_t)am->n_slots * am->slot_bytes + p->copy);
        else
            continue;
        if (am->poison)  /* 0xFF bytes read as NaN in every float dtype */
            K3RT_TRY(k3rt_memset(st, src, m->opt.device, 0xFF, (size_t)p->bytes, err));
    }
    am->stores++;
    return K3RT_OK;
}

int actman_after_forward(model *m, int mi, int training, k3rt_error *err)
{
    if (!m->am || !managed(&m->mods[mi]) || !training || m->am->mods[mi].moved < 0)
        return K3RT_OK;
    return store(m, mi, err);
}

/* Load issue of the moved module with backward sequence number j. */
static int load(model *m, int j, k3rt_error *err)
{
    actman *am = m->am;
    int mi = am->moved_mod[am->n_moved - 1 - j];
    const act_mod *md = &am->mods[mi];
    for (int i = md->first; i < md->first + md->n; i++) {
        const act_part *p = &am->parts[i];
        char *dst = slot_base(am, j) + p->home;
        if (p->policy == ACT_OFFLOAD)
            K3RT_TRY(k3rt_memcpy(m->opt.stream, dst, m->opt.device, am->host + p->copy,
                                 K3RT_DEVICE_CPU, (size_t)p->bytes, err));
        else if (p->policy == ACT_FP8)
            act_fp8_load(am->dev + am->keep_bytes + am->scratch_bytes +
                             (int64_t)am->n_slots * am->slot_bytes + p->copy,
                         p->bytes / (int64_t)k3rt_dtype_size(p->dtype), dst, p->dtype);
    }
    am->loads++;
    return K3RT_OK;
}

void actman_begin_backward(model *m)
{
    if (m->am)
        m->am->next_load = 0;
}

int actman_before_backward(model *m, int mi, int *recompute, k3rt_error *err)
{
    *recompute = 0;
    actman *am = m->am;
    if (!am || !managed(&m->mods[mi]))
        return K3RT_OK;
    const act_mod *md = &am->mods[mi];
    if (md->recompute) {
        point(m, mi, 0);
        *recompute = 1;
        am->recomputes++;
        return K3RT_OK;
    }
    if (md->moved < 0)
        return K3RT_OK;
    int j = am->n_moved - 1 - md->moved;
    am->late_loads += am->next_load <= j;
    /* Prefetch: this module's load and the next n_slots - 1 in backward order (their slots
     * are free: the modules that used them have finished their backward). */
    while (am->next_load < am->n_moved && am->next_load < j + am->n_slots)
        K3RT_TRY(load(m, am->next_load++, err));
    /* Load wait: on a copy stream, the compute stream waits for this slot's event here. */
    point(m, mi, j);
    int held = am->next_load - j;  /* this module's slot and those loaded ahead */
    am->peak_slots = held > am->peak_slots ? held : am->peak_slots;
    return K3RT_OK;
}

void actman_print(const actman *am, FILE *f)
{
    fprintf(f, "%-32s %-5s %-10s %s\n", "SAVED CLASS", "x", "POLICY", "MIB EACH");
    for (int i = 0; i < am->n_cls; i++)
        fprintf(f, "%-32s %-5d %-10s %.2f%s\n", am->cls[i].name, am->cls[i].instances,
                act_policy_name(am->cls[i].policy), (double)am->cls[i].bytes / (1 << 20),
                am->cls[i].fixed ? " (recipe)" : "");
    fprintf(f, "saved parts: kept %.2f MiB, recompute scratch %.2f MiB, %d staging slot%s of "
            "%.2f MiB, fp8 %.2f MiB on the device; host arena %.2f MiB\n",
            (double)am->keep_bytes / (1 << 20), (double)am->scratch_bytes / (1 << 20),
            am->n_slots, am->n_slots == 1 ? "" : "s", (double)am->slot_bytes / (1 << 20),
            (double)am->fp8_bytes / (1 << 20), (double)am->host_bytes / (1 << 20));
}

int64_t actman_peak_bytes(const actman *am)
{
    return am->keep_bytes + (am->recomputes ? am->scratch_bytes : 0) +
           (int64_t)am->peak_slots * am->slot_bytes + am->fp8_bytes;
}
