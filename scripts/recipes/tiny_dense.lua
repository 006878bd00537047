-- The baseline: softmax attention in the MLA form (no positional encoding), a dense
-- SiTU-GLU FFN, the standard pre-norm residual and AdamW, on the bundled Shakespeare corpus
-- through the byte tokenizer. Small enough to train on two CPU cores in a few minutes.
return k3.recipe {
  model = {
    d_model = 128, vocab = 256, layers = 4,
    mixers = { M = k3.mla { heads = 4, kv_rank = 64, qk_nope_dim = 32, qk_shared_dim = 16,
                            v_dim = 32 } },
    ffn = k3.dense_glu { hidden = 384, act = "situ" },
    residual = k3.standard {},
  },
  optimizer = k3.adamw { lr = 3e-3, weight_decay = 0.1 },
  plan = { micro_batch = 16, seq_len = 128 },
  train = { steps = 1500, warmup = 100, schedule = "cosine", seed = 1,
            eval_interval = 500, checkpoint_interval = 500, log_interval = 25 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
}
