/* The training loop of one data-parallel rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "model/profile.h"
#include "ops/dispatch.h"
#include "plugin/sinks.h"
#include "train/train_internal.h"
#include "util/fs.h"
#include "util/log.h"

static int dp_size(const rank_ctx *c) { return c->r->dp; }

static int all_reduce(rank_ctx *c, void *buf, int64_t n, int dtype, int op, k3rt_error *err)
{
    if (dp_size(c) == 1)
        return K3RT_OK;
    PROF_TRY(c->m.prof, PROF_COMM, k3rt_all_reduce(c->dp, c->stream, buf, buf, n, dtype, op,
                                                   err));
    return K3RT_OK;
}

static void reset_stats(model *m)
{
    for (int i = 0; i < m->n_mods; i++)
        rig_reset_stats(&m->mods[i].r);
    model_reset_routed(m);
}

/* Reduces every module statistic across ranks as it asks, and points the optimizer's QK-clip
 * parameters at their owner's "max_logit". */
static int gather_stats(rank_ctx *c, k3rt_error *err)
{
    model *m = &c->m;
    for (int i = 0; i < m->n_params; i++)
        memset(&c->refs[i].head_max_logit, 0, sizeof c->refs[i].head_max_logit);
    for (int mi = 0; mi < m->n_mods; mi++) {
        struct k3rt_tensor_sink sink;
        K3RT_TRY(rig_stats(&m->mods[mi].r, &sink, err));
        int rc = K3RT_OK;
        for (int k = 0; k < sink.n && !rc; k++) {
            tensor_sink_item *it = &sink.items[k];
            if (it->reduce >= 0)
                rc = all_reduce(c, it->t.data, k3rt_tensor_numel(&it->t), it->t.dtype,
                                it->reduce, err);
            if (strcmp(it->name, "max_logit") || it->t.dtype != K3RT_F32)
                continue;
            for (int p = 0; p < m->n_params; p++)
                if (m->params[p].module == mi && m->params[p].decl.qk_clip != K3RT_QK_NONE)
                    c->refs[p].head_max_logit = it->t;
        }
        tensor_sink_free(&sink);
        K3RT_TRY(rc);
    }
    K3RT_TRY(model_flush_routed(m, err));
    for (int i = 0; i < m->n_layers; i++)
        if (m->routed[i])
            K3RT_TRY(all_reduce(c, m->routed[i], m->layers[i].experts, K3RT_I64,
                                K3RT_REDUCE_SUM, err));
    return K3RT_OK;
}

static int update_balancers(rank_ctx *c, int64_t step, k3rt_error *err)
{
    model *m = &c->m;
    for (int i = 0; i < m->n_layers; i++) {
        rig *bal = model_balancer(m, i);
        if (bal)
            PROF_TRY(m->prof, profile_module_row(m->layers[i].balancer, 0),
                     rig_update(bal, c->dp, step, err));
    }
    return K3RT_OK;
}

/* The document offsets of the training batch `index` (data.packed_documents), for the model's
 * mixers. */
static int set_batch_documents(rank_ctx *c, int64_t index, k3rt_error *err)
{
    run *r = c->r;
    int64_t *starts = malloc((size_t)r->B * sizeof *starts);
    if (!starts)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int64_t b = 0; b < r->B; b++)
        starts[b] = data_window_start(&r->train, r->seed, index * r->B + b, r->T);
    int rc = set_window_documents(&c->m, &r->train, starts, r->B, r->T, err);
    free(starts);
    return rc;
}

typedef struct step_out {
    double loss, aux, gnorm, lr;
    int skipped;
} step_out;

