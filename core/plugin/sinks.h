/* The concrete sinks behind k3rt_param_sink, k3rt_tensor_sink and k3rt_saved_sink. */
#ifndef K3RT_PLUGIN_SINKS_H
#define K3RT_PLUGIN_SINKS_H

#include <k3rt/plugin.h>
#include <stdlib.h>
#include <string.h>

typedef struct param_sink_item {
    k3rt_param_decl decl;  /* decl.name points at name below */
    char name[128];
} param_sink_item;

struct k3rt_param_sink {
    param_sink_item *items;
    int n, cap;
};

typedef struct tensor_sink_item {
    char name[128];
    k3rt_tensor t;
    int reduce;
} tensor_sink_item;

struct k3rt_tensor_sink {
    tensor_sink_item *items;
    int n, cap;
};

typedef struct saved_sink_item {
    k3rt_saved_decl decl;  /* decl.name points at name below */
    char name[64];
} saved_sink_item;

struct k3rt_saved_sink {
    saved_sink_item *items;
    int n, cap;
};

/* Their storage, freed by the host that collected them (the add functions are the runtime's,
 * which plugins call; the sinks themselves belong to the engine). */
static inline void param_sink_free(k3rt_param_sink *sink)
{
    free(sink->items);
    memset(sink, 0, sizeof *sink);
}

static inline void tensor_sink_free(k3rt_tensor_sink *sink)
{
    free(sink->items);
    memset(sink, 0, sizeof *sink);
}

static inline void saved_sink_free(k3rt_saved_sink *sink)
{
    free(sink->items);
    memset(sink, 0, sizeof *sink);
}

#endif
