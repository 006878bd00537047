-- The CI ablation: tiny.lua cut down to run three variants in about a minute on two cores.
-- It checks the machinery (runs, table, plots, FLOP accounting), not a claim; the claim suites
-- beside it are the ones recorded in docs/ABLATIONS.md.
--   k3rt ablate scripts/recipes/ablations/ci.lua
return {
  name = "ci",
  base = "../tiny.lua",
  description = "tiny.lua at 120 steps of 8 x 64 tokens; all-MLA and aux-loss-free variants.",
  set = {
    "train.steps=120", "train.warmup=10", "train.eval_interval=30", "train.eval_batches=4",
    "train.log_interval=10", "train.checkpoint_interval=0",
    "plan.micro_batch=8", "plan.seq_len=64",
  },
  variants = {
    { name = "all-mla", set = { "model.pattern='M'", "model.mixers.K=nil" } },
    { name = "aux-free", set = { "model.balancer=k3.aux_free{}" } },
  },
}
