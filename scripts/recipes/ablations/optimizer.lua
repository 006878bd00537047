-- K3 claim: Per-Head Muon (each attention head's block orthogonalised alone) beats Muon over
-- whole matrices, which beats AdamW. Base: tiny.lua with AdamW; variants: Muon
-- (per_head_muon with per_head = false: whole matrices, experts still one matrix each) and
-- Per-Head Muon. One learning rate for all three: Muon's update is RMS-matched to AdamW's.
-- About 20 minutes on two CPU cores.
--   k3rt ablate scripts/recipes/ablations/optimizer.lua
return {
  name = "optimizer",
  base = "../tiny.lua",
  base_name = "adamw",
  description = "tiny.lua trained by AdamW, Muon and Per-Head Muon at lr 3e-3 (weight decay " ..
                "0.1; Muon's update RMS-matched to AdamW's, with an AdamW group for " ..
                "embeddings, norms, router and vectors).",
  set = { "train.steps=1000", "train.eval_interval=100", "train.eval_batches=16",
          "train.checkpoint_interval=0", "optimizer=k3.adamw{lr=3e-3, weight_decay=0.1}" },
  variants = {
    { name = "muon", set = { "optimizer=k3.per_head_muon{lr=3e-3, weight_decay=0.1, " ..
                             "per_head=false}" } },
    { name = "per-head-muon", set = { "optimizer=k3.per_head_muon{lr=3e-3, weight_decay=0.1}" } },
  },
}
