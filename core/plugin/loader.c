/* Loading one plugin file: dlopen, the entry symbol, the ABI check, zero-extended copies. */
#define _GNU_SOURCE
#include "plugin/registry.h"

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "util/fs.h"

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Copies what the plugin provided; the rest stays zero ("not provided"). */
static void copy_grown(void *dst, size_t dst_size, const void *src)
{
    uint32_t given;
    memcpy(&given, src, sizeof given);
    memset(dst, 0, dst_size);
    memcpy(dst, src, min_size(given, dst_size));
}

static int valid_name(const char *name)
{
    if (!name || !*name || strlen(name) > 63)
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return 1;
}

static size_t kind_vtable_size(int kind)
{
    switch (kind) {
    case K3RT_KIND_ATTENTION: return sizeof(k3rt_attention_vtable);
    case K3RT_KIND_MOE: return sizeof(k3rt_moe_vtable);
    case K3RT_KIND_BALANCER: return sizeof(k3rt_balancer_vtable);
    case K3RT_KIND_OPTIMIZER: return sizeof(k3rt_optimizer_vtable);
    case K3RT_KIND_RESIDUAL: return sizeof(k3rt_residual_vtable);
    default: return 0;
    }
}

/* The functions a kind cannot work without, and the optional ones that only come together.
 * Returns what is missing, or NULL. */
static const char *missing_required(const plugin_entry *e)
{
    if (!e->inst.create)
        return "instance.create";
    if (!e->inst.destroy)
        return "instance.destroy";
    switch (e->desc.kind) {
    case K3RT_KIND_ATTENTION: {
        const k3rt_attention_vtable *v = &e->vt.attention;
        if (!v->forward || !v->backward)
            return !v->forward ? "forward" : "backward";
        if ((v->cp_summary || v->cp_compose || v->decode) && !v->state_layout)
            return "state_layout (cp_summary, cp_compose and decode need a state)";
        if (!v->cp_summary != !v->cp_compose)
            return "cp_summary and cp_compose together";
        if ((v->kv_project || v->kv_project_backward) && !v->context)
            return "context (kv_project needs it)";
        if (!v->kv_project != !v->kv_project_backward)
            return "kv_project and kv_project_backward together";
        int cached = !!v->cache_create + !!v->decode_step + !!v->cache_destroy;
        if (cached && cached != 3)
            return "cache_create, decode_step and cache_destroy together";
        return NULL;
    }
    case K3RT_KIND_MOE: {
        const k3rt_moe_vtable *v = &e->vt.moe;
        if (!v->forward || !v->backward)
            return !v->forward ? "forward" : "backward";
        int ep = !!v->row_width + !!v->dispatch + !!v->expert_forward + !!v->combine +
                 !!v->combine_backward + !!v->expert_backward + !!v->dispatch_backward;
        if (ep && (ep != 7 || !v->experts))
            return "all seven expert-parallel functions (row_width, dispatch, expert_forward, "
                   "combine and their backwards) and experts, or none of them";
        return NULL;
    }
    case K3RT_KIND_BALANCER:
        if (e->vt.balancer.aux_loss_add && !e->vt.balancer.aux_loss)
            return "aux_loss (aux_loss_add is its device form, not a replacement)";
        return !e->vt.balancer.bias ? "bias" : !e->vt.balancer.update ? "update" : NULL;
    case K3RT_KIND_OPTIMIZER: return !e->vt.optimizer.step ? "step" : NULL;
    case K3RT_KIND_RESIDUAL: {
        const k3rt_residual_vtable *v = &e->vt.residual;
        if (!v->begin || !v->mix || !v->push || !v->finish)
            return "begin/mix/push/finish";
        if (!v->finish_backward || !v->push_backward || !v->mix_backward || !v->begin_backward)
            return "the backward functions";
        if (!v->mix_norm != !v->mix_norm_backward)
            return "mix_norm and mix_norm_backward together";
        if (!v->op_forward != !v->op_backward)
            return "op_forward and op_backward together";
        return NULL;
    }
    }
    return NULL;
}

/* The caps bits this host knows. */
static const uint64_t known_caps = K3RT_CAP_CPU | K3RT_CAP_CUDA | K3RT_CAP_F64 |
                                   K3RT_CAP_DETERMINISTIC | K3RT_CAP_DOCUMENTS;

