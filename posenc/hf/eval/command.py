"""``posenc eval MODEL``: the flags, the settings they make, and the run (with ``--out``: each finished method
saved at once, the report and plots at the end; ``--resume`` continues an interrupted eval)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import torch

from posenc._internal.flags import add_shared
from posenc._internal.outputs import check_output
from posenc.hf.eval.loop import evaluate_model
from posenc.hf.eval.resume import read_interrupted
from posenc.hf.eval.report import OUTPUT_FILES, check_out_folder, report_tables, write_outputs, write_results
from posenc.hf.eval.settings import EvalSettings, check_threads

HELP = "Evaluate a local transformers causal LM: perplexity vs length, passkey, extension methods via its config."


def add_arguments(parser) -> None:
    from posenc._internal.settings import add_setting_flags
    from posenc.lab.tasks.registry import TASK_SETTINGS

    parser.add_argument("model", help="a local transformers causal LM folder (config.json, weights, tokenizer) or "
                                      "a .gguf file (loaded by transformers; posenc convert makes a folder of it)")
    for f in settings_fields():     # one flag per EvalSettings field, as the field declares it
        _add_setting(parser, f)
    # the settings registered tasks declare (--passkey-depths, --passkey-trials, ...): one flag each, as in posenc lab
    add_setting_flags(parser, TASK_SETTINGS)
    add_shared(parser, "task_options", default=None,
               help="settings declared by tasks, key=value,key=value (a plug-in's own too)")
    add_shared(parser, "plugin", help="import a Python file or module that registers tasks (repeatable), as posenc "
                                      "lab does")
    add_shared(parser, "threads", default=None, help="CPU threads for torch (default or 0: torch's own)")
    add_shared(parser, "out", default=None, help="folder for results.json, report.md and the plots")
    add_shared(parser, "resume", help="continue an interrupted eval in --out (same arguments): finished methods are "
                                      "kept")
    add_shared(parser, "overwrite", help="replace results.json / report.md already in --out")
    add_shared(parser, "no_progress", help="no progress bars (transformers' too)")


def settings_fields():
    """The EvalSettings fields a flag sets (every one but the tasks' declared settings, ``options``)."""
    return [f for f in fields(EvalSettings) if f.name != "options"]


def _add_setting(parser, f) -> None:
    """The flag of EvalSettings field ``f`` (posenc.hf.eval.settings.flag), with the field's default."""
    meta = f.metadata
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    if meta["shared"]:
        add_shared(parser, meta["shared"], dest=f.name, default=default, help=meta["help"])
        return
    flag = meta["flag"] or "--" + f.name.replace("_", "-")
    if isinstance(default, bool):
        parser.add_argument(flag, dest=f.name, action="store_true", help=meta["help"])
        return
    choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
    parser.add_argument(flag, dest=f.name, type=meta["type"], default=default, choices=choices,
                        metavar=meta["metavar"], help=meta["help"])


# EvalSettings' names are its flags' dests: messages citing them show the flags (posenc.cli)
FLAG_ALIASES: dict[str, str] = {}


def run(args) -> int:
    threads = check_threads(args.threads)
    from posenc.lab.tasks.registry import TASK_SETTINGS
    from posenc._internal.plugins import load_plugins

    load_plugins(args.plugin)           # before the settings are checked: a plug-in's task is an ordinary name
    options = dict(args.task_options or {})
    options.update({name: getattr(args, name) for name in TASK_SETTINGS if getattr(args, name, None) is not None})
    settings = EvalSettings(**{f.name: getattr(args, f.name) for f in settings_fields()}, options=options).validate()
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
