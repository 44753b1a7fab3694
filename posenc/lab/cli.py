"""`posenc lab`: train tiny transformers per positional scheme and measure length extrapolation.

    posenc lab                                   # the default comparison (a few minutes on a laptop CPU)
    posenc lab --preset smoke                    # CI-sized end-to-end run
    posenc lab --preset ntk --steps 3000 --seeds 0,1,2 --out runs/ntk3
    posenc lab --schemes rope,alibi --eval-lens 128,512,2048 --finetune-steps 100
    posenc lab --out runs/x --resume             # continue an interrupted run from its checkpoints
    posenc lab --plugin my_scheme.py --schemes rope,mine     # a scheme, method or task from your own file

Every preset setting can be overridden by the flag of the same name; lists are comma-separated. Errors from the
library name settings (``d_model``); this command reports them with its flags (``--d-model``).
"""

from __future__ import annotations

import argparse

from posenc._internal.settings import add_setting_flags, parse_options
from posenc._internal.argtypes import ints, items, yes_no
from posenc._internal.flags import add_shared, shared_flag
from posenc._internal.errors import ConfigError
from posenc._internal.faults import errors_name_flags

HELP = "train tiny transformers per positional scheme and measure length extrapolation"


def _pairs(text: str, kind: str, example: str, first, second) -> list[tuple]:
    """'a:b,c:d' -> [(first(a), second(b)), ...] ('none' -> []); ``kind`` (e.g. 'length:steps') and ``example``
    name the expected form in the error."""
    if text.strip().lower() == "none":
        return []
    try:
        return [(first(a.strip()), second(b)) for a, b in (item.split(":") for item in items(text, f"{kind} pairs"))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind} pairs (e.g. {example}) or none, "
                                         f"got {text!r}") from None


def _phases(text: str) -> list[list[int]]:
    """'32:300,64:300' -> [[32, 300], [64, 300]]; 'none' -> []."""
    return [list(p) for p in _pairs(text, "length:steps", "32:300,64:300", int, int)]


def _scheme_scales(text: str) -> dict[str, float]:
    """'nope:1.2,alibi:1.2' -> {'nope': 1.2, 'alibi': 1.2}; 'none' -> {}."""
    return dict(_pairs(text, "scheme:multiplier", "nope:1.2,alibi:1.2", str, float))


def _names(text: str):
    names = [x.strip() for x in text.split(",") if x.strip()]
    if names == ["all"]:
        return "all"
    return [] if names == ["none"] else names


