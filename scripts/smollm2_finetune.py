"""SmolLM2-135M fine-tuned from 8k to 32k on a CPU (docs/results/smollm2-finetune/): PoSE + LoRA runs of
``posenc finetune``, then the zero-shot study's protocol on each fine-tuned model with ``posenc eval``, collected
beside the zero-shot rows of docs/results/smollm2/ on the same windows.

    python scripts/smollm2_study.py convert                      # the bf16 transformers folder (once)
    python scripts/smollm2_finetune.py train --runs yarn-pose-32k    # resumable: rerun to continue
    python scripts/smollm2_finetune.py eval --runs yarn-pose-32k --parts cpython-32k-w1,passkey-32k
    python scripts/smollm2_finetune.py baseline                  # the original, linear and YaRN x4, at 8k
    python scripts/smollm2_finetune.py collect                   # results.json, report.md, plot

A run trains into $SMOLLM2_FINETUNE_DIR/RUN (default /tmp/smollm2-finetune; the merged model is 270 MB and stays
out of the repository); its finetune.json is copied to docs/results/smollm2-finetune/RUN/. Each eval part is one
``posenc eval`` of RUN/model ("none": the config as it is, i.e. the method it was fine-tuned with) into
docs/results/smollm2-finetune/RUN/parts/PART, with the zero-shot part's flags, so the tokens, windows, passkey
prompts and seeds are the zero-shot study's (scripts/smollm2_study.py). Every run and part is resumable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "smollm2-finetune"
RUNS_DIR = Path(os.environ.get("SMOLLM2_FINETUNE_DIR", "/tmp/smollm2-finetune"))


def _study():
    """scripts/smollm2_study.py as a module: its model folder, prose text, part flags and runner are this study's."""
    spec = importlib.util.spec_from_file_location("smollm2_study", ROOT / "scripts" / "smollm2_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STUDY = _study()

# PoSE (2 chunks of 2048 covering 32k) + LoRA rank 8 on q/k/v/o with LongLoRA's trainable embeddings and norms, bf16
# autocast, AdamW 2e-4 (warmup 10, cosine), 200 steps of one 2048-token window: about an hour on two cores here
TRAIN = ["--target-length", "32768", "--steps", "200", "--eval-every", "200", "--checkpoint-every", "25", "--bf16",
         "--train-embeddings-norms", "--seed", "0"]
RUNS = {"yarn-pose-32k": ["--method", "yarn", *TRAIN],
        "pi-pose-32k": ["--method", "linear", *TRAIN]}

# the zero-shot parts each fine-tuned model repeats: name -> the zero-shot part whose windows (and prompts) it uses
# and the eval flags ("--methods none": the fine-tuned config as it is); in the order they run when time is short
_PASSKEY = ["--tasks", "passkey", "--passkey-depths", "0.1,0.5,0.9", "--passkey-trials", "1"]
PARTS = {
    "cpython-32k-w1": ["--eval-lens", "32768", "--eval-tokens", "32768"],
    "cpython-8k": ["--eval-lens", "8192", "--eval-tokens", "16384"],
    "passkey-32k": [*_PASSKEY, "--eval-lens", "32768"],
    "passkey-32k-t2": [*_PASSKEY, "--eval-lens", "32768", "--seed", "1"],
    "cpython-16k-w1": ["--eval-lens", "16384", "--eval-tokens", "16384"],
    "prose-32k-w1": ["--eval-lens", "32768", "--eval-tokens", "32768", "--data", str(STUDY.PROSE_DIR)],
    "prose-8k": ["--eval-lens", "8192", "--eval-tokens", "16384", "--data", str(STUDY.PROSE_DIR)],
    "prose-16k-w1": ["--eval-lens", "16384", "--eval-tokens", "16384", "--data", str(STUDY.PROSE_DIR)],
    "passkey-16k": [*_PASSKEY, "--eval-lens", "16384"],
    "passkey-16k-t2": [*_PASSKEY, "--eval-lens", "16384", "--seed", "1"],
}
PARTS = {name: [*flags, "--methods", "none"] for name, flags in PARTS.items()}

# the original model with the runs' static scalings at factor 4 on the trained length's windows: what the scaling
# alone does at 8k (PI and YaRN change every length, not only past the trained one), to set beside the fine-tuned 8k
BASELINE_RUN = "original"
BASELINE_PARTS = {
    "cpython-8k-x4": ["--eval-lens", "8192", "--eval-tokens", "16384", "--methods", "linear,yarn", "--factor", "4"],
    "prose-8k-x4": ["--eval-lens", "8192", "--eval-tokens", "16384", "--methods", "linear,yarn", "--factor", "4",
                    "--data", str(STUDY.PROSE_DIR)],
}


def name_list(choices: dict, what: str):
    """argparse type: comma-separated names of ``choices``, each once."""
    def parse(text: str) -> list[str]:
        names = text.split(",")
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(repr(n) for n in unknown)}; the {what}s are "
                                             f"{', '.join(choices)}")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a {what} is given more than once")
        return names
    return parse