static int train_step(rank_ctx *c, int64_t step, int32_t *in, int32_t *tg, step_out *o,
                      k3rt_error *err)
{
    run *r = c->r;
    model *m = &c->m;
    int64_t N = r->B * r->T;
    K3RT_TRY(prof_begin(m->prof, PROF_STATS, err));
    model_zero_grads(m);
    reset_stats(m);
    K3RT_TRY(prof_end(m->prof, err));
    double sums[2] = {0, 0};  /* token loss, auxiliary loss */
    for (int64_t micro = 0; micro < r->accum; micro++) {
        int64_t index = ((step - 1) * r->accum + micro) * r->dp + c->rank;
        PROF_TRY(m->prof, PROF_DATA, data_batch(&r->train, r->seed, index, r->B, r->T, in, tg,
                                                 err));
        if (r->packed)
            K3RT_TRY(set_batch_documents(c, index, err));
        double ls;
        K3RT_TRY(model_train_step(m, in, tg, 1.0 / (double)(N * r->accum),
                                  1.0 / (double)r->accum, &ls, err));
        sums[0] += ls / (double)(N * r->accum);
    }
    if (c->sharded)
        PROF_TRY(m->prof, PROF_COMM, shard_reduce_grads(c, err));
    else
        K3RT_TRY(all_reduce(c, m->grad_buf, m->total_numel, m->master_dtype, K3RT_REDUCE_AVG,
                            err));
    PROF_TRY(m->prof, PROF_STATS, gather_stats(c, err));  /* also brings the auxiliary loss */
    sums[1] = m->aux_loss / (double)r->accum;
    K3RT_TRY(all_reduce(c, sums, 2, K3RT_F64, K3RT_REDUCE_AVG, err));
    double ss;
    K3RT_TRY(prof_begin(m->prof, PROF_GRAD_NORM, err));
    K3RT_TRY(shard_grad_sum_squares(c, &ss, err));
    /* CUDA kernels record an out-of-range token instead of trapping; the gradient norm has
     * just synchronised the stream, so reading the flag here costs nothing. */
    K3RT_TRY(k3rt_stream_index_error(c->stream, err));
    K3RT_TRY(prof_end(m->prof, err));
    o->loss = sums[0];
    o->aux = sums[1];
    o->gnorm = sqrt(ss);
    o->lr = schedule_lr(&r->sched, step);
    o->skipped = !isfinite(o->loss) || !isfinite(o->gnorm) || !isfinite(o->aux);
    if (o->skipped) {
        c->bad_in_row++;
        if (c->rank == 0)
            log_warn("step %lld: non-finite %s (loss %g, grad norm %g): step skipped (%d in a "
                     "row, limit %lld)", (long long)step, isfinite(o->loss) ? "gradient" : "loss",
                     o->loss, o->gnorm, c->bad_in_row, (long long)r->max_bad);
        if (c->bad_in_row > r->max_bad)
            return k3rt_fail(err, K3RT_ERR_NUMERIC, "step %lld: %d non-finite steps in a row "
                             "(train.max_bad_steps = %lld): stopping", (long long)step,
                             c->bad_in_row, (long long)r->max_bad);
        return K3RT_OK;
    }
    c->bad_in_row = 0;
    K3RT_TRY(update_balancers(c, step, err));
    if (r->grad_clip > 0 && o->gnorm > r->grad_clip)
        PROF_TRY(m->prof, PROF_GRAD_NORM,
                 k3rt_axpby(c->stream, m->master_dtype, m->total_numel, r->grad_clip / o->gnorm,
                            m->grad_buf, 0.0, m->grad_buf, err));
    K3RT_TRY(prof_begin(m->prof, PROF_OPTIMIZER, err));
    K3RT_TRY(rig_step(&c->opt, c->dp, o->lr, step, shard_refs(c), c->n_own, err));
    if (c->sharded)
        PROF_TRY(m->prof, PROF_COMM, shard_publish(c, err));
    K3RT_TRY(model_sync_compute(m, err));
    return prof_end(m->prof, err);
}

/* Broadcasts rank 0's change (or none) and applies it on every rank; `step` is the first step
 * that runs with it. */
