/* Trainer setup: recipe, plan checks, data, output directory, resume point; and the per-rank
 * model and optimizer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm_impl.h"
#include "train/ckpt_dir.h"
#include "train/device_choice.h"
#include "train/peak.h"
#include "train/train_internal.h"
#include "util/checked.h"
#include "util/fs.h"
#include "util/log.h"

static int64_t get_int(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }
static double get_num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *get_str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

/* Plans this build cannot run yet fail here, before anything is allocated. */
static int check_plan(run *r, const json_t *plan, k3rt_error *err)
{
    int64_t ep = get_int(plan, "ep"), cp = get_int(plan, "cp");
    if (ep > 1 || cp > 1)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                         "plan: ep = %lld, cp = %lld: expert and context parallelism are not "
                         "supported yet (use ep = 1, cp = 1)", (long long)ep, (long long)cp);
    r->dp = (int)get_int(plan, "dp");
    r->B = get_int(plan, "micro_batch");
    r->T = get_int(plan, "seq_len");
    r->accum = get_int(plan, "grad_accum");
    if (r->dp < 1 || r->B < 1 || r->T < 1 || r->accum < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "plan: dp, micro_batch, seq_len and grad_accum "
                         "must be >= 1");
    return K3RT_OK;
}

/* The job's communicators: this process's ranks (all of them as threads, or its one), and
 * its share of the CPU threads (the processes of one node split the cores). */
static int open_comm(run *r, const json_t *plan, k3rt_error *err)
{
    comm_mesh mesh = {r->dp, (int)get_int(plan, "ep"), (int)get_int(plan, "cp")};
    K3RT_TRY(comm_open_job(get_str(plan, "comm"), &mesh, &r->job, err));
    r->multi_process = r->job.n_local == 1 && r->job.world.size > 1;
    int threads = (int)get_int(plan, "threads");
    if (threads <= 0)
        threads = k3rt_cpu_threads();
    int sharing = r->multi_process ? r->job.world.local_size : r->dp;
    r->threads_per_rank = threads / sharing > 0 ? threads / sharing : 1;
    return K3RT_OK;
}

/* Rank 0 prepares the output folder (claims it, or picks the checkpoint to resume); the other
 * processes follow once it has, reading only. */
static int prepare_output(run *r, k3rt_error *err)
{
    if (!r->multi_process)
        return output_prepare(r, err);
    k3rt_comm *w = r->job.comms[0];
    int rc = w->rank == 0 ? output_prepare(r, err) : K3RT_OK;
    int64_t ok = rc == K3RT_OK;
    K3RT_TRY(k3rt_broadcast(w, NULL, &ok, 1, K3RT_I64, 0, err));
    if (rc)
        return rc;
    if (!ok)
        return k3rt_fail(err, K3RT_ERR_IO, "rank 0 could not prepare the output folder (its "
                         "message says why)");
    return w->rank == 0 ? K3RT_OK : output_follow(r, err);
}

/* The CPU runs every plugin; the GPU only when every plugin of the recipe has a CUDA path
 * (device_choice.h). */
static int choose_device(run *r, const json_t *plan, k3rt_error *err)
{
    const char *device = get_str(plan, "device"), *dtype = get_str(plan, "dtype");
    int gpus = k3rt_cuda_device_count();
    device_choice dc;
    K3RT_TRY(device_choose(r->rec, gpus, &dc, err));
    r->device = dc.cuda ? 0 : K3RT_DEVICE_CPU;
    if (!dc.cuda && gpus > 0 && dc.missing[0] && !(device && !strcmp(device, "cpu")))
        log_info("note: training on the CPU: plugins without a CUDA path: %s", dc.missing);
    int cuda = r->device != K3RT_DEVICE_CPU;
    snprintf(r->device_name, sizeof r->device_name, "cpu");
    if (cuda)
        K3RT_TRY(k3rt_device_name(r->device, r->device_name, sizeof r->device_name, err));
    r->peak_flops = get_num(plan, "peak_tflops") > 0 ? get_num(plan, "peak_tflops") * 1e12
                    : cuda ? device_peak_flops(r->device_name) : 0;
    if (!dtype || !strcmp(dtype, "auto"))
        r->dtype = cuda ? K3RT_BF16 : K3RT_F32;
    else if (!strcmp(dtype, "f32"))
        r->dtype = K3RT_F32;
    else if (!strcmp(dtype, "f64") && !cuda)
        r->dtype = K3RT_F64;
    else if (!strcmp(dtype, "bf16") && cuda)
        r->dtype = K3RT_BF16;
    else
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "plan.dtype = \"%s\" on the %s: expected "
                         "%s", dtype, cuda ? "GPU" : "CPU",
                         cuda ? "auto (bf16), bf16 or f32" : "auto (f32), f32 or f64 (the bf16 "
                         "path needs the GPU)");
    return K3RT_OK;
}

