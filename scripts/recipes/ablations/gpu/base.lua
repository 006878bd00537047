-- The base of the GPU ablation suites beside this file: K3-mini's shape (scripts/recipes/
-- k3_mini.lua) scaled to a few minutes of an H200 per run. 8 layers at d_model 768, KDA at
-- layers 1-3 and 5-7 (6 heads x 128, conv 4, lower bound -5, full-rank output gate) and gated
-- NoPE MLA at 4 and 8 (6 heads, kv rank 192, 128 nope + 64 shared key dims, v 128); a dense
-- SiTU-GLU first layer (3072), then Stable LatentMoE (32 experts, top-4, latent 384, expert
-- hidden 576, latent RMSNorm, one shared expert of 768) balanced by Quantile Balancing; Block
-- AttnRes over blocks of 4 decoder layers; Per-Head Muon.
--   196.91M parameters, 66.66M active per token (`k3rt plan`: LM head counted, embedding
--   lookup not); 426 MFLOP per token forward + backward at seq_len 1024, 3.49 TFLOP a step.
--
-- Data: the bundled Shakespeare as bytes, 1.0M training tokens (the last tenth is the
-- validation split). A step is 8 x 1024 = 8192 tokens, so the 250 steps see 2.05M tokens,
-- about two passes over the training text: more would let a model this size memorise it and
-- measure overfitting instead of the ablated techniques. Every run evaluates on the whole
-- validation split (13 batches) every 25 steps, so the compute-efficiency curve has 10 points.
--
-- plan.device "auto" trains on the GPU when there is one: bf16 compute with fp32 master
-- weights, gradients and optimizer state (dtype "auto", as k3_mini.lua and dense_mla.lua).
-- On a CPU it runs in f32, far too slowly at this size; shrink it there with --set
-- (tests/integration/test_ablate.c does, for 3 steps).
return k3.recipe {
  model = {
    d_model = 768, vocab = 256, layers = 8,
    pattern = "KKKM",
    mixers = {
      K = k3.kda { heads = 6, head_dim = 128, conv_width = 4, lower_bound = -5, gate_rank = 0 },
      M = k3.mla { heads = 6, kv_rank = 192, qk_nope_dim = 128, qk_shared_dim = 64, v_dim = 128,
                   output_gate = true },
    },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 3072, act = "situ" },
    ffn = k3.latent_moe { experts = 32, top_k = 4, latent = 384, expert_hidden = 576,
                          shared = 1, shared_hidden = 768, act = "situ", latent_norm = true },
    balancer = k3.quantile {},
    residual = k3.block_attnres { block_layers = 4 },
  },
  optimizer = k3.per_head_muon { lr = 3e-3, weight_decay = 0.1 },
  plan = { micro_batch = 8, seq_len = 1024, device = "auto", dtype = "auto" },
  train = { steps = 250, warmup = 25, schedule = "cosine", seed = 1, log_interval = 10,
            eval_interval = 25, eval_batches = 0, checkpoint_interval = 0 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
}
