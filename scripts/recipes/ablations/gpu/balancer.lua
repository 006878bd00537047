-- K3 claim at GPU scale: Quantile Balancing keeps 32 experts balanced (low MaxVio) without
-- hurting the loss, where the auxiliary-loss-free bias needs its step size tuned. Base:
-- base.lua (Quantile Balancing) under seeds 1 and 2; variant: the aux-free bias at its
-- default step size (gamma 1e-3). Read MaxVio beside the loss. The runs are shared with the
-- other GPU suites (see kda_hybrid.lua).
--   k3rt ablate scripts/recipes/ablations/gpu/balancer.lua --reuse
return {
  name = "gpu_balancer",
  base = "base.lua",
  base_name = "quantile",
  description = "base.lua's LatentMoE (32 experts, top-4, 7 MoE layers) balanced by " ..
                "Quantile Balancing and by the auxiliary-loss-free bias (gamma 1e-3).",
  seeds = { 1, 2 },
  runs = "out/gpu_runs",
  variants = {
    { name = "aux-free", set = { "model.balancer=k3.aux_free{}" } },
  },
}
