local parts = {}
for w in ("K K K M"):gmatch("%a") do parts[#parts + 1] = w end
table.sort(parts)
local p = table.concat(parts):gsub("%s", "")
local ok, e = pcall(error, { code = 1 })
local ok2, msg = xpcall(function() error("x") end, function(m) return tostring(m) end)
assert(select("#", table.unpack({ 1, 2, 3 })) == 3)
local t = table.move({ 1, 2, 3 }, 1, 3, 2, {})
return k3.recipe {
  model = { d_model = 16, vocab = 256, layers = #p,
            mixers = { K = k3.fixture_mixer{}, M = k3.fixture_mixer{ scale = math.pi / 4 } },
            pattern = p, ffn = k3.fixture_ffn{ experts = #t + 1 },
            residual = k3.fixture_residual{} },
  optimizer = k3.fixture_opt{ lr = tonumber("1e-3") },
  data = { tokenizer = "shards", train = "t.bin", val = "v.bin" },
  out = string.format("runs/%s-%d", "x", 3),
}