static int exchange_change(rank_ctx *c, int64_t step, json_t *change, const char *source,
                           k3rt_error *err)
{
    run *r = c->r;
    char *text = change && c->rank == 0 ? json_dumps(change, JSON_COMPACT) : NULL;
    int64_t len = text ? (int64_t)strlen(text) + 1 : 0;
    if (r->dp > 1)
        K3RT_TRY(k3rt_broadcast(c->comm, c->stream, &len, 1, K3RT_I64, 0, err));
    if (len == 0)
        return K3RT_OK;
    char *buf = text ? text : calloc(1, (size_t)len);
    if (!buf)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = r->dp > 1 ? k3rt_broadcast(c->comm, c->stream, buf, len, K3RT_U8, 0, err) : 0;
    json_t *ch = rc ? NULL : json_loads(buf, 0, NULL);
    free(buf);
    if (rc || !ch)
        return rc ? rc : k3rt_fail(err, K3RT_ERR_INVALID, "mid-run change: bad document");
    json_t *bal = json_object_get(ch, "balancer");
    if (bal)
        rc = model_set_balancer(&c->m, bal, &r->reg, err);
    if (!rc && c->rank == 0) {
        pthread_mutex_lock(&r->lock);
        json_t *rec = json_pack("{s:I, s:s, s:O}", "step", (json_int_t)step, "source", source,
                                "balancer", bal);
        json_array_append_new(r->changes, rec);
        json_decref(r->balancer);
        r->balancer = json_incref(bal);
        pthread_mutex_unlock(&r->lock);
        const char *name = json_string_value(json_object_get(bal, "plugin"));
        log_info("balancer changed to %s from step %lld (%s)", name ? name : "?",
                 (long long)step, source);
    }
    json_decref(ch);
    return rc;
}

/* Changes the recipe schedules (train.changes) take effect at the start of their step. */
static int scheduled_changes(rank_ctx *c, int64_t step, k3rt_error *err)
{
    const json_t *sched = json_object_get(json_object_get(c->r->doc, "train"), "changes");
    size_t i;
    json_t *ch;
    json_array_foreach(sched, i, ch) {
        if (json_integer_value(json_object_get(ch, "step")) != step)
            continue;
        json_t *only = json_pack("{s:O}", "balancer", json_object_get(ch, "balancer"));
        int rc = exchange_change(c, step, only, "recipe", err);
        json_decref(only);
        K3RT_TRY(rc);
    }
    return K3RT_OK;
}

/* on_step(step, metrics) runs after a step; what it returns takes effect from the next. */
static int hook_changes(rank_ctx *c, int64_t step, json_t *metrics, k3rt_error *err)
{
    run *r = c->r;
    if (!json_is_true(json_object_get(r->doc, "has_on_step")))
        return K3RT_OK;
    json_t *change = NULL;
    int rc = c->rank == 0 ? recipe_on_step(r->rec, step, metrics, &change, err) : K3RT_OK;
    /* A hook failure on rank 0 must not leave the others waiting in the broadcast. */
    int64_t ok = rc == K3RT_OK;
    if (r->dp > 1)
        K3RT_TRY(k3rt_broadcast(c->comm, c->stream, &ok, 1, K3RT_I64, 0, err));
    if (!ok)
        return rc ? rc : k3rt_fail(err, K3RT_ERR_INVALID, "on_step failed on rank 0");
    rc = exchange_change(c, step + 1, change, "on_step", err);
    json_decref(change);
    return rc;
}

/* A residual that reports "depth_weights" [sublayers + 1, sources] (what each sublayer reads
 * from each depth source) gets it logged and, through the driver's charts, drawn as a heat
 * map, at every evaluation. */
