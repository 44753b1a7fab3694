"""``posenc eval MODEL``: the flags, the settings they make, and the run (with ``--out``: each finished method
saved at once, the report and plots at the end; ``--resume`` continues an interrupted eval)."""

from __future__ import annotations

from pathlib import Path

import torch

from posenc._internal.outputs import check_output
from posenc.hf.eval.loop import evaluate_model
from posenc.hf.eval.resume import read_interrupted
from posenc.hf.eval.report import OUTPUT_FILES, check_out_folder, report_tables, write_outputs, write_results
from posenc.hf.eval.settings import EvalSettings, check_threads
from posenc.hf.loading import DTYPES

HELP = "Evaluate a local transformers causal LM: perplexity vs length, passkey, extension methods via its config."


def _names(text: str) -> list[str]:
    """Comma-separated names, none of them empty (as the lab's list flags: '' and 'a,,b' are refused)."""
    from posenc._internal.argtypes import items

    return items(text, "names")


def add_arguments(parser) -> None:
    # the lab's list flags: an empty entry ('96,,192', '') is refused, not skipped; a bad one says what is expected
    from posenc._internal.settings import parse_options
    from posenc._internal.argtypes import ints
    from posenc.hf.lab_bridge import DATA_SPLITS

    parser.add_argument("model", help="a local transformers causal LM folder (config.json, weights, tokenizer) or "
                                      "a .gguf file (loaded by transformers; posenc convert makes a folder of it)")
    parser.add_argument("--eval-lens", type=ints, default=[128, 256, 512, 1024], help="lengths in tokens")
    parser.add_argument("--tasks", type=_names, default=["lm"],
                        help="registered tasks, comma-separated (lm, passkey, copy, a plug-in's)")
    parser.add_argument("--methods", type=_names, default=["none"],
                        help="none and/or extension methods: written into the config (linear,ntk,dynamic,yarn,...) "
                             "or applied to attention by posenc.patch (self-extend,rerope,leaky-rerope,dca,sinks)")
    parser.add_argument("--method-options", type=parse_options, default={},
                        help="attention methods' options, method.option=value,... (e.g. "
                             "self-extend.group_size=8,self-extend.window=1024,sinks.n_sink=4)")
    parser.add_argument("--factor", type=float, default=None, help="extension factor (target / original context)")
    parser.add_argument("--replace", action="store_true", help="replace a rope scaling the config already has")
    parser.add_argument("--config", default=None,
                        help="load the model with this config file instead of its config.json (posenc search output)")
    parser.add_argument("--data", default=None,
                        help="text file or folder (default: the CPython stdlib, as the lab); perplexity scores its "
                             "validation split, as the lab does: a file's last 10%% of bytes, a folder's files whose "
                             "sha256(relative path) starts below 26 (about 10%%); --data-split all scores all of it")
    parser.add_argument("--data-split", default="validation", choices=DATA_SPLITS,
                        help="what of the --data text perplexity scores: validation (default: the lab's validation "
                             "split, the text a lab model was not trained on) or all (a file's bytes in order; a "
                             "folder's training files, then its validation files)")
    parser.add_argument("--eval-tokens", type=int, default=49152,
                        help="tokens scored per length (whole windows of it); a text too short for every length "
                             "to score them, after --eval-offset, is refused")
    parser.add_argument("--eval-offset", type=int, default=0,
                        help="tokens of the text skipped before the first window (windows at a fixed offset: "
                             "--eval-offset 16384 --eval-tokens 16384 scores the second 16k window alone)")
    parser.add_argument("--sliding-stride", type=int, default=-1, help="-1: half the length; 0: off; S: stride")
    parser.add_argument("--sliding-lens", type=ints, default=[], help="lengths for the sliding protocol")
    parser.add_argument("--sliding-tokens", type=int, default=None,
                        help="tokens scored per sliding length (default: --eval-tokens), as posenc lab's flag")
    # the settings registered tasks declare (--passkey-depths, --passkey-trials, ...): one flag each, as in posenc lab
    from posenc._internal.settings import add_setting_flags
    from posenc.lab.tasks.registry import TASK_SETTINGS

    add_setting_flags(parser, TASK_SETTINGS)
    parser.add_argument("--task-options", type=parse_options, default=None, metavar="KEY=VALUE,...",
                        help="settings declared by tasks, key=value,key=value (a plug-in's own too)")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="import a Python file or module that registers tasks (repeatable), as posenc lab does")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random passkey keys (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                        help="weights and activations (default float32)")
    parser.add_argument("--device-map", default=None, choices=["auto"], help="auto: accelerate's multi-device load")
    parser.add_argument("--attn-implementation", default=None, help="eager, sdpa, flash_attention_2 (default: model's)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="tokens per forward (default: from vocab)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default or 0: torch's own)")
    parser.add_argument("--out", default=None, help="folder for results.json, report.md and the plots")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted eval in --out (same arguments): finished methods are kept")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results.json / report.md already in --out")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (transformers' too)")


# EvalSettings' names that differ from their flags' (posenc.cli shows setting names in messages as flags)
FLAG_ALIASES = {"replace_scaling": "--replace"}


def run(args) -> int:
    threads = check_threads(args.threads)
    from posenc.lab.tasks.registry import TASK_SETTINGS
    from posenc._internal.plugins import load_plugins

    load_plugins(args.plugin)           # before the settings are checked: a plug-in's task is an ordinary name
    options = dict(args.task_options or {})
    options.update({name: getattr(args, name) for name in TASK_SETTINGS if getattr(args, name, None) is not None})
    settings = EvalSettings(eval_lens=args.eval_lens, tasks=args.tasks, methods=args.methods, factor=args.factor,
                            method_options=args.method_options, replace_scaling=args.replace, config=args.config,
                            data=args.data, data_split=args.data_split,
                            eval_tokens=args.eval_tokens, eval_offset=args.eval_offset,
                            sliding_stride=args.sliding_stride, sliding_lens=args.sliding_lens,
                            sliding_tokens=args.sliding_tokens, options=options,
                            seed=args.seed, device=args.device, dtype=args.dtype, device_map=args.device_map,
                            attn_implementation=args.attn_implementation, batch_tokens=args.batch_tokens).validate()
    earlier = None
    if args.out:        # never into the model's folder, over its --config or --data, or over a model file
        check_output(args.out, f"out {args.out} (--out)", writes=OUTPUT_FILES,
                     inputs=[("model", args.model), ("--config", args.config), ("--data", args.data)])
    if args.resume:
        earlier = read_interrupted(args.out, args.overwrite)
    elif args.out:      # (evaluate_model checks the model folder first thing)
        check_out_folder(args.out, args.overwrite)
    if threads:
        torch.set_num_threads(threads)
    # with --out, each finished method's rows are saved at once (results.json, atomically): an interrupted run
    # keeps them, marked incomplete; the full results, report and plots replace them at the end
    def saved(partial: dict) -> None:     # (the folder is made with the first results: a refused run leaves none)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_results(partial, args.out)
    doc = evaluate_model(args.model, settings, progress=not args.no_progress,
                         on_method_done=saved if args.out else None, resume=earlier, out=args.out)
    print(report_tables(doc))
    if args.out:
        # (the folder was checked before the run; what it holds now is this run's own partial results)
        written = write_outputs(doc, args.out, overwrite=True)
        print(f"wrote {', '.join(p.name for p in written)} into {args.out}")
    print(f"wall {doc['meta']['wall_s']:.1f} s")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """``posenc eval`` as a function (exit status; errors as one line on stderr)."""
    from posenc.hf.command import run_command

    return run_command("eval", add_arguments, run, argv, FLAG_ALIASES)
