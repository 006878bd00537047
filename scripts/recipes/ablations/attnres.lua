-- K3 claim: Block Attention Residuals beat the standard residual stream. Base: tiny.lua with
-- the standard pre-norm residual; variant: Block AttnRes over blocks of 2 decoder layers
-- (tiny.lua's own setting). Full AttnRes is one --set away: model.residual=
-- k3.block_attnres{full=true}. About 15 minutes on two CPU cores.
--   k3rt ablate scripts/recipes/ablations/attnres.lua
return {
  name = "attnres",
  base = "../tiny.lua",
  base_name = "standard",
  description = "tiny.lua with the standard residual against Block Attention Residuals; " ..
                "everything else as tiny.lua.",
  set = { "train.steps=1000", "train.eval_interval=100", "train.eval_batches=16",
          "train.checkpoint_interval=0", "model.residual=k3.standard{}" },
  variants = {
    { name = "block-attnres", set = { "model.residual=k3.block_attnres{block_layers=2}" } },
  },
}
