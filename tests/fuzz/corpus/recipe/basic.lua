return k3.recipe {
  model = { d_model = 32, vocab = 256, layers = 4,
    mixers = { A = k3.fixture_mixer{ heads = 2, act = "swiglu" }, B = k3.fixture_mixer{} },
    pattern = 'AB', ffn = k3.fixture_ffn{ experts = 4, top_k = 2 },
    balancer = k3.fixture_balancer{ rate = 0.5 },
    residual = k3.fixture_residual{} },
  optimizer = k3.fixture_opt{ lr = 3e-3 },
  plan = { micro_batch = 2, seq_len = 16, dp = 1 },
  train = { steps = 10, warmup = 2, schedule = "linear",
            changes = { { step = 5, balancer = k3.none{} } } },
  data = { path = 'data/x.txt', val_fraction = 0.2 },
  sample = { bytes = 10, temperature = 0.5, prompt = "to be" },
}