static int log_depth_weights(rank_ctx *c, int64_t step, json_t *rec, k3rt_error *err)
{
    run *r = c->r;
    struct k3rt_tensor_sink sink;
    K3RT_TRY(rig_stats(&c->m.mods[c->m.residual].r, &sink, err));
    const tensor_sink_item *it = NULL;
    for (int i = 0; i < sink.n; i++)
        if (!strcmp(sink.items[i].name, "depth_weights") && sink.items[i].t.ndim == 2 &&
            sink.items[i].t.dtype == K3RT_F32)
            it = &sink.items[i];
    int rc = K3RT_OK;
    float *w = NULL;  /* the host copy: statistics live on the residual's device */
    if (it) {
        size_t bytes = (size_t)k3rt_tensor_numel(&it->t) * sizeof(float);
        if (!(w = malloc(bytes)))
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        if (!rc)
            rc = k3rt_memcpy(c->m.opt.stream, w, K3RT_DEVICE_CPU, it->t.data, it->t.device,
                             bytes, err);
        if (!rc && it->t.device != K3RT_DEVICE_CPU)
            rc = k3rt_stream_sync(c->m.opt.stream, err);
    }
    if (it && !rc) {
        int rows = (int)it->t.shape[0], cols = (int)it->t.shape[1];
        double *m = malloc((size_t)rows * (size_t)cols * sizeof *m);
        char (*rl)[24] = calloc((size_t)rows, sizeof *rl), (*cl)[24] = calloc((size_t)cols, sizeof *cl);
        const char **rp = calloc((size_t)rows, sizeof *rp), **cp = calloc((size_t)cols, sizeof *cp);
        json_t *table = json_array();
        if (!m || !rl || !cl || !rp || !cp || !table)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
        for (int i = 0; !rc && i < rows; i++) {
            if (i == rows - 1)
                snprintf(rl[i], sizeof rl[i], "output");
            else
                snprintf(rl[i], sizeof rl[i], "%d.%s", i / 2, i % 2 ? "ffn" : "mixer");
            rp[i] = rl[i];
            json_t *row = json_array();
            for (int j = 0; j < cols; j++) {
                m[i * cols + j] = w[i * cols + j];
                json_array_append_new(row, json_real(m[i * cols + j]));
            }
            json_array_append_new(table, row);
        }
        for (int j = 0; !rc && j < cols; j++) {
            snprintf(cl[j], sizeof cl[j], j ? "source %d" : "embedding", j);
            cp[j] = cl[j];
        }
        if (!rc) {
            char path[1200], title[96];
            snprintf(title, sizeof title, "depth-attention weights at step %lld", (long long)step);
            train_matrix tm = {title, "sublayer (layer.slot)", "source", m, rows, cols, rp, cp,
                               0, 1};
            fs_join(path, sizeof path, r->out, "depth_weights.svg");
            const train_charts *ch = r->opt.charts;
            if (ch && ch->depth_weights)
                rc = ch->depth_weights(ch->user, path, &tm, err);
            json_object_set(rec, "depth_weights", table);
        }
        json_decref(table);
        free(m), free(rl), free(cl), free(rp), free(cp);
    }
    free(w);
    tensor_sink_free(&sink);
    return rc;
}

static int maybe_eval(rank_ctx *c, int64_t step, json_t *rec, k3rt_error *err)
{
    run *r = c->r;
    int last = step == r->steps, start = step == 0 && r->eval_at_start;
    if (!last && !start && !(r->eval_interval > 0 && step % r->eval_interval == 0))
        return K3RT_OK;
    double val;
    K3RT_TRY(eval_split(c, &r->val, r->eval_batches * r->B, &val, err));
    json_object_set_new(rec, "val_loss", json_real(val));
    if (c->rank == 0) {
        K3RT_TRY(log_depth_weights(c, step, rec, err));
        r->result.final_val_loss = val;
        K3RT_TRY(loss_series_add(&r->history.val, (double)step, val, err));
        if (!r->opt.quiet)
            log_info("step %lld: validation loss %.4f nats/token", (long long)step, val);
    }
    return K3RT_OK;
}

/* The initial weights' validation loss: the reference a run's progress is read against. */
static int eval_start(rank_ctx *c, k3rt_error *err)
{
    json_t *rec = json_pack("{s:I, s:I, s:f}", "step", (json_int_t)0, "tokens", (json_int_t)0, "flops", 0.0);
    int rc = rec ? maybe_eval(c, 0, rec, err) : k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    if (!rc && c->rank == 0)
        rc = train_write_record(c->r, rec, err);
    json_decref(rec);
    return rc;
}

static int stopping_at(const run *r, int64_t step)
{
    return step == r->steps || step == r->opt.stop_after;
}

