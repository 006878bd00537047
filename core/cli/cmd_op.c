/* k3rt op NAME|PATH: run one attention / moe / residual plugin outside a model on tensors from
 * a safetensors file and write its outputs to another, for comparison with other
 * implementations. The file contract is in docs/file-formats.md ("k3rt op") and --help.
 *
 * Inputs: x [B, T, d] (residual: sources.{j} and optional partial), optional dy (then the
 * backward runs too), optional state_in.state and d_state_out.state (stateful mixers), optional
 * bias [experts] (moe), and parameters by their declared names — missing ones are initialised
 * from --seed and written out as used. Any other name is refused, with the nearest valid one:
 * a misspelt parameter must not fall back to the random init, nor a misnamed dy skip the
 * backward. Outputs: y, grad.x (grad.sources.{j}, grad.partial), grad.<param>,
 * state_out.state, grad.state_in.state, stats.<name>, and every parameter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "plugin/rig.h"
#include "plugin/sinks.h"
#include "train/safetensors.h"
#include "util/fs.h"
#include "util/nearest.h"

typedef struct out_list {
    st_entry *e;
    char (*names)[192];
    void **owned;
    int n, cap;
} out_list;

static int out_add(out_list *o, const char *name, k3rt_tensor t, int copy, k3rt_error *err)
{
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 32;
        st_entry *e = realloc(o->e, (size_t)cap * sizeof *e);
        if (e)
            o->e = e;
        char (*n)[192] = realloc(o->names, (size_t)cap * sizeof *n);
        if (n)
            o->names = n;
        void **w = realloc(o->owned, (size_t)cap * sizeof *w);
        if (w)
            o->owned = w;
        if (!e || !n || !w)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        o->cap = cap;
        for (int i = 0; i < o->n; i++)  /* the names moved with their array */
            o->e[i].name = o->names[i];
    }
    void *data = t.data;
    o->owned[o->n] = NULL;
    if (copy) {
        data = malloc(k3rt_tensor_bytes(&t) + 1);
        if (!data)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        memcpy(data, t.data, k3rt_tensor_bytes(&t));
        o->owned[o->n] = data;
    }
    snprintf(o->names[o->n], sizeof o->names[o->n], "%s", name);
    st_entry *e = &o->e[o->n];
    memset(e, 0, sizeof *e);
    e->name = o->names[o->n];
    e->dtype = t.dtype;
    e->ndim = t.ndim;
    memcpy(e->shape, t.shape, sizeof e->shape);
    e->data = data;
    o->n++;
    return K3RT_OK;
}

static void out_free(out_list *o)
{
    for (int i = 0; i < o->n; i++)
        free(o->owned[i]);
    free(o->e), free(o->names), free(o->owned);
}

/* Every tensor this command allocates, freed at the end. */
typedef struct arena {
    void **p;
    int n, cap;
} arena;

static void *arena_tensor(arena *a, k3rt_tensor *t, int dtype, int ndim, const int64_t *shape)
{
    *t = k3rt_tensor_view(NULL, dtype, K3RT_DEVICE_CPU, ndim, shape[0], ndim > 1 ? shape[1] : 0,
                          ndim > 2 ? shape[2] : 0, ndim > 3 ? shape[3] : 0);
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        void **p = realloc(a->p, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        a->p = p;
        a->cap = cap;
    }
    t->data = calloc(1, k3rt_tensor_bytes(t) + 8);
    a->p[a->n++] = t->data;
    return t->data;
}

static void arena_free(arena *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->p[i]);
    free(a->p);
}

/* Copies input `name` into t when the file has it (shape and float dtype checked). */
static int take_input(const st_file *f, const char *file, const char *name, k3rt_tensor *t,
                      int *found, k3rt_error *err)
{
    const st_entry *e = st_find(f, name);
    *found = e != NULL;
    if (!e)
        return K3RT_OK;
    int same = e->ndim == t->ndim;
    for (int i = 0; same && i < e->ndim; i++)
        same = e->shape[i] == t->shape[i];
    if (!same) {
        char want[96];
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: tensor %s must have shape %s", file, name,
                         k3rt_tensor_shape_str(t, want, sizeof want));
    }
    if (!k3rt_dtype_is_float(e->dtype))
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: tensor %s must be a float tensor", file,
                         name);
    return k3rt_convert(t->data, t->dtype, e->data, e->dtype, k3rt_tensor_numel(t), err);
}

typedef struct op_job {
    const char *file;
    st_file *in;
    rig m;
    int dtype, kind;
    int64_t B, T, d;
    uint64_t seed;
    k3rt_stream *stream;
    arena mem;
    out_list out;
    int backward;
} op_job;

