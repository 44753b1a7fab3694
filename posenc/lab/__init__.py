"""The extrapolation lab (`posenc lab`): train tiny transformers per positional scheme and measure what happens
past the training length.

    tasks/         the task registry and the built-in tasks: lm, copy, passkey (sampler, scoring, tables, plots)
    data.py        corpus (CPython stdlib by default), split, the LM sampler
    train.py       AdamW + warmup/cosine loop with checkpoints and resume
    checkpoint.py  safetensors checkpoints (weights, optimizer, step, RNG, settings)
    evaluate.py    extension methods on a trained model (from posenc.extensions) and their band counts
    context.py     Run and Evaluation: the small contexts passed around instead of long argument lists
    run.py         one experiment end to end; report.py / plots.py / tables.py write report.md and PNGs
    presets.py     LabConfig (a ModelConfig + TrainSettings + lab settings) and the presets; cli.py the command
    distributed.py the process group and collectives; launch.py the --nproc re-launch under torchrun
"""
