/* State shared by the trainer's files: one `run` for the process, one `rank_ctx` per
 * data-parallel rank it runs (threads of the local backend, or the one rank of a process of
 * a multi-process job). */
#ifndef K3RT_TRAIN_INTERNAL_H
#define K3RT_TRAIN_INTERNAL_H

#include <pthread.h>
#include <stdio.h>

#include "comm/comm_open.h"
#include "model/model.h"
#include "recipe/recipe.h"
#include "train/data.h"
#include "train/schedule.h"
#include "train/trainer.h"

typedef struct run {
    train_options opt;
    registry reg;
    recipe *rec;
    const json_t *doc;            /* the validated recipe document (owned by rec) */
    int64_t steps, log_interval, eval_interval, eval_batches, ckpt_interval, keep, max_bad;
    int eval_at_start;
    double grad_clip;
    lr_schedule sched;
    int64_t B, T, accum;
    int dp, threads_per_rank, dtype;
    int device;                   /* K3RT_DEVICE_CPU or the CUDA ordinal every rank runs on */
    char device_name[128];        /* "cpu" or the GPU's name */
    double peak_flops;            /* per rank, for MFU; 0 = unknown (no MFU shown) */
    uint64_t seed;
    char out[1024], ckpt_root[1100];
    token_stream train, val;
    int packed;                   /* data.packed_documents: batches carry document offsets */
    int64_t start_step;           /* steps already done (resume) */
    char resume_dir[1200];
    json_t *manifest;             /* of the checkpoint resumed from */
    json_t *identity;             /* {id, recipe_sha256, seed, started}: in every manifest */
    char run_id[160];             /* identity.id: the lineage pruning keeps to */
    json_t *changes;              /* mid-run changes applied so far: [{step, balancer}] */
    json_t *balancer;             /* the balancer spec in effect */
    struct plan_report *act_plan; /* under plan.memory_budget: the planner's report, else NULL */
    json_t *act_planned;          /* its {class: policy} for the free classes (model_options) */
    comm_job job;                 /* the ranks of this process: threads (local) or one */
    int multi_process;            /* one rank per process (mpi, tcp): each writes only its own */
    int status_fd;                /* K3RT_LAUNCH_DIR's rank file for k3rt launch, or -1 */
    FILE *metrics;                /* rank 0 */
    train_result result;
    loss_history history;         /* rank 0 */
    double t_start;
    pthread_mutex_t lock;
} run;

typedef struct rank_ctx {
    run *r;
    int rank;
    k3rt_comm *comm, *dp;
    k3rt_stream *stream;
    model m;
    rig opt;
    k3rt_param_ref *refs;
    /* ZeRO-1 (train_shard.c): each parameter's owning rank, the ones this rank owns (its
     * optimizer's parameters, in order) and their refs as the optimizer is called with */
    int sharded, n_own;
    int *owner, *own;
    k3rt_param_ref *own_refs;
    float *max_logits;            /* per parameter with qk_clip: [heads] */
    int bad_in_row;
    double interval_loss;
    int64_t interval_steps, interval_tokens;
    double interval_t0;
    double step_flops;            /* model FLOPs (forward + backward) of one optimizer step */
    double six_n_flops;           /* 6 * active parameters * tokens of one optimizer step */
    struct profile *prof;         /* --profile (rank 0), else NULL */
    int64_t prof_first, prof_last;/* the steps it reports (after its warm-up steps) */
    int rc;
    k3rt_error err;
} rank_ctx;

/* train_resume.c: the output folder, the run identity and the resume point (fresh runs
 * refuse a folder with checkpoints unless --force; --resume falls back past unusable
 * checkpoints); opens the metrics file. */
int output_prepare(run *r, k3rt_error *err);
/* The other processes of a multi-process job, after rank 0's output_prepare: the folder's
 * paths and (--resume) the checkpoint rank 0 picked; nothing written. */
