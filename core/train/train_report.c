/* What a run tells (rank 0): the header of what it will do, progress lines and JSON-lines
 * metrics with per-layer MoE load statistics, and the loss history its loss chart is drawn
 * from. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "train/train_internal.h"
#include "util/log.h"

static void human(double n, char *buf, size_t len)
{
    if (n >= 1e9)
        snprintf(buf, len, "%.2fB", n / 1e9);
    else if (n >= 1e6)
        snprintf(buf, len, "%.2fM", n / 1e6);
    else if (n >= 1e3)
        snprintf(buf, len, "%.1fK", n / 1e3);
    else
        snprintf(buf, len, "%.0f", n);
}

int train_write_record(run *r, const json_t *rec, k3rt_error *err)
{
    char *line = rec ? json_dumps(rec, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    int ok = line && fprintf(r->metrics, "%s\n", line) >= 0 && fflush(r->metrics) == 0;
    free(line);
    return ok ? K3RT_OK : k3rt_fail(err, K3RT_ERR_IO, "%s/metrics.jsonl: write failed", r->out);
}

/* What the run will do: model size, FLOPs, memory, plugins (llm.c prints this too). */
int train_print_header(rank_ctx *c, k3rt_error *err)
{
    run *r = c->r;
    model *m = &c->m;
    int64_t total, active;
    model_param_counts(m, &total, &active);
    double f, b;
    K3RT_TRY(model_flops(m, r->B, r->T, &f, &b, err));
    char t[32], a[32], fl[32];
    human((double)total, t, sizeof t);
    human((double)active, a, sizeof a);
    human((f + b) / (double)(r->B * r->T), fl, sizeof fl);
    log_info("k3rt %s | %s | %d layers, d_model %lld, vocab %lld | %s parameters (%s active "
             "per token) | %s FLOPs/token (fwd+bwd)", k3rt_version_string(),
             recipe_path(r->rec), m->n_layers, (long long)m->d, (long long)m->vocab, t, a, fl);
    char pattern[256] = "";
    for (int i = 0; i < m->n_layers && i < 255; i++)
        pattern[i] = m->layers[i].mixer_letter;
    log_info("layers: pattern %s | mixers %s | ffn %s | residual %s | balancer %s | optimizer "
             "%s", pattern, m->mods[m->layers[0].mixer].r.e->desc.name,
             m->mods[m->layers[m->n_layers - 1].ffn].r.e->desc.name,
             m->mods[m->residual].r.e->desc.name,
             json_string_value(json_object_get(r->balancer, "plugin")), c->opt.e->desc.name);
    if (r->device != K3RT_DEVICE_CPU)
        log_info("device: cuda:%d %s, compute %s%s, peak %s", r->device, r->device_name,
                 k3rt_dtype_name(m->opt.dtype), m->compute_buf ? " (fp32 master weights and "
                 "gradients)" : "", r->peak_flops > 0 ? "known (MFU shown)" :
                 "unknown: set plan.peak_tflops for MFU");
    log_info("plan: %s, %d rank%s x %d thread%s, micro-batch %lld x %lld tokens, grad accum "
             "%lld, %lld steps, %lld train / %lld validation tokens, activations %.1f MiB",
             r->device == K3RT_DEVICE_CPU ? "cpu" : "cuda", r->dp, r->dp > 1 ? "s" : "",
             r->threads_per_rank, r->threads_per_rank > 1 ? "s" : "",
             (long long)r->B, (long long)r->T, (long long)r->accum, (long long)r->steps,
             (long long)r->train.n, (long long)r->val.n, (double)m->act_bytes / (1 << 20));
    if (r->train.n_docs || r->val.n_docs)
        log_info("data: %lld train / %lld validation documents (the shards' .docs boundaries): "
                 "%s", (long long)r->train.n_docs, (long long)r->val.n_docs,
                 r->packed ? "the token mixers restart at each (data.packed_documents)"
                           : "windows run across them (data.packed_documents restarts the "
                             "token mixers there)");
    train_print_act_plan(r);
    return K3RT_OK;
}

/* Load statistics of one MoE layer from the tokens each expert received this step. */
static json_t *layer_load(const int64_t *counts, int experts, int top_k, double *maxvio)
{
    int64_t lo = counts[0], hi = counts[0], total = 0;
    int dead = 0;
    for (int e = 0; e < experts; e++) {
        lo = counts[e] < lo ? counts[e] : lo;
        hi = counts[e] > hi ? counts[e] : hi;
        total += counts[e];
        dead += counts[e] == 0;
    }
    double mean = (double)total / experts, var = 0;
    for (int e = 0; e < experts; e++)
        var += ((double)counts[e] - mean) * ((double)counts[e] - mean);
    double cv = mean > 0 ? sqrt(var / experts) / mean : 0;
    *maxvio = mean > 0 ? (double)hi / mean - 1.0 : 0;
    return json_pack("{s:I, s:I, s:f, s:f, s:i, s:i}", "min", (json_int_t)lo, "max",
                     (json_int_t)hi, "maxvio", *maxvio, "cv", cv, "dead", dead, "top_k", top_k);
}

