-- The main job: a K3-style model small enough to train on two CPU cores in minutes.
-- Three KDA layers then one gated NoPE MLA layer; a dense SiTU-GLU first layer, then Stable
-- LatentMoE with Quantile Balancing; Block Attention Residuals over blocks of two decoder
-- layers; Per-Head Muon with an AdamW group for embeddings, norms and vectors.
return k3.recipe {
  model = {
    d_model = 128, vocab = 256, layers = 4,
    pattern = "KKKM",
    mixers = {
      K = k3.kda { heads = 4, head_dim = 32, lower_bound = -5 },
      M = k3.mla { heads = 4, kv_rank = 64, qk_nope_dim = 32, qk_shared_dim = 16, v_dim = 32,
                   output_gate = true },
    },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 384, act = "situ" },
    ffn = k3.latent_moe { experts = 8, top_k = 2, latent = 64, expert_hidden = 192,
                          shared = 1, shared_hidden = 256, act = "situ" },
    balancer = k3.quantile {},
    residual = k3.block_attnres { block_layers = 2 },
  },
  optimizer = k3.per_head_muon { lr = 3e-3, weight_decay = 0.1 },
  plan = { micro_batch = 16, seq_len = 128 },
  train = { steps = 1000, warmup = 100, schedule = "cosine", seed = 1,
            eval_interval = 250, checkpoint_interval = 500, log_interval = 25 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
  sample = { bytes = 500, temperature = 0.7 },
}
