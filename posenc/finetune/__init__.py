"""``posenc finetune MODEL --method yarn --target-length L --out DIR``: extend a checkpoint's context by a short
fine-tune on the CPU: the extended config (any registered frequency method, written by posenc.tools.extend), PoSE
position ids (posenc.pose) on short windows, LoRA adapters through peft (or every weight), and a transformers
folder with the adapters merged (docs/finetune.md).

    settings.py  FinetuneSettings and the checks of bad input (one ConfigError naming the argument each)
    data.py      the training text as the model's tokens, PoSE windows drawn per step, the held-out windows
    adapters.py  LoRA through peft or full fine-tuning, what is trainable, merging, the folders written
    loop.py      the training loop (the lab's AdamW, schedule, step and checkpoints), validation, resume
    run.py       ``finetune(settings)``: the whole job, and DIR/finetune.json
    command.py   the command

peft and transformers are imported only when a fine-tune runs (the ``finetune`` extra installs them).
"""