# a flag several commands share: its type (and old spellings) from posenc._internal.flags, the help text here
SHARED = "shared"
# flag -> (setting name, type, help); the setting names are LabConfig's flat names (posenc.lab.presets.SECTIONS)
FLAGS = [
    ("--tasks", "tasks", _names, "tasks to run, comma-separated (or all); registered: {tasks}"),
    ("--schemes", "schemes", _names, "schemes to train, comma-separated (or all); registered: {schemes}"),
    ("--d-model", "d_model", int, "model width"),
    ("--layers", "n_layers", int, "number of layers"),
    ("--heads", "n_heads", int, "attention heads"),
    ("--mlp-ratio", "mlp_ratio", int, "MLP hidden width as a multiple of --d-model"),
    ("--rope-base", "rope_base", float, "RoPE theta"),
    ("--rope-layout", "rope_layout", str, "RoPE pair layout: half (HF) or interleaved"),
    ("--scale-embeddings", "scale_embeddings", yes_no, "multiply token embeddings by sqrt(d_model) (yes/no)"),
    ("--bias", "bias", yes_no, "LayerNorm and MLP biases (yes/no); no: MPT's bias-free block, which lets trained "
                              "ALiBi models export to transformers (posenc export)"),
    ("--scheme-options", "scheme_options", parse_options, "scheme-specific settings, key=value,key=value"),
    ("--train-len", "train_len", int, "training sequence length"),
    ("--batch-size", "batch_size", int, "sequences per step"),
    ("--steps", "steps", int, "training steps"),
    ("--lr", "lr", float, "peak learning rate"),
    ("--warmup", "warmup", int, "warmup steps"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--grad-clip", "grad_clip", float, "gradient-norm clip"),
    ("--bias-lr-scale", "bias_lr_scale", float,
     "learning-rate multiplier for learned attention-logit biases (T5, KERPLE, FIRE): Adam moves a weight by ~lr "
     "per step, so a bias alone needs ~logit / lr steps"),
    ("--train-until", "train_until", float,
     "stop training a model once its task's criterion at the training length reaches this (copy: exact match on "
     "held-out strings; passkey: retrieval rate); --steps is then the cap (0: off)"),
    ("--check-every", "check_every", int, "steps between two checks of --train-until"),
    ("--scheme-step-scale", "scheme_step_scale", _scheme_scales,
     "train these schemes' models for --steps x a multiplier (cap and schedule length), scheme:multiplier pairs, "
     "e.g. nope:1.2,alibi:1.2 (or none)"),
    ("--length-warmup", "length_warmup", _phases,
     "train on shorter sequences first, same tokens per step: length:steps pairs, e.g. 32:300,64:300 (or none)"),
    ("--min-lr-ratio", "min_lr_ratio", float, "the cosine schedule ends at lr x this"),
    ("--seeds", "seeds", SHARED, "comma-separated seeds; several are reported as mean +- std"),
    ("--eval-lens", "eval_lens", ints, "comma-separated evaluation lengths"),
    ("--eval-tokens", "eval_tokens", int, "tokens scored per LM evaluation length"),
    ("--sliding-stride", "sliding_stride", int, "stride of the sliding-window LM eval (-1: half the window, 0: off)"),
    ("--sliding-lens", "sliding_lens", ints, "lengths for the sliding-window eval (default: the longest eval length)"),
    ("--sliding-tokens", "sliding_tokens", int, "tokens scored per sliding-window length"),
    ("--methods", "extensions", SHARED,
     "extension methods (frequency scaling or attention) evaluated on the extended schemes' models (or none); registered: {methods}"),
    ("--method-options", "extension_options", SHARED,
     "per-method options, method.option=value,... (e.g. self-extend.group_size=4,self-extend.window=32,dca.chunk_size=96)"),
    ("--extended-schemes", "extended_schemes", _names, "schemes whose models get the extension methods (default rope)"),
    ("--randomized-positions", "randomized_positions", int,
     "train on a sorted random subset of positions 0..N-1 (Ruoss et al. 2023; 0: off); evaluation uses plain ones"),
    ("--randomized-schemes", "randomized_schemes", _names,
     "schemes trained a second time with randomized positions, besides plain ones (default: all, instead)"),
    ("--factor", "ext_factor", SHARED, "extension factor (default: max eval length / train length)"),
    ("--finetune-steps", "finetune_steps", int, "also fine-tune the extended models per method for this many steps"),
    ("--finetune-len", "finetune_len", int,
     "fine-tuning length (default: max eval length; PoSE methods fine-tune at --train-len)"),
    ("--device", "device", SHARED, "auto (CUDA when present), cpu, cuda, cuda:N"),
    ("--threads", "threads", SHARED, "torch CPU threads (0: auto, the idle cores up to torch's default; results "
     "are identical at any thread count)"),
    ("--jobs", "jobs", int, "models trained and evaluated at once, one process each (0: auto, one per idle CPU "
     "core when several models train on the CPU and --threads is auto; results are identical at any count)"),
    ("--precision", "precision", str, "fp32 (default), bf16 (autocast: faster on CPUs with AVX512-BF16/AMX and on "
     "GPUs, slightly different numbers) or auto (bf16 where native); docs/lab.md, Throughput"),
    ("--data", "data", SHARED, "a text file or folder to use instead of the CPython stdlib corpus"),
    ("--out", "out", SHARED, "output folder (default: runs/<preset>)"),
    ("--ckpt-every", "ckpt_every", int, "checkpoint every N steps (0: only at the end)"),
]
# other argument names the library may cite in a message, and the flag that sets them here
ALIASES = {"scheme": "--schemes", "n_heads": "--heads", "n_layers": "--layers", "preset": "--preset",
           "stride": "--sliding-stride", "nproc": "--nproc", "seq_len": "--train-len/--finetune-len",
           "factor": "--factor", "dist_timeout": "--dist-timeout"}


def lab_flags() -> dict[str, str]:
    """Setting name -> this command's flag, for posenc._internal.faults.to_flags ("d_model" -> "--d-model"); the settings
    tasks and methods declare (plug-ins' too, once loaded) have their generated flags."""
    from posenc.lab.presets import declared

    flags = {dest: flag for flag, dest, _, _ in FLAGS}
    flags.update({name: s.flag for name, s in declared().items()})
    flags.update({k: v for k, v in ALIASES.items() if k not in flags})
    return flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from posenc.lab.launch import add_arguments as add_launch_arguments
    from posenc.lab.presets import PRESETS

    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="named settings (default: default); flags override them")
    add_shared(parser, "plugin", help="import a Python file or module that registers schemes, extension methods or "
                                      "tasks (repeatable); its names can then be used in --schemes, --methods, --tasks")
    names = _registered()
    for flag, dest, typ, text in FLAGS:
        if typ is SHARED:
            add_shared(parser, shared_flag(flag).name, dest=dest, default=None, help=text.format(**names))
        else:
            parser.add_argument(flag, dest=dest, type=typ, default=None, help=text.format(**names))
    # the settings registered tasks and extension methods declare (posenc._internal.settings): one flag each
    from posenc.lab.presets import declared

    add_setting_flags(parser, declared())
    add_shared(parser, "task_options", default=None,
               help="settings declared by tasks or methods, key=value,key=value (a plug-in's own too, whose flags "
                    "exist only once it is loaded)")
    add_shared(parser, "resume", help="continue from checkpoints in --out")
    add_shared(parser, "no_progress")
    add_launch_arguments(parser)  # --nproc N


