-- K3 claim: Quantile Balancing keeps experts balanced (low MaxVio) without hurting the loss,
-- where DeepSeek's auxiliary-loss-free bias update needs a step size tuned. Base: tiny.lua
-- with aux_free; variant: Quantile Balancing (K3). Read the MaxVio column (worst layer, mean
-- over the last tenth of the run) beside the loss; a plain auxiliary loss is one --set away
-- (model.balancer=k3.aux_loss{}). About 15 minutes on two CPU cores.
--   k3rt ablate scripts/recipes/ablations/balancer.lua
return {
  name = "balancer",
  base = "../tiny.lua",
  base_name = "aux-free",
  description = "tiny.lua's LatentMoE (8 experts, top-2) balanced by the auxiliary-loss-free " ..
                "bias (gamma 1e-3) and by Quantile Balancing.",
  set = { "train.steps=1000", "train.eval_interval=100", "train.eval_batches=16",
          "train.checkpoint_interval=0", "model.balancer=k3.aux_free{}" },
  variants = {
    { name = "quantile", set = { "model.balancer=k3.quantile{}" } },
  },
}