int plugin_entry_from_descriptor(const k3rt_plugin_descriptor *d, const char *path,
                                 plugin_entry *out, k3rt_error *err)
{
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", path);
    if (!d)
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: k3rt_plugin_entry returned NULL", path);
    const size_t version_end = offsetof(k3rt_plugin_descriptor, abi_minor) + sizeof d->abi_minor;
    if (d->struct_size < version_end)
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: descriptor of %u bytes is too small to hold an ABI version", path,
                         d->struct_size);
    if (d->abi_major < K3RT_ABI_MAJOR)
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: built for plugin ABI %u.%u, but this k3rt speaks ABI %d.%d: "
                         "rebuild it against this k3rt's SDK (docs/plugins.md, \"Moving a "
                         "plugin from ABI 1 to 2\")", path, d->abi_major, d->abi_minor,
                         K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    if (d->abi_major != K3RT_ABI_MAJOR)
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: built for plugin ABI %u.%u, newer than this k3rt's ABI %d.%d: "
                         "upgrade k3rt, or rebuild the plugin against this SDK", path,
                         d->abi_major, d->abi_minor, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    if (d->abi_minor > K3RT_ABI_MINOR)
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: built for plugin ABI %u.%u, newer than this k3rt's ABI %d.%d "
                         "(upgrade k3rt, or rebuild the plugin against this SDK)",
                         path, d->abi_major, d->abi_minor, K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
    copy_grown(&out->desc, sizeof out->desc, d);
    const k3rt_plugin_descriptor *c = &out->desc;
    if (c->struct_size < offsetof(k3rt_plugin_descriptor, vtable) + sizeof(void *))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: descriptor of %u bytes lacks the vtables",
                         path, c->struct_size);
    if (kind_vtable_size(c->kind) == 0)
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: declares unknown plugin kind %d (known: 1 attention, 2 moe, "
                         "3 balancer, 4 optimizer, 5 residual)", path, c->kind);
    if (c->caps & ~known_caps)
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: declares capability bits 0x%llx this k3rt "
                         "does not know", path, (unsigned long long)(c->caps & ~known_caps));
    if (!(c->caps & (K3RT_CAP_CPU | K3RT_CAP_CUDA)))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: declares neither K3RT_CAP_CPU nor "
                         "K3RT_CAP_CUDA: it cannot run anywhere", path);
    if ((c->caps & K3RT_CAP_F64) && !(c->caps & K3RT_CAP_CPU))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s: declares K3RT_CAP_F64 (a CPU dtype) without "
                         "K3RT_CAP_CPU", path);
    if (!valid_name(c->name))
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: plugin name must be 1-63 characters of [a-z0-9_]", path);
    if (!c->instance || !c->vtable)
        return k3rt_fail(err, K3RT_ERR_ABI, "%s (%s): descriptor has no %s vtable", path,
                         c->name, !c->instance ? "instance" : "kind");
    if (c->instance->struct_size < sizeof(uint32_t) + sizeof(void *) ||
        *(const uint32_t *)c->vtable < sizeof(uint32_t) + sizeof(void *))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s (%s): vtable struct_size is too small", path,
                         c->name);
    if (c->n_options && (!c->options || c->option_size < offsetof(k3rt_option, help)))
        return k3rt_fail(err, K3RT_ERR_ABI, "%s (%s): option table is malformed", path,
                         c->name);
    copy_grown(&out->inst, sizeof out->inst, c->instance);
    copy_grown(&out->vt, kind_vtable_size(c->kind), c->vtable);
    const char *missing = missing_required(out);
    if (missing)
        return k3rt_fail(err, K3RT_ERR_ABI, "%s (%s): the %s plugin does not provide %s", path,
                         c->name, k3rt_kind_name(c->kind), missing);
    return K3RT_OK;
}

/* Reads the ELF magic so "not a shared object" is said plainly rather than via dlerror. */
static int looks_like_elf(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    unsigned char m[4] = {0};
    size_t got = fread(m, 1, 4, f);
    fclose(f);
    return got == 4 && m[0] == 0x7f && m[1] == 'E' && m[2] == 'L' && m[3] == 'F';
}

int plugin_load_file(const char *path, plugin_entry *out, k3rt_error *err);

int plugin_load_file(const char *path, plugin_entry *out, k3rt_error *err)
{
    if (!fs_exists(path))
        return k3rt_fail(err, K3RT_ERR_NOT_FOUND, "%s: plugin file does not exist", path);
    if (fs_is_dir(path))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: is a directory, not a plugin file", path);
    if (!looks_like_elf(path))
        return k3rt_fail(err, K3RT_ERR_FORMAT,
                         "%s: not a shared object (no ELF header); expected a plugin built "
                         "as a .so", path);
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return k3rt_fail(err, K3RT_ERR_FORMAT, "%s: cannot be loaded: %s", path,
                         why ? why : "unknown dlopen error");
    }
    dlerror();
    void *sym = dlsym(h, K3RT_PLUGIN_ENTRY_SYMBOL);
    const char *why = dlerror();
    if (why || !sym) {
        dlclose(h);
        return k3rt_fail(err, K3RT_ERR_ABI,
                         "%s: not a k3rt plugin: it does not export %s (define it with "
                         "K3RT_PLUGIN_EXPORT)", path, K3RT_PLUGIN_ENTRY_SYMBOL);
    }
    k3rt_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    int rc = plugin_entry_from_descriptor(entry(), path, out, err);
    if (rc) {
        dlclose(h);
        return rc;
    }
    /* Never unloaded: code in a plugin (CUDA fatbins, static state) may outlive any owner. */
    return K3RT_OK;
}
