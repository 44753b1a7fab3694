"""The extrapolation lab (`posenc lab`): train tiny transformers per positional scheme and measure what happens
past the training length.

    data.py        corpus (CPython stdlib by default), split, samplers for lm / copy / passkey
    train.py       AdamW + warmup/cosine loop with checkpoints and resume
    checkpoint.py  safetensors checkpoints (weights, optimizer, step, RNG, settings)
    evaluate.py    perplexity (non-overlapping, sliding), per-position loss, copy, passkey, extension configs
    run.py         one experiment end to end; report.py / plots.py write report.md and PNGs
    presets.py     LabConfig and the named presets; cli.py the `posenc lab` command
"""
