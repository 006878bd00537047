/* A plugin's capabilities in words: its caps bits and the optional functions it provides. */
#include "plugin/registry.h"

#include <stdio.h>

static void add(char *buf, size_t len, size_t *at, const char *word)
{
    if (*at < len)
        *at += (size_t)snprintf(buf + *at, len - *at, "%s%s", *at ? "," : "", word);
}

const char *plugin_caps_str(const plugin_entry *e, int with_functions, char *buf, size_t len)
{
    static const struct { uint64_t bit; const char *name; } bits[] = {
        {K3RT_CAP_CPU, "cpu"}, {K3RT_CAP_CUDA, "cuda"}, {K3RT_CAP_F64, "f64"},
        {K3RT_CAP_DETERMINISTIC, "deterministic"}, {K3RT_CAP_DOCUMENTS, "documents"}};
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        if (e->desc.caps & bits[i].bit)
            add(buf, len, &at, bits[i].name);
    if (!with_functions)
        return buf;
    const k3rt_attention_vtable *a = &e->vt.attention;
    switch (e->desc.kind) {
    case K3RT_KIND_ATTENTION:
        if (a->state_layout)
            add(buf, len, &at, "state");
        if (a->cp_summary)
            add(buf, len, &at, "context-parallel");
        if (a->context)
            add(buf, len, &at, "context-prefix");
        if (a->decode_step || a->decode)
            add(buf, len, &at, a->decode_step ? "decode-cache" : "decode");
        break;
    case K3RT_KIND_MOE:
        if (e->vt.moe.dispatch)
            add(buf, len, &at, "expert-parallel");
        break;
    case K3RT_KIND_BALANCER:
        if (e->vt.balancer.aux_loss)
            add(buf, len, &at, "aux-loss");
        break;
    case K3RT_KIND_RESIDUAL:
        if (e->vt.residual.mix_norm)
            add(buf, len, &at, "fused-norm");
        break;
    }
    if (e->inst.saved)
        add(buf, len, &at, "saved-parts");
    return buf;
}