/* Name of parameter i in the files. A residual declares one relative name per layer, so its
 * parameters take the model's names ("layers.{i}.residual.<name>", "residual.<name>"), which
 * are unique and match checkpoints. */
static void param_name(const op_job *j, int i, char *buf, size_t len)
{
    const k3rt_param_decl *d = rig_param(&j->m, i);
    if (j->kind != K3RT_KIND_RESIDUAL)
        snprintf(buf, len, "%s", d->name);
    else if (d->layer >= 0)
        snprintf(buf, len, "layers.%d.residual.%s", d->layer, d->name);
    else
        snprintf(buf, len, "residual.%s", d->name);
}

/* Every input name the plugin reads: a name outside this list is a mistake. */
static int known_input(op_job *j, const char *name)
{
    static const char *const mixer[] = {"x", "dy", "state_in.state", "d_state_out.state", "bias"};
    static const char *const residual[] = {"partial", "dy"};
    const char *const *fixed = j->kind == K3RT_KIND_RESIDUAL ? residual : mixer;
    int n = j->kind == K3RT_KIND_RESIDUAL ? 2 : 5;
    for (int i = 0; i < n; i++)
        if (!strcmp(name, fixed[i]))
            return 1;
    if (j->kind == K3RT_KIND_RESIDUAL && !strncmp(name, "sources.", 8))
        return 1;
    for (int i = 0; i < rig_n_params(&j->m); i++) {
        char pname[192];
        param_name(j, i, pname, sizeof pname);
        if (!strcmp(name, pname))
            return 1;
    }
    return 0;
}

static int refuse_unknown_inputs(op_job *j, k3rt_error *err)
{
    for (int k = 0; k < st_count(j->in); k++) {
        const char *name = st_at(j->in, k)->name;
        if (known_input(j, name))
            continue;
        int n = rig_n_params(&j->m);
        char (*names)[192] = calloc((size_t)n + 6, sizeof *names);
        const char **cand = calloc((size_t)n + 6, sizeof *cand);
        if (!names || !cand) {
            free(names), free(cand);
            return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        }
        int c = 0;
        const char *fixed[] = {"x", "dy", "state_in.state", "d_state_out.state", "bias",
                               "partial"};
        for (int i = 0; i < 6; i++)
            cand[c++] = fixed[i];
        for (int i = 0; i < n; i++) {
            param_name(j, i, names[i], sizeof names[i]);
            cand[c++] = names[i];
        }
        const char *near = nearest_word(name, cand, c);
        int rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: tensor '%s' is not an input of %s%s%s%s "
                           "(inputs: x, dy, state_in.state, d_state_out.state, bias, "
                           "sources.{j}, partial and the parameters; k3rt op --help)", j->file,
                           name, j->m.where, near ? "; did you mean '" : "", near ? near : "",
                           near ? "'?" : "");
        free(names), free(cand);
        return rc;
    }
    return K3RT_OK;
}

static int setup_params(op_job *j, k3rt_error *err)
{
    K3RT_TRY(rig_alloc_params(&j->m, err));
    for (int i = 0; i < rig_n_params(&j->m); i++) {
        int found;
        char name[192];
        param_name(j, i, name, sizeof name);
        K3RT_TRY(take_input(j->in, j->file, name, &j->m.params[i], &found, err));
        if (!found)
            K3RT_TRY(rig_init_param(&j->m, i, j->m.params[i], j->seed, name, err));
        K3RT_TRY(out_add(&j->out, name, j->m.params[i], 0, err));
    }
    return rig_alloc_shape(&j->m, j->B, j->T, 0, err);
}

static int add_grads(op_job *j, k3rt_error *err)
{
    for (int i = 0; i < rig_n_params(&j->m); i++) {
        char name[192], pname[180];
        param_name(j, i, pname, sizeof pname);
        snprintf(name, sizeof name, "grad.%s", pname);
        K3RT_TRY(out_add(&j->out, name, j->m.grads[i], 0, err));
    }
    return K3RT_OK;
}

static int add_stats(op_job *j, k3rt_error *err)
{
    struct k3rt_tensor_sink sink;
    K3RT_TRY(rig_stats(&j->m, &sink, err));
    int rc = K3RT_OK;
    for (int i = 0; i < sink.n && !rc; i++) {
        char name[192];
        snprintf(name, sizeof name, "stats.%s", sink.items[i].name);
        rc = out_add(&j->out, name, sink.items[i].t, 1, err);
    }
    tensor_sink_free(&sink);
    return rc;
}