json_t *moe_metrics(rank_ctx *c, double *worst_maxvio)
{
    model *m = &c->m;
    json_t *layers = NULL;
    *worst_maxvio = -1;
    for (int i = 0; i < m->n_layers; i++) {
        if (!m->routed[i])
            continue;
        double v;
        json_t *l = layer_load(m->routed[i], m->layers[i].experts, m->layers[i].top_k, &v);
        if (!layers)
            layers = json_object();
        char key[32];
        snprintf(key, sizeof key, "layers.%d", i);
        json_object_set_new(layers, key, l);
        if (v > *worst_maxvio)
            *worst_maxvio = v;
    }
    return layers;
}

static void format_eta(double s, char *buf, size_t len)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, len, "?");
    else if (s >= 3600)
        snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else
        snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

int report_metrics(rank_ctx *c, json_t *rec, k3rt_error *err)
{
    run *r = c->r;
    double now = time_now(), dt = now - c->interval_t0;
    double tps = dt > 0 ? (double)c->interval_tokens / dt : 0;
    int64_t step = json_integer_value(json_object_get(rec, "step"));
    double mean = c->interval_steps ? c->interval_loss / (double)c->interval_steps : NAN;
    double worst = -1;
    json_t *moe = moe_metrics(c, &worst);
    if (c->rank == 0) {
        double elapsed = now - r->t_start;
        double eta = (double)(r->steps - step) * (elapsed / (double)(step - r->start_step));
        json_object_set_new(rec, "train_loss_mean", json_real(isfinite(mean) ? mean : -1));
        json_object_set_new(rec, "tokens_per_s", json_real(tps));
        json_object_set_new(rec, "elapsed_s", json_real(elapsed));
        json_object_set_new(rec, "eta_s", json_real(eta));
        if (moe) {
            json_object_set(rec, "moe", moe);
            json_object_set_new(rec, "maxvio_worst", json_real(worst));
        }
        /* The interval's peak on rank 0's device, then a new window for the next interval. */
        double peak = (double)k3rt_device_memory_peak(r->device, 1);
        char mem[48];
        plan_bytes(peak, mem, sizeof mem);
        json_object_set_new(rec, "peak_mem_bytes", json_real(peak));
        char mfu[64] = "";
        if (r->peak_flops > 0 && dt > 0) {
            /* Both counts: the plugins' own FLOPs, and the 6 N_active per token convention. */
            double steps = (double)c->interval_steps, all = r->peak_flops * (double)r->dp * dt;
            double own = c->step_flops * steps / all, six = c->six_n_flops * steps / all;
            json_object_set_new(rec, "mfu", json_real(own));
            json_object_set_new(rec, "mfu_6n", json_real(six));
            snprintf(mfu, sizeof mfu, " | MFU %.1f%% (6N %.1f%%)", 100 * own, 100 * six);
        }
        if (train_write_record(r, rec, err)) {
            json_decref(moe);
            return err->code;
        }
        if (isfinite(mean))
            r->result.final_train_loss = mean;
        if (!r->opt.quiet) {
            char eta_s[32], vio[48] = "";
            format_eta(eta, eta_s, sizeof eta_s);
            if (moe)
                snprintf(vio, sizeof vio, " | maxvio %.2f", worst);
            log_info("step %6lld/%lld | loss %.4f | lr %.2e | grad %.3f | %.1fk tok/s%s%s | mem "
                     "%s | ETA %s", (long long)step, (long long)r->steps, mean,
                     json_real_value(json_object_get(rec, "lr")),
                     json_number_value(json_object_get(rec, "grad_norm")), tps / 1000.0, mfu, vio,
                     mem, eta_s);
        }
    }
    json_decref(moe);
    c->interval_loss = 0;
    c->interval_steps = 0;
    c->interval_tokens = 0;
    c->interval_t0 = now;
    return K3RT_OK;
}

int loss_series_add(loss_series *s, double x, double y, k3rt_error *err)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "loss history: out of memory");
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "loss history: out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return K3RT_OK;
}

void loss_history_free(loss_history *h)
{
    free(h->train.x), free(h->train.y), free(h->val.x), free(h->val.y);
    memset(h, 0, sizeof *h);
}