static int load_data(run *r, k3rt_error *err)
{
    const json_t *data = json_object_get(r->doc, "data");
    const char *tok = get_str(data, "tokenizer");
    if (tok && !strcmp(tok, "shards")) {
        K3RT_TRY(data_load_shard(get_str(data, "train"), &r->train, err));
        K3RT_TRY(data_load_shard(get_str(data, "val"), &r->val, err));
    } else {
        K3RT_TRY(data_load_bytes(get_str(data, "path"), get_num(data, "val_fraction"), &r->train,
                                 &r->val, err));
    }
    const char *val = tok && !strcmp(tok, "shards") ? get_str(data, "val") : get_str(data, "path");
    K3RT_TRY(data_check_val(&r->val, val, err));
    r->packed = json_is_true(json_object_get(data, "packed_documents"));
    if (r->packed && (!tok || strcmp(tok, "shards")))
        return k3rt_fail(err, K3RT_ERR_INVALID, "data.packed_documents: needs tokenizer = "
                         "\"shards\" with .docs boundaries (scripts/data/prepare.py)");
    if (r->packed && (!r->train.n_docs || !r->val.n_docs)) {
        const char *bare = r->train.n_docs ? val : get_str(data, "train");
        return k3rt_fail(err, K3RT_ERR_INVALID, "data.packed_documents: %s has no document "
                         "boundaries (%s.docs, written by scripts/data/prepare.py)", bare, bare);
    }
    int64_t vocab = get_int(json_object_get(r->doc, "model"), "vocab");
    int32_t top = r->train.max_token > r->val.max_token ? r->train.max_token : r->val.max_token;
    if (top >= vocab)
        return k3rt_fail(err, K3RT_ERR_INVALID, "data: token %d does not fit model.vocab = %lld",
                         top, (long long)vocab);
    if (r->train.n < r->T + 2)
        return k3rt_fail(err, K3RT_ERR_INVALID, "data: %lld training tokens are fewer than one "
                         "sequence of %lld", (long long)r->train.n, (long long)r->T);
    return K3RT_OK;
}

static int read_train_section(run *r, k3rt_error *err)
{
    const json_t *t = json_object_get(r->doc, "train");
    const json_t *optz = json_object_get(r->doc, "optimizer");
    r->steps = get_int(t, "steps");
    r->log_interval = get_int(t, "log_interval");
    r->eval_interval = get_int(t, "eval_interval");
    r->eval_at_start = json_is_true(json_object_get(t, "eval_at_start"));
    r->eval_batches = get_int(t, "eval_batches");
    r->ckpt_interval = get_int(t, "checkpoint_interval");
    r->keep = get_int(t, "keep_checkpoints");
    r->max_bad = get_int(t, "max_bad_steps");
    r->grad_clip = get_num(t, "grad_clip");
    r->seed = (uint64_t)get_int(t, "seed");
    r->sched.lr = get_num(optz, "lr");
    r->sched.min_ratio = get_num(t, "min_lr_ratio");
    r->sched.warmup = get_int(t, "warmup");
    r->sched.steps = r->steps;
    snprintf(r->sched.kind, sizeof r->sched.kind, "%s", get_str(t, "schedule"));
    if (r->steps < 1 || !(r->sched.lr > 0))
        return k3rt_fail(err, K3RT_ERR_INVALID, "train.steps must be >= 1 and optimizer.lr > 0");
    if (r->log_interval < 1)
        r->log_interval = 1;
    /* Token counts and data cursors are steps x micro_batch x seq_len x grad_accum x dp and
     * evaluation windows eval_batches x micro_batch: each must fit 64 bits. */
    int bad = 0;
    ck_mul(&bad, ck_mul(&bad, ck_mul(&bad, ck_mul(&bad, r->steps, r->B), r->T), r->accum),
           r->dp);
    if (bad)
        return k3rt_fail(err, K3RT_ERR_INVALID, "train.steps = %lld x plan.micro_batch = %lld x "
                         "plan.seq_len = %lld x plan.grad_accum = %lld x plan.dp = %d tokens: "
                         "too large (the count does not fit 64 bits)", (long long)r->steps,
                         (long long)r->B, (long long)r->T, (long long)r->accum, r->dp);
    ck_mul(&bad, ck_mul(&bad, r->eval_batches, r->B), r->T);
    if (bad)
        return k3rt_fail(err, K3RT_ERR_INVALID, "train.eval_batches = %lld x plan.micro_batch = "
                         "%lld x plan.seq_len = %lld: too large (the count does not fit 64 "
                         "bits)", (long long)r->eval_batches, (long long)r->B, (long long)r->T);
    r->changes = json_array();
    r->balancer = json_deep_copy(json_object_get(json_object_get(r->doc, "model"), "balancer"));
    return r->changes && r->balancer ? K3RT_OK
                                     : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
}