static int run_mixer(op_job *j, k3rt_error *err)
{
    int64_t shape[3] = {j->B, j->T, j->d};
    k3rt_tensor x, y, dy, dx;
    int found;
    arena_tensor(&j->mem, &x, j->dtype, 3, shape);
    arena_tensor(&j->mem, &y, j->dtype, 3, shape);
    arena_tensor(&j->mem, &dy, j->dtype, 3, shape);
    arena_tensor(&j->mem, &dx, j->dtype, 3, shape);
    if (!x.data || !y.data || !dy.data || !dx.data)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    K3RT_TRY(take_input(j->in, j->file, "x", &x, &found, err));
    K3RT_TRY(take_input(j->in, j->file, "dy", &dy, &j->backward, err));
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = j->backward;
    a.x = x;
    a.y = y;
    k3rt_tensor s_in = {0}, s_out = {0}, ds_out = {0}, ds_in = {0}, bias = {0};
    int have_state = 0, have_ds = 0;
    const k3rt_tensor *layout = &j->m.state.state;
    if (layout->ndim) {
        arena_tensor(&j->mem, &s_in, layout->dtype, layout->ndim, layout->shape);
        arena_tensor(&j->mem, &s_out, layout->dtype, layout->ndim, layout->shape);
        arena_tensor(&j->mem, &ds_out, layout->dtype, layout->ndim, layout->shape);
        arena_tensor(&j->mem, &ds_in, layout->dtype, layout->ndim, layout->shape);
        K3RT_TRY(take_input(j->in, j->file, "state_in.state", &s_in, &have_state, err));
        K3RT_TRY(take_input(j->in, j->file, "d_state_out.state", &ds_out, &have_ds, err));
        a.state_in = have_state ? s_in : (k3rt_tensor){0};
        a.state_out = s_out;
    } else if (st_find(j->in, "state_in.state") || st_find(j->in, "d_state_out.state")) {
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: state tensors given, but %s has no "
                         "recurrent state", j->file, j->m.where);
    }
    k3rt_routing routing;
    if (j->m.experts > 0) {
        int64_t es[1] = {j->m.experts};
        arena_tensor(&j->mem, &bias, K3RT_F32, 1, es);
        K3RT_TRY(take_input(j->in, j->file, "bias", &bias, &found, err));
        a.bias = bias;
        a.routing = &routing;
    } else if (st_find(j->in, "bias")) {
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: a selection bias given, but %s routes to "
                         "no experts", j->file, j->m.where);
    }
    K3RT_TRY(rig_forward(&j->m, &a, err));
    K3RT_TRY(out_add(&j->out, "y", y, 0, err));
    if (s_out.data)
        K3RT_TRY(out_add(&j->out, "state_out.state", s_out, 0, err));
    if (a.routing) {
        K3RT_TRY(out_add(&j->out, "routing.selected", routing.selected, 1, err));
        K3RT_TRY(out_add(&j->out, "routing.scores", routing.scores, 1, err));
        K3RT_TRY(out_add(&j->out, "stats.counts", routing.counts, 1, err));
    }
    K3RT_TRY(add_stats(j, err));
    if (!j->backward)
        return K3RT_OK;
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.x = x;
    b.dy = dy;
    b.dx = dx;
    if (s_in.data) {
        b.state_in = a.state_in;
        b.d_state_out = have_ds ? ds_out : (k3rt_tensor){0};
        b.d_state_in = have_state ? ds_in : (k3rt_tensor){0};
    }
    K3RT_TRY(rig_backward(&j->m, &b, err));
    K3RT_TRY(out_add(&j->out, "grad.x", dx, 0, err));
    if (have_state)
        K3RT_TRY(out_add(&j->out, "grad.state_in.state", ds_in, 0, err));
    return add_grads(j, err);
}

