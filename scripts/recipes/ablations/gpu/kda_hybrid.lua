-- K3 claim at GPU scale: the 3:1 hybrid of KDA and gated NoPE MLA trains better per FLOP than
-- MLA alone (the K3 report: about 1.16x compute efficiency). Base: base.lua (KKKM, the K3
-- configuration) under seeds 1 and 2; variant: every layer MLA. The runs go to a folder the
-- four GPU suites share, so with --reuse the base trains once for all of them.
--   k3rt ablate scripts/recipes/ablations/gpu/kda_hybrid.lua --reuse
return {
  name = "gpu_kda_hybrid",
  base = "base.lua",
  base_name = "kda-hybrid",
  description = "base.lua (8 layers, d 768, KKKM: 6 KDA + 2 gated NoPE MLA; LatentMoE 32 x " ..
                "top-4 + Quantile, Block AttnRes, Per-Head Muon) against an all-MLA stack.",
  seeds = { 1, 2 },
  runs = "out/gpu_runs",
  variants = {
    { name = "all-mla", set = { "model.pattern='M'", "model.mixers.K=nil" } },
  },
}
