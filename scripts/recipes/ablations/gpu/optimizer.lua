-- K3 claim at GPU scale: Per-Head Muon beats Muon over whole matrices, which beats AdamW.
-- Base: base.lua (Per-Head Muon, lr 3e-3) under seeds 1 and 2; variants: Muon (per_head_muon
-- with per_head = false: whole matrices, experts still one matrix each) at the same lr (its
-- update is RMS-matched to AdamW's), and AdamW at lr 1e-3, its best in the CPU sweep of
-- docs/ABLATIONS.md where both Muons were best at 3e-3. Weight decay 0.1 throughout. The
-- runs are shared with the other GPU suites (see kda_hybrid.lua).
--   k3rt ablate scripts/recipes/ablations/gpu/optimizer.lua --reuse
return {
  name = "gpu_optimizer",
  base = "base.lua",
  base_name = "per-head-muon",
  description = "base.lua trained by Per-Head Muon (lr 3e-3), Muon over whole matrices " ..
                "(lr 3e-3) and AdamW (lr 1e-3); weight decay 0.1.",
  seeds = { 1, 2 },
  runs = "out/gpu_runs",
  variants = {
    { name = "muon", set = { "optimizer=k3.per_head_muon{lr=3e-3, weight_decay=0.1, " ..
                             "per_head=false}" } },
    { name = "adamw", set = { "optimizer=k3.adamw{lr=1e-3, weight_decay=0.1}" } },
  },
}
