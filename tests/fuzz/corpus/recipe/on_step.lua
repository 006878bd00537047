local n = 0
return {
  model = { d_model = 8, vocab = 8, layers = 2, pattern = string.rep("M", 2),
    mixers = { M = k3.plugin("fixture_mixer", { lower_bound = k3.none }) },
    ffn = k3.fixture_ffn{ experts = 2 }, residual = k3.fixture_residual{} },
  optimizer = k3.fixture_opt{ lr = 1 }, data = { path = 'x' },
  on_step = function(step, m)
    n = n + 1
    if m.loss > 1 and step % 3 == 0 then
      return { balancer = k3.fixture_balancer{ rate = m.loss / 10 } }
    end
  end,
}