static int run_residual(op_job *j, int sublayer, k3rt_error *err)
{
    if (!rig_has_residual(&j->m, RIG_OP_FORWARD))
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "%s has no op_forward", j->m.where);
    int64_t shape[3] = {j->B, j->T, j->d};
    int n = 0, found;
    while (n < 4096) {
        char name[32];
        snprintf(name, sizeof name, "sources.%d", n);
        if (!st_find(j->in, name))
            break;
        n++;
    }
    k3rt_tensor *src = calloc((size_t)n + 1, sizeof *src), *dsrc = calloc((size_t)n + 1, sizeof *dsrc);
    if (!src || !dsrc) {
        free(src), free(dsrc);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    int rc = K3RT_OK;
    for (int i = 0; i < n && !rc; i++) {
        char name[32];
        snprintf(name, sizeof name, "sources.%d", i);
        arena_tensor(&j->mem, &src[i], j->dtype, 3, shape);
        arena_tensor(&j->mem, &dsrc[i], j->dtype, 3, shape);
        rc = take_input(j->in, j->file, name, &src[i], &found, err);
    }
    k3rt_tensor partial, dpartial, y, dy;
    arena_tensor(&j->mem, &partial, j->dtype, 3, shape);
    arena_tensor(&j->mem, &dpartial, j->dtype, 3, shape);
    arena_tensor(&j->mem, &y, j->dtype, 3, shape);
    arena_tensor(&j->mem, &dy, j->dtype, 3, shape);
    int have_partial = 0;
    if (!rc)
        rc = take_input(j->in, j->file, "partial", &partial, &have_partial, err);
    if (!rc)
        rc = take_input(j->in, j->file, "dy", &dy, &j->backward, err);
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = sublayer;
    a.t = y;
    a.training = j->backward;
    a.sources = src;
    a.d_sources = dsrc;
    a.n_sources = n;
    a.partial = have_partial ? partial : (k3rt_tensor){0};
    a.d_partial = have_partial ? dpartial : (k3rt_tensor){0};
    if (!rc)
        rc = rig_residual(&j->m, RIG_OP_FORWARD, &a, err);
    if (!rc)
        rc = out_add(&j->out, "y", y, 0, err);
    if (!rc && j->backward) {
        a.t = dy;
        rc = rig_residual(&j->m, RIG_OP_BACKWARD, &a, err);
        for (int i = 0; i < n && !rc; i++) {
            char name[48];
            snprintf(name, sizeof name, "grad.sources.%d", i);
            rc = out_add(&j->out, name, dsrc[i], 0, err);
        }
        if (!rc && have_partial)
            rc = out_add(&j->out, "grad.partial", dpartial, 0, err);
        if (!rc)
            rc = add_grads(j, err);
    }
    if (!rc)
        rc = add_stats(j, err);
    free(src);
    free(dsrc);
    return rc;
}

int cli_load_config(const char *text, json_t **out, k3rt_error *err)
{
    json_error_t je;
    char *buf = NULL;
    size_t len;
    if (text && text[0] == '@') {
        K3RT_TRY(fs_read_file(text + 1, &buf, &len, err));
        text = buf;
    }
    *out = json_loads(text ? text : "{}", 0, &je);
    free(buf);
    if (!*out || !json_is_object(*out)) {
        json_decref(*out);
        return k3rt_fail(err, K3RT_ERR_INVALID, "--config: not a JSON object (line %d: %s)",
                         je.line, je.text);
    }
    return K3RT_OK;
}

static int op_main(const char *target, const char *config, const char *in_path,
                   const char *out_path, uint64_t seed, int layers, int sublayer,
                   const char *plugin_path, k3rt_error *err)
{
    registry reg;
    K3RT_TRY(registry_init(&reg, plugin_path, err));
    op_job j;
    memset(&j, 0, sizeof j);
    j.file = in_path;
    j.seed = seed;
    json_t *cfg = NULL;
    const plugin_entry *e = NULL;
    int rc = strchr(target, '/') ? registry_load_file(&reg, target, &e, err) : K3RT_OK;
    if (!rc && !e && !(e = registry_find(&reg, target, 0)))
        rc = registry_not_found(&reg, target, 0, "k3rt op", err);
    if (!rc && e->desc.kind != K3RT_KIND_ATTENTION && e->desc.kind != K3RT_KIND_MOE &&
        e->desc.kind != K3RT_KIND_RESIDUAL)
        rc = k3rt_fail(err, K3RT_ERR_INVALID, "k3rt op runs attention, moe and residual "
                       "plugins; %s is a %s plugin", e->desc.name, k3rt_kind_name(e->desc.kind));
    if (!rc)
        rc = cli_load_config(config, &cfg, err);
    if (!rc) {
        /* Config mistakes are reported before any file is read. */
        json_t *check = json_deep_copy(cfg);
        char what[96];
        snprintf(what, sizeof what, "k3rt op %s --config", e->desc.name);
        rc = options_apply(e->desc.options, e->desc.n_options, e->desc.option_size, check,
                           what, err);
        json_decref(check);
    }
    if (!rc)
        rc = st_open(in_path, &j.in, err);
    const st_entry *x = NULL;
    if (!rc) {
        j.kind = e->desc.kind;
        x = st_find(j.in, j.kind == K3RT_KIND_RESIDUAL ? "sources.0" : "x");
        if (!x || x->ndim != 3 || (x->dtype != K3RT_F32 && x->dtype != K3RT_F64))
            rc = k3rt_fail(err, K3RT_ERR_INVALID, "%s: needs tensor %s of shape [B, T, d] "
                           "in f32 or f64", in_path, j.kind == K3RT_KIND_RESIDUAL ? "sources.0"
                                                                                 : "x");
    }
    if (!rc) {
        j.dtype = x->dtype;
        j.B = x->shape[0], j.T = x->shape[1], j.d = x->shape[2];
        rc = k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &j.stream, err);
    }
    if (!rc) {
        k3rt_create_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.dtype = j.dtype;
        a.device = K3RT_DEVICE_CPU;
        a.d_model = j.d;
        a.n_layers = layers > 0 ? layers : (j.kind == K3RT_KIND_RESIDUAL ? sublayer / 2 + 1 : 1);
        a.layer = j.kind == K3RT_KIND_RESIDUAL ? -1 : 0;
        a.stream = j.stream;
        a.seed = seed;
        rc = rig_create(&j.m, e, cfg, &a, "op", err);
    }
    if (!rc)
        rc = refuse_unknown_inputs(&j, err);
    if (!rc)
        rc = setup_params(&j, err);
    if (!rc)
        rc = j.kind == K3RT_KIND_RESIDUAL ? run_residual(&j, sublayer, err) : run_mixer(&j, err);
    if (!rc)
        rc = st_write(out_path, j.out.e, j.out.n, NULL, err);
    rig_destroy(&j.m);
    out_free(&j.out);
    arena_free(&j.mem);
    if (j.in)
        st_close(j.in);
    k3rt_stream_destroy(j.stream);
    json_decref(cfg);
    registry_free(&reg);
    return rc;
}