def train(args) -> int:
    """Each run's ``posenc finetune`` (continued with --resume when its checkpoint exists; skipped when finished),
    then its finetune.json copied into the results folder."""
    for run in args.runs:
        out = RUNS_DIR / run
        if not (out / "finetune.json").is_file():
            resume = ["--resume"] if (out / "checkpoint").is_dir() else []
            code = STUDY.posenc("finetune", str(STUDY.MODEL_DIR), *RUNS[run], "--threads", str(args.threads),
                                "--out", str(out), *resume, threads=args.threads)
            if code:
                return code
        (OUT / run).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "finetune.json", OUT / run / "finetune.json")
    return 0


def read_part(run: str, part: str) -> dict | None:
    """A part's results.json (None before it has run), checked as the zero-shot study checks its parts."""
    saved = STUDY.OUT
    STUDY.OUT = OUT / run
    try:
        return STUDY.read_part(part)
    finally:
        STUDY.OUT = saved


def run_part(run: str, part: str, model, flags: list[str], threads: int) -> int:
    """``posenc eval MODEL FLAGS`` into OUT/RUN/parts/PART (bf16, as the zero-shot study): skipped when finished,
    continued with --resume when a partial results.json exists. Returns the command's exit code."""
    doc = read_part(run, part)
    if doc is not None and not doc["meta"].get("incomplete"):
        print(f"{run} {part}: finished, skipped")
        return 0
    resume = ["--resume"] if doc is not None else []
    return STUDY.posenc("eval", str(model), *flags, *STUDY.COMMON, "--threads", str(threads),
                        "--out", str(OUT / run / "parts" / part), *resume, threads=threads)


def evaluate(args) -> int:
    """Each part of each run: ``posenc eval RUN/model``, resumable."""
    for run in args.runs:
        model = RUNS_DIR / run / "model"
        if not (model / "config.json").is_file():
            from posenc._internal.errors import DataError
            raise DataError(f"run {run}: no fine-tuned model in {model}; run `python scripts/smollm2_finetune.py "
                            f"train --runs {run}` first")
        for part in args.parts:
            code = run_part(run, part, model, PARTS[part], args.threads)
            if code:
                return code
    return 0


def baseline(args) -> int:
    """Each baseline part: ``posenc eval`` of the original bf16 model with linear and YaRN at factor 4, resumable."""
    for part in args.parts:
        code = run_part(BASELINE_RUN, part, STUDY.MODEL_DIR, BASELINE_PARTS[part], args.threads)
        if code:
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    """Bad input (an unknown run or part, a damaged part file) ends in one line and exit 2, before anything runs."""
    from posenc._internal.errors import PosencError
    from posenc._internal.faults import EXIT_USER, Parser, describe_os_error

    parser = Parser(prog="smollm2_finetune.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("train", help="fine-tune (resumable)")
    p.add_argument("--runs", type=name_list(RUNS, "run"), default=list(RUNS))
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=train)
    p = sub.add_parser("eval", help="the zero-shot protocol on the fine-tuned models (resumable)")
    p.add_argument("--runs", type=name_list(RUNS, "run"), default=list(RUNS))
    p.add_argument("--parts", type=name_list(PARTS, "part"), default=list(PARTS))
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=evaluate)
    p = sub.add_parser("baseline", help="the original model with linear and YaRN at factor 4 on the 8k windows "
                                        "(resumable)")
    p.add_argument("--parts", type=name_list(BASELINE_PARTS, "part"), default=list(BASELINE_PARTS))
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=baseline)
    p = sub.add_parser("collect", help="results.json, report.md and the plot from the finished parts")
    p.set_defaults(func=collect)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (PosencError, OSError) as exc:      # (OSError: a missing model folder, a read-only checkout)
        text = describe_os_error(exc) if isinstance(exc, OSError) else exc
        print(f"{parser.prog} {args.command}: error: {text}", file=sys.stderr)
        return EXIT_USER


def collect(_args) -> int:
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    from smollm2_finetune_report import collect as run_collect

    return run_collect(SimpleNamespace(**globals()))     # this module's settings, as they are now


if __name__ == "__main__":
    raise SystemExit(main())
