"""``posenc search SOURCE --target-length N ...``: LongRoPE's factor search on a saved lab model or on a local
transformers model folder.

    posenc search runs/extend --target-length 1024 --out runs/extend/longrope            # lm-rope, lowest seed
    posenc search runs/extend/checkpoints/lm-rope-seed1.safetensors --target-length 1024 --out lr1 --paper
    posenc extend CONFIG.json --method longrope --longrope lr1/rope_scaling.json --target-length 1024 --out new.json
    posenc search exported/rope --target-length 512 --population 16 --parents 8 --generations 6     # a model folder

A folder holding a config.json (and no checkpoints/) is a transformers model: the search is
``posenc.hf.search`` (its options: ``posenc search MODEL_DIR --help``; docs/hf.md). Otherwise SOURCE is a
``posenc lab`` run folder (its ``checkpoints/TASK-SCHEME-seedN``) or one lab checkpoint file, and the search is
the lab's ``longrope-search`` method (posenc/extensions/longrope_search.py): candidates scored by perplexity at the
target length on a search split of the validation text, the winner chosen on a disjoint held-out split, both after
the first ``--reserved`` tokens (the text the lab reports on). DIR receives:

    rope_scaling.json            the Hugging Face longrope dict (short_factor, long_factor, factor, original length)
    long_factor.json, short_factor.json   the factor lists (for ``posenc extend --long-factor/--short-factor``)
    search.json                  the search state: rerunning the same command resumes it (--fresh starts over)
    config.json                  with --config: that config extended with the searched factors (``posenc extend``)
"""

from __future__ import annotations

from pathlib import Path

HELP = ("LongRoPE's evolutionary factor search on a lab model or a transformers model folder; writes a Hugging "
        "Face longrope config")


def add_arguments(parser) -> None:
    """The command's own arguments: SOURCE, then the options of the search that fits it (``run`` parses them)."""
    import argparse

    parser.add_argument("source", help="a posenc lab run folder or one of its checkpoints (.safetensors), or a local "
                                       "transformers model folder (config.json, weights, tokenizer) or a .gguf model")
    parser.add_argument("options", nargs=argparse.REMAINDER,
                        help="lab model: --target-length N --out DIR [...] (posenc search RUN_DIR --help); model "
                             "folder: --target-length N [...] (posenc search MODEL_DIR --help)")


# what a lab model's search writes into --out (and config.json with --config)
WRITES = ("rope_scaling.json", "long_factor.json", "short_factor.json", "search.json")


def is_model_folder(source: Path) -> bool:
    """A transformers model folder (config.json, no lab checkpoints/) or a .gguf model, rather than a lab run."""
    from posenc.gguf import is_gguf

    if is_gguf(source):
        return True
    return source.is_dir() and (source / "config.json").is_file() and not (source / "checkpoints").is_dir()


def lab_arguments(parser) -> None:
    """Options for a lab model."""
    from posenc._internal.flags import add_shared

    parser.add_argument("source", help="a posenc lab run folder or one of its checkpoints (.safetensors)")
    add_shared(parser, "target_length", required=True, help="context length to extend to (tokens)")
    add_shared(parser, "out", required=True, help="folder to write rope_scaling.json, the factors and the state to")
    parser.add_argument("--scheme", default="rope", help="scheme of the run folder's checkpoint (default rope)")
    parser.add_argument("--task", default="lm", help="task of the run folder's checkpoint (default lm)")
    add_shared(parser, "seed", default=None, help="seed of the run folder's checkpoint (default lowest)")
    add_shared(parser, "population", default=None, help="candidates per generation (default 32)")
    add_shared(parser, "generations", default=None, help="generations (default 10)")
    parser.add_argument("--windows", type=int, default=None,
                        help="windows of the target length in the search and held-out splits (default 4)")
    parser.add_argument("--paper", action="store_true",
                        help="the paper's budget: population 64, 40 generations (unless given)")
    parser.add_argument("--search-seed", type=int, default=0, help="the search's random seed (default 0)")
    parser.add_argument("--reserved", type=int, default=None,
                        help="validation tokens left out of both splits (default: the run's evaluation text, "
                             "max(eval_tokens, sliding_tokens) + 1 from its results.json, else the lab's default)")
    add_shared(parser, "data", default=None, help="text file or folder instead of the stdlib corpus")
    parser.add_argument("--config", default=None,
                        help="a Hugging Face config.json (e.g. from posenc export) to extend with the searched factors")
    parser.add_argument("--transformers-version", type=int, choices=(4, 5), default=5,
                        help="with --config: 4 writes rope_scaling, 5 rope_parameters (default)")
    parser.add_argument("--fresh", action="store_true", help="start the search over instead of resuming DIR's state")
    add_shared(parser, "threads", default=1, help="torch CPU threads (default 1)")
    add_shared(parser, "no_progress", help="no progress bar")


def _reserved(source: Path, given: int | None) -> int:
    if given is not None:
        return given
    from posenc.lab.presets import LabConfig

    settings = LabConfig().to_dict()
    results = source / "results.json" if source.is_dir() else source.parent.parent / "results.json"
    if results.exists():
        from posenc._internal.json_io import loads

        doc = loads(results.read_text(encoding="utf-8"), f"run results {results}")
        meta = doc.get("meta") if isinstance(doc, dict) else None
        settings = meta.get("settings", settings) if isinstance(meta, dict) else settings
    from posenc.perplexity import evaluation_prefix

    return evaluation_prefix(settings)


