"""Searches that fit a positional encoding to a trained model: LongRoPE's evolutionary search of per-pair RoPE
rescale factors (``posenc.search.longrope``), its search space (``longrope_space``) and a model-agnostic
perplexity fitness (``fitness``). See docs/extension-training.md."""
