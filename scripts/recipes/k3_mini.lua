-- K3-mini, the benchmark model of DESIGN.md: 16 layers at d_model 1024, KDA at layers 1-3,
-- 5-7, 9-11, 13-15 and gated NoPE MLA at 4, 8, 12, 16; a dense SiTU-GLU first layer, then
-- Stable LatentMoE (64 experts, top-8, latent 512); Block AttnRes over blocks of 4 decoder
-- layers; untied LM head. 1.36B parameters, 335M active per token (`k3rt plan` counts them).
-- Measured at batch 8 x sequence 4096; the byte corpus stands in for a 32000-token vocabulary
-- (the model is the same; point data at token shards to train it for real).
return k3.recipe {
  model = {
    d_model = 1024, vocab = 32000, layers = 16,
    pattern = "KKKM",
    mixers = {
      K = k3.kda { heads = 8, head_dim = 128, conv_width = 4, lower_bound = -5, gate_rank = 0 },
      M = k3.mla { heads = 8, kv_rank = 256, qk_nope_dim = 128, qk_shared_dim = 64, v_dim = 128,
                   output_gate = true },
    },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 4096, act = "situ" },
    ffn = k3.latent_moe { experts = 64, top_k = 8, latent = 512, expert_hidden = 768,
                          shared = 1, shared_hidden = 1024, act = "situ", latent_norm = true },
    balancer = k3.quantile {},
    residual = k3.block_attnres { block_layers = 4 },
  },
  optimizer = k3.per_head_muon { lr = 3e-3, weight_decay = 0.1 },
  plan = { micro_batch = 8, seq_len = 4096 },
  train = { steps = 1000, warmup = 100, schedule = "cosine", seed = 1, eval_interval = 250 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
}
