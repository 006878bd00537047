-- K3 claim at GPU scale: Block Attention Residuals beat the standard residual stream (the K3
-- report: about 1.25x compute efficiency). Base: base.lua (Block AttnRes over blocks of 4
-- decoder layers: two blocks of its 8 layers) under seeds 1 and 2; variant: the standard
-- pre-norm residual. The runs are shared with the other GPU suites (see kda_hybrid.lua).
--   k3rt ablate scripts/recipes/ablations/gpu/attnres.lua --reuse
return {
  name = "gpu_attnres",
  base = "base.lua",
  base_name = "block-attnres",
  description = "base.lua with Block AttnRes (blocks of 4 decoder layers) against the " ..
                "standard residual; everything else as base.lua.",
  seeds = { 1, 2 },
  runs = "out/gpu_runs",
  variants = {
    { name = "standard", set = { "model.residual=k3.standard{}" } },
  },
}