int output_follow(run *r, k3rt_error *err);

/* train_status.c: for k3rt launch (K3RT_LAUNCH_DIR set), this rank's pid and current step in
 * <dir>/rank.<r>, so that the launcher can say which step a rank that died was at. */
void status_open(run *r, int rank);
void status_step(run *r, int64_t step);
void status_close(run *r);
/* train_shard.c: ZeRO-1. shard_setup assigns the owners (every parameter to this rank when
 * sharding is off); shard_refs is the refs of this rank's parameters for its optimizer;
 * shard_publish (sharded runs only) broadcasts each updated parameter from its owner. */
int shard_on(const run *r);
int shard_setup(rank_ctx *c, k3rt_error *err);
const k3rt_param_ref *shard_refs(rank_ctx *c);
int shard_publish(rank_ctx *c, k3rt_error *err);
/* The data-parallel gradient average: to each tensor's owner (sharded), or to every rank. */
int shard_reduce_grads(rank_ctx *c, k3rt_error *err);
/* The squared gradient norm every rank agrees on (see train_shard.c for its order). */
int shard_grad_sum_squares(rank_ctx *c, double *ss, k3rt_error *err);
void shard_free(rank_ctx *c);
/* train_replicas.c: every data-parallel rank holds the same weights (an error naming the
 * first rank that differs otherwise). */
int replicas_agree(rank_ctx *c, int64_t step, k3rt_error *err);

/* train_setup.c */
int run_setup(run *r, const train_options *o, k3rt_error *err);
void run_free(run *r);
int rank_build(rank_ctx *c, k3rt_error *err);
void rank_free(rank_ctx *c);

/* train_loop.c */
void *rank_main(void *arg);

/* ckpt_run.c */
/* Rank 0: weights, state and manifest into a new step directory, then the commit. begun:
 * the step_N.tmp directory already made (ZeRO-1: the ranks' shards are in it), or NULL;
 * shards: the manifest's "optimizer_shards" (NULL: the optimizer state goes into
 * state.safetensors), shard_sums: {file: checksums} of the shards. */
int ckpt_save_run(rank_ctx *c, int64_t step, const char *begun, json_t *shards,
                  json_t *shard_sums, k3rt_error *err);
/* Points e at t's data (dtype and shape too), first copied to the host (into *owned, which
 * the caller frees) when t lives on a GPU. */
struct st_entry;
int ckpt_entry_data(struct st_entry *e, const k3rt_tensor *t, k3rt_stream *s, void **owned,
                    k3rt_error *err);
/* One safetensors file of this rank's state: the modules' (mods), the optimizer's (opt), under
 * the names of state.safetensors; *sums gets its checksums. */
int ckpt_write_state(rank_ctx *c, const char *path, int mods, int opt, json_t **sums,
                     k3rt_error *err);
/* ckpt_shard.c (collective, sharded runs): every rank writes its optimizer shard into
 * step_N.tmp, rank 0 commits the step once all are on disk. */
int ckpt_save_sharded(rank_ctx *c, int64_t step, k3rt_error *err);
int ckpt_load_run(rank_ctx *c, k3rt_error *err);
/* Checks a resumed manifest against the run: plan, plugins (model shape is checked when the
 * weights load). */
int ckpt_check_compatible(run *r, k3rt_error *err);
json_t *manifest_plugins(const model *m, const rig *opt);
/* Loads a checkpoint's weights / its plugin states (opt may be NULL: the optimizer's state is
 * then not read) into a built model. */
int ckpt_load_weights(model *m, const char *path, k3rt_error *err);
/* train.init_weights of the recipe document, when it names a file, over the model's
 * parameters, then train.init_state over the modules' state. */
int load_init_weights(model *m, const json_t *doc, k3rt_error *err);
/* The module states (a balancer's bias) the file holds; the others keep their fresh values, and
 * a tensor of the file that no module keeps is refused by name. */
