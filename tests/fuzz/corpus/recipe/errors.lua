return k3.recipe {
  model = { d_model = 0, vocab = 256, layers = 3, pattern = "AAB",
    mixers = { A = k3.fixture_mixr{} }, ffn = k3.fixture_ffn{ experts = 4, top_k = 9 } },
  optimizer = k3.fixture_opt{ lr = -1 }, plan = { micro_bach = 2 },
}
