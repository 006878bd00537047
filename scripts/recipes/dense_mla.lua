-- The dense benchmark model (issue 17): 12 layers of NoPE gated MLA (d_model 1024, 8 heads,
-- kv rank 256, per head 128 nope + 64 shared rope-less query/key dims, values 128, sigmoid
-- output gate) with a dense SiTU-GLU of 4096, the standard pre-norm residual and AdamW; an
-- untied LM head over 32000 tokens. 270.8M parameters (`k3rt plan` counts them). Measured at
-- batch 8 x sequence 4096 against its PyTorch peer (scripts/bench/torch_dense.py, through
-- scripts/bench/step.sh). dtype "auto" is bf16 with fp32 master weights on the GPU (f32 on
-- the CPU); the attention core is cuDNN's fused attention on the GPU, which needs
-- report_max_logit off (no QK-clip here: AdamW). The byte corpus stands in for a 32000-token
-- vocabulary; point data at token shards to train it for real.
return k3.recipe {
  model = {
    d_model = 1024, vocab = 32000, layers = 12,
    mixers = { M = k3.mla { heads = 8, kv_rank = 256, qk_nope_dim = 128, qk_shared_dim = 64,
                            v_dim = 128, output_gate = true, cuda_kernel = "cudnn",
                            report_max_logit = false } },
    ffn = k3.dense_glu { hidden = 4096, act = "situ" },
    residual = k3.standard {},
  },
  optimizer = k3.adamw { lr = 3e-4, weight_decay = 0.1 },
  plan = { micro_batch = 8, seq_len = 4096, dtype = "auto" },
  train = { steps = 1000, warmup = 100, schedule = "cosine", seed = 1, eval_interval = 250 },
  data = { path = "data/tinyshakespeare.txt", tokenizer = "bytes" },
}
