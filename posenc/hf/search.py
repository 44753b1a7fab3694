"""LongRoPE's search (Ding et al. 2024, arXiv:2402.13753) on a local transformers model folder.

    python -m posenc.hf.search MODEL_DIR --target-length 8192 --data my_text/ --device cuda --dtype bfloat16
    >>> posenc.search_model("exported/rope", 512, settings=LongRopeSettings(population=16, generations=6))

The command is ``search_main(argv)``, with ``HELP`` / ``add_arguments`` / ``run`` in posenc.cli's COMMANDS shape.

The search engine is posenc.search (``longrope_search`` over ``perplexity_fitness``); this module supplies the
model: every candidate (per-pair long factors) is written into a copy of the model's config by
``posenc.tools.extend.extend_config`` (method ``longrope``: the same writer as ``posenc extend``) and the model's
rotary module is rebuilt from that config, so transformers' own ``longrope`` code computes the frequencies and the
attention scaling that are scored. The fitness is the perplexity at the target length on ``windows`` windows of
the lab corpus's training split (``data`` as in the lab: the CPython stdlib by default); the ``heldout_top`` best
are re-scored on the next ``heldout_windows`` windows and the best there wins. ``posenc eval`` scores the
validation split, which the search never sees.

Output (never over the input config.json): ``MODEL_DIR/config.longrope-TARGET.json`` (or ``out_config``), a complete
config that transformers loads (``AutoConfig.from_pretrained(path)``; ``posenc eval MODEL_DIR --config PATH``),
and beside it the search's checkpoint/record ``longrope-search-TARGET.json`` (resumable; a finished one returns its
result without evaluating anything). transformers' longrope has no n_hat (leading positions left unscaled), so
n_hat is not searched.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc._internal.errors import ConfigError, DataError

HELP = "LongRoPE's evolutionary search of RoPE rescale factors on a local transformers model; writes a new config."


@dataclass
class ModelSearchResult:
    """What ``search_model`` found and wrote."""

    config_path: str                 # the searched config (a new file)
    checkpoint: str                  # the search's checkpoint / record (JSON)
    original_context: int
    target_length: int
    rope_parameters: dict            # the longrope entry written into the config
    result: object                   # posenc.search.longrope.LongRopeResult
    tokens: dict                     # {"search": n, "heldout": n, "byte_tokens": bool, "data": provenance}


def read_search_config(model_dir: Path, replace: bool):
    """The model's config for a LongRoPE search -> (config, its dict, the RoPE config, the original context);
    ConfigError when the model is not RoPE (``replace``: read a scaled config from its original parameters). With
    RoPE per layer type (Gemma 3) the RoPE config is the global (full-attention) layers': the search's factors go
    into that entry only (``posenc.rope.layers``' rule, as ``posenc extend`` writes it)."""
    from posenc.hf.loading import read_config
    from posenc.rope.contexts import trained_length
    from posenc.rope.layers import global_rope_config
    from posenc.rope.describe import detect_scheme

    config = read_config(model_dir)
    data = config.to_dict()
    scheme, why = detect_scheme(data)
    if scheme != "rope":
        raise ConfigError(f"model {model_dir}: LongRoPE rescales RoPE frequencies; this model is {scheme} ({why})")
    try:      # RoPE per layer type (Gemma 3): the search rescales the global layers' RoPE, as extend writes it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = global_rope_config(data)
    except ConfigError as exc:
        raise ConfigError(f"model {model_dir}: {exc}") from None
    if rc.rope_type != "default" and not replace:
        raise ConfigError(f"model {model_dir}: its config already uses rope_type {rc.rope_type!r}; pass replace=True "
                          "(--replace) to search factors for its original context instead")
    return config, data, rc, trained_length(rc)


def _candidate_config(config, data: dict, target: int, long_factor, n_pairs: int, replace: bool):
    """The model's config with these long factors (short factors 1), as ``posenc extend`` writes it."""
    from posenc.hf.scaling import transformers_major
    from posenc.tools.extend import extend_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = extend_config(data, target, "longrope", transformers_version=5 if transformers_major() >= 5 else 4,
                            short_factor=[1.0] * n_pairs, long_factor=[float(x) for x in long_factor],
                            replace=replace)
    return res, type(config).from_dict(res.config)


def _token_splits(tokenizer, data: str | None, target: int, windows: int, heldout_windows: int):
    from posenc.hf.eval.adapter import token_stream
    from posenc.hf.lab_bridge import training_bytes

    raw, meta = training_bytes(data)
    n_search, n_heldout = windows * target + 1, heldout_windows * target + 1
    stream, byte_level = token_stream(tokenizer, raw, n_search + n_heldout)
    if len(stream) < n_search + n_heldout:
        raise DataError(f"data: the training split holds {len(stream)} tokens; the search needs (windows + "
                        f"heldout_windows) x target_length + 2 = {n_search + n_heldout}")
    return stream[:n_search], stream[n_search:n_search + n_heldout], byte_level, meta


def _output_paths(folder: Path, target_length: int, data, out_config, checkpoint, overwrite: bool):
    """-> (the config file to write, the search record), checked before anything is loaded: never a model's file
    or an input, not a folder, an existing config only with ``overwrite``, two distinct files in writable folders."""
    from posenc._internal.atomic import check_writable_folder
    from posenc._internal.outputs import check_output
    from posenc.search.longrope import is_search_checkpoint

    from posenc.gguf import is_gguf

    # a .gguf model's config goes beside the file (it loads with from_pretrained(folder, gguf_file=..., config=...))
    home = folder.parent if is_gguf(folder) else folder
    stem = f"{folder.stem}." if is_gguf(folder) else ""
    out = Path(out_config) if out_config is not None else home / f"{stem}config.longrope-{target_length}.json"
    inputs = [("model", folder), ("--data", data)]
    check_output(out, f"out_config {out} (--out)", inputs=inputs)   # never a model's file, even --overwrite
    if out.is_dir():
        raise ConfigError(f"out_config {out} (--out): is a folder; expected the path of the config file to "
                          f"write, e.g. {out / f'config.longrope-{target_length}.json'}")
    if out.exists() and not overwrite:
        raise ConfigError(f"out_config {out}: exists; pass overwrite=True (--overwrite) to replace it")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"out_config {out}: folder {out.parent} does not exist")
    check_writable_folder(out.parent, f"out_config {out} (--out)")
    ckpt = Path(checkpoint) if checkpoint is not None else out.parent / f"longrope-search-{target_length}.json"
    if ckpt.is_dir():
        raise ConfigError(f"checkpoint {ckpt} (--checkpoint): is a folder; expected the path of the search's JSON "
                          "record")
    if os.path.realpath(ckpt) == os.path.realpath(out):
        raise ConfigError(f"checkpoint {ckpt} (--checkpoint): is also out_config (--out); the search record "
                          "and the config it writes need two files")
    if ckpt.exists() and Path(os.path.realpath(ckpt)).parent == Path(os.path.realpath(folder)) \
            and not is_search_checkpoint(ckpt):
        raise ConfigError(f"checkpoint {ckpt} (--checkpoint): is a file of the model folder ({ckpt.name}), not a "
                          "LongRoPE search record; choose another path")
    check_output(ckpt, f"checkpoint {ckpt} (--checkpoint)", inputs=inputs)
    check_writable_folder(ckpt.parent, f"checkpoint {ckpt} (--checkpoint)")
    return out, ckpt