int run_setup(run *r, const train_options *o, k3rt_error *err)
{
    memset(r, 0, sizeof *r);
    r->status_fd = -1;
    r->opt = *o;
    pthread_mutex_init(&r->lock, NULL);
    r->result.final_val_loss = NAN;
    r->result.first_loss = NAN;
    K3RT_TRY(registry_open(&r->reg, &o->plugins, err));
    K3RT_TRY(recipe_load(o->recipe_path, &r->reg, o->overrides, o->n_overrides, NULL, &r->rec,
                         err));
    r->doc = recipe_json(r->rec);
    const json_t *plan = json_object_get(r->doc, "plan");
    K3RT_TRY(check_plan(r, plan, err));
    K3RT_TRY(choose_device(r, plan, err));
    K3RT_TRY(train_plan_activations(r, err));
    K3RT_TRY(read_train_section(r, err));
    K3RT_TRY(open_comm(r, plan, err));
    K3RT_TRY(prepare_output(r, err));
    /* --dry-run too: a plan that cannot read its data is not one */
    return load_data(r, err);
}

void run_free(run *r)
{
    comm_close_job(&r->job);
    token_stream_free(&r->train);
    token_stream_free(&r->val);
    if (r->metrics)
        fclose(r->metrics);
    json_decref(r->manifest);
    json_decref(r->identity);
    json_decref(r->changes);
    json_decref(r->balancer);
    json_decref(r->act_planned);
    free(r->act_plan);
    if (r->rec)
        recipe_free(r->rec);
    registry_free(&r->reg);
    pthread_mutex_destroy(&r->lock);
}

static int build_optimizer(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    model *m = &c->m;
    c->refs = calloc((size_t)m->n_params, sizeof *c->refs);
    c->max_logits = calloc((size_t)m->n_params * 64 + 1, sizeof(float));
    if (!c->refs || !c->max_logits)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < m->n_params; i++) {
        k3rt_param_ref *p = &c->refs[i];
        p->struct_size = sizeof *p;
        p->index = i;
        p->name = m->params[i].name;
        p->decl = &m->params[i].decl;
        p->param = m->params[i].master;  /* fp32 under bf16 compute */
        p->grad = m->params[i].grad;
    }
    K3RT_TRY(shard_setup(c, err));
    const json_t *spec = json_object_get(r->doc, "optimizer");
    const plugin_entry *e;
    K3RT_TRY(model_resolve_spec(&r->reg, spec, K3RT_KIND_OPTIMIZER, "optimizer", &e, err));
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = m->master_dtype;
    a.device = m->opt.device;
    a.d_model = m->d;
    a.vocab = m->vocab;
    a.n_layers = m->n_layers;
    a.layer = -1;
    a.params = shard_refs(c);
    a.n_params = c->n_own;
    a.comm = c->comm;
    a.stream = c->stream;
    a.seed = r->seed;
    return rig_create(&c->opt, e, json_object_get(spec, "config"), &a, "optimizer", err);
}

int load_init_weights(model *m, const json_t *doc, k3rt_error *err)
{
    const char *path = json_string_value(json_object_get(json_object_get(doc, "train"),
                                                         "init_weights"));
    if (!path)
        return K3RT_OK;
    int rc = ckpt_load_weights(m, path, err);
    if (rc)
        k3rt_error_prefix(err, "train.init_weights: ");
    return rc;
}

int rank_build(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    c->comm = r->job.comms[c->rank - r->job.first_rank];
    c->dp = k3rt_comm_group(c->comm, K3RT_GROUP_DP);
    K3RT_TRY(k3rt_stream_create(r->device, K3RT_STREAM_COMPUTE, &c->stream, err));
    k3rt_stream_set_threads(c->stream, r->threads_per_rank);
    json_t *mdoc = json_deep_copy(json_object_get(r->doc, "model"));
    if (!mdoc)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    json_object_set(mdoc, "balancer", r->balancer);
    const json_t *plan = json_object_get(r->doc, "plan");
    model_options mo = {r->dtype, r->device, c->stream, c->comm, r->seed,
                        json_is_true(json_object_get(plan, "deterministic")),
                        json_object_get(plan, "activations"), r->act_planned};
    int rc = model_build(&c->m, mdoc, &r->reg, &mo, err);
    json_decref(mdoc);
    K3RT_TRY(rc);
    K3RT_TRY(model_set_shape(&c->m, r->B, r->T, err));
    K3RT_TRY(build_optimizer(c, err));
    if (r->opt.resume && r->resume_dir[0])
        K3RT_TRY(ckpt_load_run(c, err));
    else
        K3RT_TRY(load_init_weights(&c->m, r->doc, err));
    return K3RT_OK;
}

void rank_free(rank_ctx *c)
{
    rig_destroy(&c->opt);
    model_free(&c->m);
    shard_free(c);
    free(c->refs);
    free(c->max_logits);
    k3rt_stream_destroy(c->stream);
}
