-- K3 claim: a 3:1 hybrid of KDA and (gated NoPE) MLA layers trains better per FLOP than
-- softmax attention alone. Base: tiny.lua's KKKM pattern; variant: all MLA.
-- About 15 minutes on two CPU cores.
--   k3rt ablate scripts/recipes/ablations/kda_hybrid.lua
return {
  name = "kda_hybrid",
  base = "../tiny.lua",
  base_name = "kda-hybrid",
  description = "tiny.lua (KKKM: 3 KDA + 1 gated MLA) against an all-MLA stack; " ..
                "everything else as tiny.lua (LatentMoE + Quantile, Block AttnRes, Per-Head Muon).",
  set = { "train.steps=1000", "train.eval_interval=100", "train.eval_batches=16",
          "train.checkpoint_interval=0" },
  variants = {
    { name = "all-mla", set = { "model.pattern='M'", "model.mixers.K=nil" } },
  },
}