def search_model(model_dir: str | os.PathLike, target_length: int, *, settings=None, data: str | None = None,
                 windows: int = 4, heldout_windows: int = 4, batch_size: int = 1, device: str = "cpu",
                 dtype: str = "float32", attn_implementation: str | None = None,
                 out_config: str | os.PathLike | None = None, checkpoint: str | os.PathLike | None = None,
                 resume: bool = True, overwrite: bool = False, replace: bool = False,
                 progress: bool = True, on_evaluation=None) -> ModelSearchResult:
    """Search LongRoPE long factors for extending the transformers model in ``model_dir`` to ``target_length``
    tokens and write them as a new config beside it; see the module docstring. settings: ``posenc.search.longrope.
    LongRopeSettings`` (default: the paper's population 64, 40 generations; n_hat_choices must be (0,)). windows /
    heldout_windows: windows of target_length tokens in the search and held-out fitness. batch_size: windows per
    forward. out_config: where the config goes (default MODEL_DIR/config.longrope-TARGET.json; never
    MODEL_DIR/config.json); overwrite: replace an existing out_config. checkpoint: the search state (default:
    longrope-search-TARGET.json beside out_config); resume=False restarts it. replace: search a model whose config
    already has a rope scaling (from its original context). on_evaluation: called after each new score ("fitness"
    or "heldout"; ``longrope_search``'s).
    """
    from posenc._internal.atomic import atomic_write_json
    from posenc._internal.devices import check_device
    from posenc._internal.validate import check_choice, check_int, positive_int
    from posenc.hf.loading import (DTYPES, check_attn_implementation, check_model_files, load_causal_lm,
                                   load_tokenizer, model_files)
    from posenc.hf.families import find_rotary
    from posenc._internal.fingerprint import file_fingerprint, tensor_fingerprint
    from posenc.search.fitness import perplexity_fitness
    from posenc.search.longrope import LongRopeSettings, longrope_search

    folder = Path(model_dir)
    settings = settings or LongRopeSettings()
    if tuple(settings.n_hat_choices) != (0,):
        raise ConfigError(f"n_hat_choices: transformers' longrope has no n_hat (leading positions left unscaled); "
                          f"expected (0,), got {settings.n_hat_choices}")
    config, data_dict, rc, original = read_search_config(folder, replace)
    check_model_files(folder, config)  # weights and tokenizer are there too
    check_int(target_length, "target_length", min=original + 1, error=ConfigError)
    for name, value in (("windows", windows), ("heldout_windows", heldout_windows), ("batch_size", batch_size)):
        positive_int(value, name, error=ConfigError)
    check_choice(dtype, "dtype", DTYPES, error=ConfigError)
    check_device(device)
    check_attn_implementation(attn_implementation)
    out, ckpt = _output_paths(folder, target_length, data, out_config, checkpoint, overwrite)
    _candidate_config(config, data_dict, target_length, [1.0] * (rc.rotary_dim // 2), rc.rotary_dim // 2,
                      replace)  # refuses early what extend refuses

    tokenizer = load_tokenizer(str(folder))
    search_tokens, heldout_tokens, byte_level, data_meta = _token_splits(tokenizer, data, target_length, windows,
                                                                         heldout_windows)
    model, _, _ = load_causal_lm(str(folder), device=device, dtype=dtype, attn_implementation=attn_implementation,
                                 progress=progress)
    parent, attr, original_rotary = find_rotary(model, "search")
    rotary_device, n_pairs = next(iter(original_rotary.buffers())).device, rc.rotary_dim // 2

    def set_factors(rescale: torch.Tensor, n_hat: int) -> None:
        _, cand = _candidate_config(config, data_dict, target_length, rescale.tolist(), n_pairs, replace)
        setattr(parent, attr, type(original_rotary)(config=cand).to(rotary_device))

    def forward(tokens):
        return model(input_ids=tokens, use_cache=False)

    # what the fitness scores: a checkpoint of another model, text, tokenizer or window count is refused
    problem = {"model": str(folder.resolve()), "files": [file_fingerprint(p) for p in model_files(folder)],
               "search_tokens": tensor_fingerprint(search_tokens), "heldout_tokens": tensor_fingerprint(heldout_tokens),
               "dtype": dtype, "batch_size": batch_size, "attn_implementation": attn_implementation,
               "replace": replace}
    dev = model.get_input_embeddings().weight.device
    fitness, heldout = (perplexity_fitness(forward, tokens, target_length, set_factors, batch_size=batch_size,
                                           device=dev) for tokens in (search_tokens, heldout_tokens))
    try:
        result = longrope_search(fitness, heldout=heldout, rotary_dim=rc.rotary_dim, theta=rc.theta,
                                 original_length=original, target_length=target_length, settings=settings,
                                 checkpoint=ckpt, resume=resume, progress=progress, problem=problem,
                                 on_evaluation=on_evaluation)
    finally:
        setattr(parent, attr, original_rotary)
    written, _ = _candidate_config(config, data_dict, target_length, result.factors, n_pairs, replace)
    atomic_write_json(out, written.config)
    params = written.config.get("rope_parameters") or written.config.get("rope_scaling") or {}
    return ModelSearchResult(config_path=str(out), checkpoint=str(ckpt), original_context=original,
                             target_length=target_length, rope_parameters=dict(params), result=result,
                             tokens={"search": len(search_tokens), "heldout": len(heldout_tokens),
                                     "byte_tokens": byte_level, "data": data_meta})


def format_result(res: ModelSearchResult) -> str:
    r = res.result
    lines = [f"LongRoPE search: {res.original_context} -> {res.target_length} tokens (factor {r.factor:g}), "
             f"{r.evaluations} candidates + {r.heldout_evaluations} held-out scores, {r.wall_s:.1f} s",
             f"perplexity at {res.target_length} (search windows / held-out windows):",
             "| candidate | search | held-out |", "|---|---|---|"]

    def cell(x):
        return "-" if x is None else f"{x:.4f}"

    for name, e in r.seeds.items():
        lines.append(f"| seed {name} | {cell(e['fitness'])} | {cell(e['heldout'])} |")
    lines.append(f"| searched | {cell(r.fitness)} | {cell(r.heldout)} |")
    lines.append(f"long_factor: [{', '.join(f'{x:g}' for x in r.factors)}]")
    lines.append(f"wrote {res.config_path} (search record: {res.checkpoint})")
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    from posenc._internal.flags import add_shared
    from posenc.search.longrope import LongRopeSettings

    d = LongRopeSettings()
    parser.add_argument("model", help="a local transformers causal LM folder with RoPE (config.json, weights, "
                                      "tokenizer)")
    add_shared(parser, "target_length", required=True)
    add_shared(parser, "data", default=None, help="text file or folder (default: the CPython stdlib, as the lab); its "
                                                  "training split is searched on")
    parser.add_argument("--windows", type=int, default=4, help="windows of target length in the search fitness")
    parser.add_argument("--heldout-windows", type=int, default=4, help="windows in the held-out choice")
    add_shared(parser, "population", default=d.population,
               help=f"candidates per generation (default {d.population}, the paper's)")
    parser.add_argument("--parents", type=int, default=None,
                        help=f"the best kept each generation (default: half of --population, the paper's "
                             f"{d.parents} of {d.population})")
    add_shared(parser, "generations", default=d.generations,
               help=f"generations after the initial population (default {d.generations}, the paper's)")
    parser.add_argument("--heldout-top", type=int, default=d.heldout_top, help="best candidates re-scored held out")
    add_shared(parser, "seed", default=0, help="the search's random seed (default 0)")
    parser.add_argument("--batch-size", type=int, default=1, help="windows per forward")
    add_shared(parser, "device", default="cpu", help="cpu, cuda, cuda:1, ...")
    add_shared(parser, "dtype", default="float32", help="float32 (default), bfloat16, float16")
    parser.add_argument("--attn-implementation", default=None, help="eager, sdpa, ... (default: the model's)")
    add_shared(parser, "out", dest="out_config", default=None,
               help="the config file to write (default: MODEL/config.longrope-TARGET.json)")
    parser.add_argument("--checkpoint", default=None, help="search state (default: beside --out)")
    parser.add_argument("--fresh", "--no-resume", dest="fresh", action="store_true",
                        help="start the search over instead of resuming the checkpoint (as posenc search on a lab run)")
    add_shared(parser, "overwrite", help="replace an existing --out file")
    parser.add_argument("--replace", action="store_true", help="search a model whose config is already scaled")
    add_shared(parser, "threads", default=None, help="CPU threads for torch (default or 0: torch's own)")
    add_shared(parser, "no_progress", help="no progress bars (transformers' too)")


def run(args) -> int:
    from posenc.hf.eval.settings import check_threads
    from posenc.search.longrope import LongRopeSettings

    threads = check_threads(args.threads)
    if threads:
        torch.set_num_threads(threads)
    # the paper keeps half the population (32 of 64): the default follows --population, never contradicts it
    parents = max(1, args.population // 2) if args.parents is None and isinstance(args.population, int) \
        else args.parents
    settings = LongRopeSettings(population=args.population, parents=parents, generations=args.generations,
                                heldout_top=args.heldout_top, seed=args.seed)
    res = search_model(args.model, args.target_length, settings=settings, data=args.data, windows=args.windows,
                       heldout_windows=args.heldout_windows, batch_size=args.batch_size, device=args.device,
                       dtype=args.dtype, attn_implementation=args.attn_implementation, out_config=args.out_config,
                       checkpoint=args.checkpoint, resume=not args.fresh, overwrite=args.overwrite,
                       replace=args.replace, progress=not args.no_progress)
    print(format_result(res))
    return 0


# the setting names this search's messages cite are its flags' own (messages show them as the flags)
FLAG_ALIASES: dict[str, str] = {}


def search_main(argv: list[str] | None = None) -> int:
    """The search as a command (exit status; errors as one line on stderr): ``posenc search`` once hooked."""
    from posenc.hf.command import run_command

    return run_command("search", add_arguments, run, argv, FLAG_ALIASES)



if __name__ == "__main__":  # python -m posenc.hf.search MODEL_DIR --target-length N
    import sys

    sys.exit(search_main())
