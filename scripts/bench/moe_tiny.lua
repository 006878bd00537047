-- The balancer bench's model (scripts/bench/balancers.sh): the baseline of tiny_dense.lua with
-- its FFNs replaced by Stable LatentMoE after one dense layer. The balancer is chosen per run
-- with --set model.balancer=...; none by default.
return k3.recipe {
  model = {
    d_model = 128, vocab = 256, layers = 4,
    mixers = { M = k3.mla { heads = 4, kv_rank = 64, qk_nope_dim = 32, qk_shared_dim = 16,
                            v_dim = 32 } },
    ffn = k3.latent_moe { experts = 16, top_k = 4, latent = 64, expert_hidden = 128,
                          shared = 1, shared_hidden = 128, act = "situ" },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 384, act = "situ" },
    balancer = k3.none {},
    residual = k3.standard {},
  },
  optimizer = k3.adamw { lr = 3e-3, weight_decay = 0.1 },
  plan = { micro_batch = 16, seq_len = 128 },
  train = { steps = 200, warmup = 20, schedule = "cosine", seed = 1,
            eval_interval = 0, checkpoint_interval = 0, log_interval = 1 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
}