int cmd_op(int argc, char **argv)
{
    const char *target = NULL, *config = NULL, *in = NULL, *out = NULL, *plugin_path = NULL;
    unsigned long long seed = 1;
    int layers = 0, sublayer = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--help")) {
            printf("usage: k3rt op NAME|PATH --config JSON|@file --in IN.safetensors --out "
                   "OUT.safetensors\n                [--seed N] [--layers L] [--sublayer S] "
                   "[--plugin-path DIRS]\n\n"
                   "Runs one attention, moe or residual plugin on the tensors of IN (f32 or "
                   "f64; the dtype of x\nsets the run's) and writes what it computed to OUT.\n\n"
                   "inputs (every other name is refused):\n"
                   "  x                  [B, T, d]  attention / moe input\n"
                   "  sources.0 .. J-1   [B, T, d]  residual: the sources of sublayer S's mixing\n"
                   "  partial            [B, T, d]  residual: the running partial sum (optional)\n"
                   "  dy                 [B, T, d]  gradient of y: the backward runs when given\n"
                   "  state_in.state, d_state_out.state   recurrent state and its gradient "
                   "(stateful mixers)\n"
                   "  bias               [experts]  moe: the selection bias (zeros when absent)\n"
                   "  <parameter>        by its declared name (residual: layers.{i}.residual.*"
                   " or residual.*);\n"
                   "                     a missing one is initialised from --seed\n"
                   "outputs: y, grad.x (grad.sources.{j}, grad.partial), grad.<parameter>, "
                   "state_out.state,\n  grad.state_in.state, routing.selected, "
                   "routing.scores, stats.<name>, and every parameter as used.\n");
            return 0;
        } else if (!strcmp(a, "--config") && more) {
            config = argv[++i];
        } else if (!strcmp(a, "--in") && more) {
            in = argv[++i];
        } else if (!strcmp(a, "--out") && more) {
            out = argv[++i];
        } else if (!strcmp(a, "--seed") && more) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--layers") && more) {
            layers = atoi(argv[++i]);
        } else if (!strcmp(a, "--sublayer") && more) {
            sublayer = atoi(argv[++i]);
        } else if (!strcmp(a, "--plugin-path") && more) {
            plugin_path = argv[++i];
        } else if (a[0] != '-' && !target) {
            target = a;
        } else {
            fprintf(stderr, "k3rt op: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!target || !in || !out) {
        fprintf(stderr, "usage: k3rt op NAME|PATH --config JSON --in IN --out OUT\n");
        return 2;
    }
    k3rt_error err = {0};
    if (op_main(target, config, in, out, seed, layers, sublayer, plugin_path, &err)) {
        fprintf(stderr, "k3rt op: %s\n", err.msg);
        return 1;
    }
    return 0;
}