static int maybe_checkpoint(rank_ctx *c, int64_t step, k3rt_error *err)
{
    run *r = c->r;
    int last = stopping_at(r, step) || r->opt.save_start;
    if (!last && !(r->ckpt_interval > 0 && step % r->ckpt_interval == 0))
        return K3RT_OK;
    /* Every rank has the same streak (the loss is all-reduced): all skip or none. A save now
     * would become the newest checkpoint, and rotation would delete the last good one. */
    if (c->bad_in_row > 0) {
        if (c->rank == 0)
            log_warn("step %lld: checkpoint skipped: the run is in a streak of %d non-finite "
                     "step%s; the newest checkpoint stays the last one before it",
                     (long long)step, c->bad_in_row, c->bad_in_row > 1 ? "s" : "");
        return K3RT_OK;
    }
    K3RT_TRY(replicas_agree(c, step, err));
    int rc = c->sharded        ? ckpt_save_sharded(c, step, err)
             : c->rank == 0    ? ckpt_save_run(c, step, NULL, NULL, NULL, err)
                               : K3RT_OK;
    if (r->dp > 1) {
        int64_t ok = rc == K3RT_OK;
        K3RT_TRY(k3rt_broadcast(c->comm, c->stream, &ok, 1, K3RT_I64, 0, err));
        if (!ok && !rc)
            rc = k3rt_fail(err, K3RT_ERR_IO, "checkpoint of step %lld failed on rank 0",
                           (long long)step);
    }
    return rc;
}

