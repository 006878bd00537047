-- Kimi K3 as its published config describes it (spec/kda_mla.md §8.2, spec/
-- moe_balance_attnres.md §1), for `k3rt plan`: 93 layers, 69 KDA and 24 gated MLA (layers
-- 4, 8, ..., 92 and 93, counted from 1), hidden 7168, 96 heads, 896 routed experts top-16 in a
-- 3584-wide latent with expert hidden 3072, 2 shared experts, a dense first layer, vocabulary
-- 163840, 1M context, Block Attention Residuals over blocks of 12 decoder layers, Per-Head Muon.
--   k3rt plan scripts/recipes/k3.lua --gpus 4096
-- It is not meant to train on the CPU: the plan uses expert and context parallelism.
return k3.recipe {
  model = {
    d_model = 7168, vocab = 163840, layers = 93,
    pattern = string.rep("KKKM", 23) .. "M",
    mixers = {
      K = k3.kda { heads = 96, head_dim = 128, conv_width = 4, lower_bound = -5,
                   gate_rank = 0 },  -- full-rank output gate; the forget gate stays rank 128
      M = k3.mla { heads = 96, q_rank = 1536, kv_rank = 512, qk_nope_dim = 128,
                   qk_shared_dim = 64, v_dim = 128, output_gate = true },
    },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 33792, act = "situ" },
    ffn = k3.latent_moe { experts = 896, top_k = 16, latent = 3584, expert_hidden = 3072,
                          shared = 2, shared_hidden = 3072, act = "situ", latent_norm = true },
    balancer = k3.quantile {},
    residual = k3.block_attnres { block_layers = 12 },
  },
  optimizer = k3.per_head_muon { lr = 3e-4, weight_decay = 0.1 },
  -- 4096 GPUs: experts split over 128 ranks (7 per layer each), each 1M-token sequence over
  -- 32 context-parallel ranks (32K tokens per GPU). `k3rt plan` shows that it does not fit in
  -- 141 GB: with only data, expert and context parallelism every GPU holds all 57B non-expert
  -- parameters (113 GB of bf16 weights and 227 GB of fp32 gradients before any expert), so K3
  -- needs tensor or pipeline parallelism (or sharded weights) and activation recompute.
  plan = { dp = 1, ep = 128, cp = 32, micro_batch = 1, seq_len = 1048576,
           shard_optimizer = true },
  train = { steps = 100000, warmup = 2000, schedule = "cosine", seed = 1 },
  data = { tokenizer = "shards", train = "data/k3_train.bin", val = "data/k3_val.bin" },
}