int ckpt_load_init_states(model *m, const char *path, k3rt_error *err);
int ckpt_load_states(model *m, rig *opt, const char *path, k3rt_error *err);

/* train_eval.c: the documents of B windows of s starting at starts[b] (-1: padding) set on
 * the model for its next forwards (data.packed_documents). */
int set_window_documents(model *m, const token_stream *s, const int64_t *starts, int64_t B,
                         int64_t T, k3rt_error *err);
/* train_eval.c: the windows of split s taken by `rank` of `ranks`; acc = {loss sum, count};
 * packed: with the split's document boundaries (data.packed_documents). */
int eval_windows(model *m, const token_stream *s, int64_t B, int64_t T, int rank, int ranks,
                 int64_t max_windows, int packed, double acc[2], k3rt_error *err);
int eval_split(rank_ctx *c, const token_stream *s, int64_t max_windows, double *mean,
               k3rt_error *err);

/* train_profile.c: --profile's steps, bracketing train_step (m.prof is set between the two
 * calls of a profiled or warm-up step), its table and metrics record after the last one. */
int train_profile_setup(rank_ctx *c, k3rt_error *err);
int train_profile_begin(rank_ctx *c, int64_t step, k3rt_error *err);
int train_profile_end(rank_ctx *c, int64_t step, k3rt_error *err);
void train_profile_free(rank_ctx *c);

/* train_report.c */
/* What the run will do: model size, FLOPs, memory, plugins (llm.c prints this too). */
int train_print_header(rank_ctx *c, k3rt_error *err);
void report_progress(rank_ctx *c, int64_t step, double lr, double gnorm, const json_t *moe);
int report_metrics(rank_ctx *c, json_t *record, k3rt_error *err);
/* One line of metrics.jsonl (rank 0); rec NULL (out of memory) fails too. */
int train_write_record(run *r, const json_t *rec, k3rt_error *err);
/* train_actplan.c: plan.memory_budget's activation plan (run_setup), its table (the header)
 * and the {"step", "activations"} record of what the first step measured. */
int train_plan_activations(run *r, k3rt_error *err);
void train_print_act_plan(const run *r);
int train_act_record(rank_ctx *c, int64_t step, k3rt_error *err);
json_t *moe_metrics(rank_ctx *c, double *worst_maxvio);
int loss_series_add(loss_series *s, double x, double y, k3rt_error *err);
void loss_history_free(loss_history *h);

/* train_sample.c */
/* How a sample was made. */
typedef struct sample_stats {
    int cached;            /* 1: incremental decoding; 0: the sliding context recomputed */
    char why[256];         /* when not cached: why (the mixer without a cache, or "asked for") */
    int64_t tokens;        /* bytes generated */
    int64_t context;       /* bytes of the final context: the prompt and what was generated */
    double seconds;        /* wall time of the prompt and the generation */
} sample_stats;
/* `bytes` bytes continuing `prompt` (sample_cfg: the recipe's sample section; "recompute":
 * true forces the sliding context of seq_len bytes, the path of models that cannot decode
 * incrementally). With incremental decoding the context is the whole text, past seq_len too:
 * KDA's state has no length, MLA's latent cache grows. *out is malloc'd; st may be NULL. */
int sample_text(model *m, int64_t seq_len, const json_t *sample_cfg, char **out,
                sample_stats *st, k3rt_error *err);
/* Draws a token from softmax(logits / temperature), restricted to the top_k largest
 * (top_k <= 0: all); temperature <= 0 is greedy. Overwrites logits. */
int32_t sample_draw(double *logits, int64_t V, double temperature, int64_t top_k, k3rt_rng *rng);
/* Fraction of the whitespace-separated words of text that occur in corpus[0..n). */
int sample_word_coverage(const char *corpus, int64_t n, const char *text, double *fraction,
                         int64_t *words, k3rt_error *err);

#endif