/* JSON has no NaN or infinity: a non-finite value is recorded as null. */
static json_t *number(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *step_record(const rank_ctx *c, int64_t step, const step_out *o)
{
    run *r = c->r;
    return json_pack("{s:I, s:o, s:o, s:f, s:o, s:b, s:I, s:f}", "step", (json_int_t)step,
                     "loss", number(o->loss), "aux_loss", number(o->aux), "lr", o->lr,
                     "grad_norm", number(o->gnorm), "skipped", o->skipped, "tokens",
                     (json_int_t)(step * r->B * r->T * r->accum * r->dp), "flops",
                     (double)step * c->step_flops);
}

/* Training FLOPs of one optimizer step, from the plugins' own counts: every micro-batch of
 * every rank (`k3rt plan` counts the same way). */
static int count_step_flops(rank_ctx *c, k3rt_error *err)
{
    double f, b;
    K3RT_TRY(model_flops(&c->m, c->r->B, c->r->T, &f, &b, err));
    c->step_flops = (f + b) * (double)(c->r->accum * c->r->dp);
    int64_t active;
    model_param_counts(&c->m, NULL, &active);
    c->six_n_flops = 6.0 * (double)active * (double)(c->r->B * c->r->T * c->r->accum * c->r->dp);
    return K3RT_OK;
}

static int run_steps(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    int64_t N = r->B * r->T;
    int32_t *in = malloc((size_t)N * sizeof *in), *tg = malloc((size_t)N * sizeof *tg);
    if (!in || !tg) {
        free(in), free(tg);
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    int rc = count_step_flops(c, err);
    if (!rc && c->rank == 0 && !r->opt.quiet)
        rc = train_print_header(c, err);
    if (!rc)
        rc = train_profile_setup(c, err);
    c->interval_t0 = time_now();
    if (!rc && r->eval_at_start && r->start_step == 0 && !r->opt.save_start)
        rc = eval_start(c, err);
    if (!rc && r->opt.save_start) /* the initial weights as step 0's checkpoint, no step */
        rc = maybe_checkpoint(c, r->start_step, err);
    for (int64_t step = r->start_step + 1; step <= r->steps && !rc && !r->opt.save_start;
         step++) {
        step_out o;
        rc = scheduled_changes(c, step, err);
        if (!rc)
            rc = train_profile_begin(c, step, err);
        if (!rc)
            rc = train_step(c, step, in, tg, &o, err);
        if (!rc)
            rc = train_profile_end(c, step, err);
        if (!rc && step == r->start_step + 1)
            rc = train_act_record(c, step, err);
        if (rc == K3RT_ERR_COMM)
            k3rt_error_prefix(err, "step %lld: ", (long long)step);
        if (rc)
            break;
        json_t *rec = step_record(c, step, &o);
        if (c->rank == 0) {
            if (step == r->start_step + 1)
                r->result.first_loss = o.loss;
            rc = loss_series_add(&r->history.train, (double)step, o.loss, err);
        }
        if (!o.skipped) {
            c->interval_loss += o.loss;
            c->interval_steps++;
        }
        c->interval_tokens += N * r->accum * r->dp;
        if (!rc)
            rc = maybe_eval(c, step, rec, err);
        if (!rc && (step % r->log_interval == 0 || step == r->steps || json_object_get(rec, "val_loss")))
            rc = report_metrics(c, rec, err);
        /* A hook's change must be in the checkpoint of this step, which resumes at the next. */
        if (!rc && step < r->steps)
            rc = hook_changes(c, step, rec, err);
        if (!rc)
            rc = maybe_checkpoint(c, step, err);
        json_decref(rec);
        r->result.steps_done = step;
        status_step(r, step);
        if (step == r->opt.stop_after)
            break;
    }
    train_profile_free(c);
    free(in);
    free(tg);
    return rc;
}

/* With the byte tokenizer the corpus is the bytes of both splits. */
static int report_coverage(run *r, const char *text, k3rt_error *err)
{
    int64_t n = r->train.n + r->val.n;
    char *corpus = malloc((size_t)n + 1);
    if (!corpus)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++)
        corpus[i] = (char)(i < r->train.n ? r->train.tokens[i] : r->val.tokens[i - r->train.n]);
    double frac;
    int64_t words;
    int rc = sample_word_coverage(corpus, n, text, &frac, &words, err);
    free(corpus);
    if (!rc)
        log_info("sample: %.1f%% of its %lld words occur in the training corpus", 100 * frac,
                 (long long)words);
    return rc;
}

static int finish(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    if (c->rank != 0 || r->result.steps_done < r->steps)
        return K3RT_OK;
    r->result.seconds = time_now() - r->t_start;
    char path[1200];
    const train_charts *ch = r->opt.charts;
    if (ch && ch->loss) {
        fs_join(path, sizeof path, r->out, "loss.svg");
        char title[256];
        snprintf(title, sizeof title, "k3rt: %s", recipe_path(r->rec));
        K3RT_TRY(ch->loss(ch->user, path, title, &r->history, err));
        if (!r->opt.quiet)
            log_info("wrote %s", path);
    }
    const char *tok = json_string_value(json_object_get(json_object_get(r->doc, "data"),
                                                        "tokenizer"));
    if (r->opt.no_sample || (tok && strcmp(tok, "bytes")))
        return K3RT_OK;  /* text samples need the byte tokenizer */
    char *text = NULL;
    sample_stats st;
    K3RT_TRY(sample_text(&c->m, r->T, json_object_get(r->doc, "sample"), &text, &st, err));
    fs_join(path, sizeof path, r->out, "sample.txt");
    int rc = fs_write_atomic(path, text, strlen(text), err);
    if (!rc && !r->opt.quiet)
        log_info("--- sample (%zu bytes, also in %s; %.0f tokens/s, %s) ---\n%s\n--- end of "
                 "sample ---", strlen(text), path, st.seconds > 0 ? st.tokens / st.seconds : 0.0,
                 st.cached ? "cached decode" : "sliding context", text);
    if (!rc && !r->opt.quiet && r->train.n)
        rc = report_coverage(r, text, err);
    free(text);
    return rc;
}

void *rank_main(void *arg)
{
    rank_ctx *c = arg;
    k3rt_error *err = &c->err;
    c->rc = rank_build(c, err);
    if (!c->rc)
        c->rc = run_steps(c, err);
    if (!c->rc)
        c->rc = finish(c, err);
    /* Threads of the local backend stop each other; a multi-process job is broken by
     * train_main once this rank has said why. */
    if (c->rc && c->r->dp > 1 && !c->r->multi_process)
        comm_abort(c->comm ? c->comm : c->r->job.comms[c->rank - c->r->job.first_rank]);
    return NULL;
}