def _registered() -> dict:
    from posenc.extensions import all_method_names
    from posenc.lab.tasks import task_names
    from posenc.schemes import scheme_names

    return {"tasks": ",".join(task_names()), "schemes": ",".join(scheme_names()),
            "methods": ",".join(all_method_names())}


def config_from_args(args: argparse.Namespace):
    from posenc.lab.presets import declared, get_preset

    given = {dest: getattr(args, dest) for _, dest, _, _ in FLAGS}
    if given["extensions"] == ["none"]:     # the lab's word for no extension method (eval's "none" is a baseline)
        given["extensions"] = []
    given.update(getattr(args, "task_options", None) or {})       # (plug-ins are loaded by now: their names too)
    given.update({name: getattr(args, name) for name in declared() if getattr(args, name, None) is not None})
    return get_preset(args.preset, **given)


def check_processes(cfg, nproc: int) -> None:
    """What --nproc N needs of the other settings, checked before any process starts: one lab process per rank
    (no --jobs), and every training batch -- pre-training and each fine-tune -- at least one row per process, so
    that N processes train on the very batches one process trains on."""
    from posenc.lab.distributed import check_batch_size
    from posenc.lab.run import finetune_length, finetune_rows

    if nproc <= 1:
        return
    if cfg.jobs > 1:
        raise ConfigError(f"jobs: {cfg.jobs} worker processes and --nproc {nproc} do not combine; use --jobs 1 "
                          "with --nproc")
    check_batch_size(cfg.batch_size, nproc)
    if cfg.finetune_steps and any(s in cfg.schemes for s in cfg.extended_schemes):
        length = finetune_length(cfg)
        rows = finetune_rows(cfg, length)
        if rows < nproc:
            raise ConfigError(f"finetune_len: a fine-tune at {length} tokens takes batch_size x train_len // "
                              f"{length} = {rows} rows per step, fewer than the {nproc} processes (one process "
                              "would train on other batches); raise --batch-size, lower --finetune-len or --nproc")


def run(args: argparse.Namespace) -> int:
    from posenc.lab import distributed, launch
    from posenc.lab.data import load_corpus
    from posenc._internal.outputs import check_output
    from posenc.lab.run import out_dir, run_lab
    from posenc._internal.plugins import load_plugins

    with errors_name_flags(lab_flags()):
        # everything that can be checked is checked here, before --nproc N re-launches: a bad flag is one line
        load_plugins(args.plugin)
        cfg = config_from_args(args)
        timeout = distributed.timeout_seconds(args.dist_timeout)
        check_processes(cfg, int(getattr(args, "nproc", 1) or 1))
        out = out_dir(cfg)
        check_output(out, f"--out {out}", inputs=[("--data", cfg.data)], writes=("results.json", "report.md"))
        if cfg.data is not None:
            load_corpus(cfg.data)  # exists, readable, text
        status = launch.relaunch(args)  # --nproc N: run this same command under torchrun instead
        if status is not None:
            return status
        # (a SIGTERM unwinds as Ctrl-C does, posenc._internal.faults: the finished results are written first)
        with distributed.session(cfg.device, timeout_s=timeout) as (_, device):  # under torchrun: join the group
            run_lab(cfg, resume=args.resume, progress=not args.no_progress, device=device)
    return 0
