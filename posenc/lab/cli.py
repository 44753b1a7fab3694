"""`posenc lab`: train tiny transformers per positional scheme and measure length extrapolation.

    posenc lab                                   # the default comparison (a few minutes on a laptop CPU)
    posenc lab --preset smoke                    # CI-sized end-to-end run
    posenc lab --preset ntk --steps 3000 --seeds 0,1,2 --out runs/ntk3
    posenc lab --schemes rope,alibi --eval-lens 128,512,2048 --finetune-steps 100
    posenc lab --out runs/x --resume             # continue an interrupted run from its checkpoints

Every preset setting can be overridden by the flag of the same name; lists are comma-separated.
"""

from __future__ import annotations

import argparse

from posenc.lab.presets import ALL_EXTENSIONS, ALL_SCHEMES, PRESETS, TASKS

HELP = "train tiny transformers per positional scheme and measure length extrapolation"


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _bool(text: str) -> bool:
    if text.lower() in ("1", "yes", "true", "on"):
        return True
    if text.lower() in ("0", "no", "false", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    return [] if names == ["none"] else names


# flag -> (LabConfig field, type, help)
FLAGS = [
    ("--tasks", "tasks", _names, f"tasks to run, from {','.join(TASKS)}"),
    ("--schemes", "schemes", _names, f"schemes to train, from {','.join(ALL_SCHEMES)}"),
    ("--d-model", "d_model", int, "model width"),
    ("--layers", "n_layers", int, "number of layers"),
    ("--heads", "n_heads", int, "attention heads"),
    ("--rope-base", "rope_base", float, "RoPE theta"),
    ("--rope-layout", "rope_layout", str, "RoPE pair layout: half (HF) or interleaved"),
    ("--scale-embeddings", "scale_embeddings", _bool, "multiply token embeddings by sqrt(d_model) (yes/no)"),
    ("--train-len", "train_len", int, "training sequence length"),
    ("--batch-size", "batch_size", int, "sequences per step"),
    ("--steps", "steps", int, "training steps"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--warmup", "warmup", int, "warmup steps"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--grad-clip", "grad_clip", float, "gradient-norm clip"),
    ("--seeds", "seeds", _ints, "comma-separated seeds; several are reported as mean +- std"),
    ("--eval-lens", "eval_lens", _ints, "comma-separated evaluation lengths"),
    ("--eval-tokens", "eval_tokens", int, "tokens scored per LM evaluation length"),
    ("--sliding-stride", "sliding_stride", int, "stride of the sliding-window LM eval (-1: half the window, 0: off)"),
    ("--sliding-lens", "sliding_lens", _ints, "lengths for the sliding-window eval (default: the longest eval length)"),
    ("--sliding-tokens", "sliding_tokens", int, "tokens scored per sliding-window length"),
    ("--extensions", "extensions", _names,
     f"RoPE extension methods evaluated on the rope model, from {','.join(ALL_EXTENSIONS)} (or none)"),
    ("--ext-factor", "ext_factor", float, "extension factor (default: max eval length / train length)"),
    ("--finetune-steps", "finetune_steps", int, "also fine-tune the rope model per method for this many steps"),
    ("--finetune-len", "finetune_len", int, "fine-tuning length (default: max eval length)"),
    ("--copy-examples", "copy_examples", int, "copy-task test sequences per length"),
    ("--passkey-depths", "passkey_depths", _floats, "comma-separated key depths in [0, 1]"),
    ("--passkey-trials", "passkey_trials", int, "passkey episodes per length x depth cell"),
    ("--device", "device", str, "auto (CUDA when present), cpu, cuda, cuda:N"),
    ("--threads", "threads", int, "torch CPU threads (0: auto, the idle cores up to torch's default)"),
    ("--data", "data", str, "a text file or folder to use instead of the CPython stdlib corpus"),
    ("--out", "out", str, "output folder (default: runs/<preset>)"),
    ("--ckpt-every", "ckpt_every", int, "checkpoint every N steps (0: only at the end)"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="named settings (default: default); flags override them")
    for flag, dest, typ, text in FLAGS:
        parser.add_argument(flag, dest=dest, type=typ, default=None, help=text)
    parser.add_argument("--resume", action="store_true", help="continue from checkpoints in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    from posenc.lab import distributed

    distributed.add_arguments(parser)  # --nproc N


def config_from_args(args: argparse.Namespace):
    from posenc.lab.presets import get_preset

    return get_preset(args.preset, **{dest: getattr(args, dest) for _, dest, _, _ in FLAGS})


def run(args: argparse.Namespace) -> int:
    from posenc.lab import distributed
    from posenc.lab.run import run_lab

    status = distributed.relaunch(args)  # --nproc N: run this same command under torchrun instead
    if status is not None:
        return status
    cfg = config_from_args(args)
    with distributed.session(cfg.device):  # under torchrun: join the process group; errors name the rank
        run_lab(cfg, resume=args.resume, progress=not args.quiet)
    return 0