def run(args) -> int:
    if not Path(args.source).exists() and args.source not in ("-h", "--help"):
        raise FileNotFoundError(f"source {args.source}: no such file or folder (expected a transformers model "
                                "folder, a posenc lab run folder or a lab checkpoint)")
    if is_model_folder(Path(args.source)):
        from posenc.hf import search as hf_search

        add, go = hf_search.add_arguments, hf_search.run
    else:
        add, go = lab_arguments, run_lab_search
    from posenc._internal.faults import Parser, errors_name_flags, flag_names

    parser = Parser(prog="posenc search", description=HELP)
    add(parser)
    try:
        inner = parser.parse_args([args.source, *args.options])
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed as one line)
        return int(exc.code or 0)
    with errors_name_flags(flag_names(parser, _FLAGS if go is run_lab_search else hf_search.FLAG_ALIASES)):
        return go(inner)


# the lab's setting names in library messages that differ from this command's flags
_FLAGS = {"search_population": "--population", "search_generations": "--generations", "search_windows": "--windows",
          "eval_tokens": "--reserved"}


def run_lab_search(args) -> int:
    import torch

    from posenc._internal.validate import check_int
    from posenc._internal.errors import ConfigError, PosencError
    from posenc.extensions import ExtensionSpec
    from posenc.extensions.longrope_search import SearchBudget, search_lab_model
    from posenc.hf.lab_bridge import find_run_checkpoint, load_lab_model, validation_bytes
    from posenc._internal.fingerprint import file_fingerprint
    from posenc._internal.outputs import check_output
    from posenc.rope.config import load_rope_config
    from posenc.tools._io import write_json_atomic

    torch.set_num_threads(check_int(args.threads, "--threads", min=1, error=ConfigError))
    # every option is checked before the model loads and the search runs (0 is a value here, not "the default")
    paper = (64, 40) if args.paper else (32, 10)
    budget = SearchBudget(
        population=paper[0] if args.population is None else check_int(args.population, "--population", min=4,
                                                                           error=ConfigError),
        generations=paper[1] if args.generations is None else check_int(args.generations, "--generations", min=0,
                                                                            error=ConfigError),
        windows=4 if args.windows is None else check_int(args.windows, "--windows", min=1, error=ConfigError))
    if args.reserved is not None:
        check_int(args.reserved, "--reserved", min=0, error=ConfigError)
    if args.config:
        try:
            load_rope_config(args.config)
        except PosencError as exc:
            raise ConfigError(f"--config {args.config}: {exc}") from None
    out = check_output(args.out, f"--out {args.out}", inputs=[
        ("source", args.source), ("--data", args.data), ("--config", args.config)],
        writes=[*WRITES, *(["config.json"] if args.config else [])])
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    source = Path(args.source)
    path = find_run_checkpoint(source, args.scheme, task=args.task, seed=args.seed) if source.is_dir() else source
    model, model_settings = load_lab_model(path)
    if not getattr(model.scheme, "extendable", False):
        raise ConfigError(f"{path}: its {model_settings.get('scheme')} scheme has no RoPE to rescale")
    original = int(model_settings["max_len"])
    target = check_int(args.target_length, "--target-length", min=original + 1, error=ConfigError)
    rc = load_rope_config(model.scheme.rope_config)
    spec = ExtensionSpec(original=original, factor=target / original, rotary_dim=rc.rotary_dim, theta=rc.theta,
                         target=target, head_dim=rc.head_dim)
    text, _ = validation_bytes(args.data)
    result, where = search_lab_model(model, text, spec, reserved=_reserved(source, args.reserved), budget=budget,
                                 seed=args.search_seed, checkpoint=out / "search.json", resume=not args.fresh,
                                 progress=not args.no_progress, problem={"model": file_fingerprint(path)})
    scaling = result.rope_scaling()
    write_json_atomic(out / "rope_scaling.json", scaling)
    write_json_atomic(out / "long_factor.json", scaling["long_factor"])
    write_json_atomic(out / "short_factor.json", scaling["short_factor"])
    lines = [f"searched {path} for {original} -> {target} (factor {spec.factor:g}): {result.evaluations} "
             f"evaluations in {result.wall_s:.1f} s (population {budget.population}, {budget.generations} "
             f"generations, {budget.windows} windows per split; splits {where['search']} / {where['heldout']})",
             f"held-out perplexity at {target}: searched {result.heldout:.3f}; seeds as longrope configs: "
             + ", ".join(f"{k} {v['heldout']:.3f}" for k, v in result.seeds.items() if v.get("heldout") is not None),
             f"wrote {out}/rope_scaling.json, long_factor.json, short_factor.json (state: {out}/search.json)"]
    if args.config:
        from posenc.tools.extend import extend_config

        ext = extend_config(args.config, target, "longrope", transformers_version=args.transformers_version,
                            short_factor=scaling["short_factor"], long_factor=scaling["long_factor"], replace=True)
        write_json_atomic(out / "config.json", ext.config)
        lines.append(f"wrote {out}/config.json ({args.config} with the searched longrope factors)")
    else:
        lines.append(f"apply to a config: posenc extend CONFIG --method longrope --longrope {out}/rope_scaling.json "
                     f"--target-length {target} --out NEW.json")
    print("\n".join(lines))
    return 0
