"""GGUF models through transformers: load one, and ``posenc convert MODEL.gguf --out DIR``.

transformers loads a GGUF file with ``from_pretrained(folder, gguf_file=name)`` (needs the gguf package, and
accelerate), dequantizing every tensor to float. The loaded model keeps a GGUF quantization config that refuses
``save_pretrained``, so ``convert_gguf`` writes its state dict into a fresh model of the same config (without the
quantization config) and saves that: config.json, model.safetensors, the tokenizer transformers builds from the
file's vocabulary, and generation_config.json. The folder's model gives the in-memory GGUF load's logits (same
weights in the same dtype; tests/hf/test_gguf.py checks it on SmolLM2).

An architecture transformers' GGUF loader does not load as a causal LM, a tensor quantization the gguf package
cannot dequantize, or metadata that sizes a model the file's tensors do not hold is refused before loading
(posenc.gguf.check_loadable, ``check_size``); a tensor missing, left over or of another shape than the metadata's
model after loading (posenc.hf.evaluate.load_causal_lm, as ``posenc eval`` refuses a folder's). trust_remote_code is
never set.

    posenc convert SmolLM2-135M-Instruct.Q4_1.gguf --out smollm2 --dtype bfloat16
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

from posenc._internal.errors import ConfigError
from posenc.hf.remote_code import NO_REMOTE_CODE

# the weight dtypes convert writes (torch's names)
DTYPE_NAMES = ("float32", "bfloat16", "float16")

HELP = "Convert a GGUF model file into a transformers folder (config.json, model.safetensors, tokenizer)."


def split(path: str | os.PathLike) -> tuple[str, str]:
    """(folder, file name) of a GGUF path: what ``from_pretrained(folder, gguf_file=name)`` takes."""
    p = Path(path).absolute()
    return str(p.parent), p.name


def checked(path: str | os.PathLike):
    """The GGUFModel of ``path`` (posenc.gguf.read_gguf) after ``check_loadable``: transformers can load it."""
    from posenc.gguf import check_loadable, read_gguf

    model = read_gguf(path)
    check_loadable(model)
    return model


def load_config(path: str | os.PathLike):
    """The transformers config its GGUF loader builds for ``path`` (refused first when it cannot load the file, or
    when that config describes a model far larger than the file's tensors: ``check_size``)."""
    from transformers import AutoConfig

    model = checked(path)
    folder, name = split(path)
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True, **NO_REMOTE_CODE)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: transformers cannot build a config from this GGUF file: "
                          f"{' '.join(str(exc).split())[:200]}") from None
    check_size(model, config)
    return config


# how many times the values the file's tensors hold the model built from its metadata may have (tied or derived
# weights), plus a few: past that the metadata does not describe the tensors, and loading would allocate the
# difference at random before the missing weights are found
SIZE_SLACK = 2
SIZE_SPARE = 2**20


def check_size(model, config) -> None:
    """ConfigError (one line, naming the file and its size keys) when the causal LM transformers builds from
    ``config`` has more than SIZE_SLACK x the values the GGUF file's tensors hold (``model``: its GGUFModel). The
    model is built on the meta device (no memory, a fraction of a second), before anything is allocated."""
    from math import prod

    import torch
    from transformers import AutoModelForCausalLM

    from posenc.gguf import SIZE_KEYS

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, **NO_REMOTE_CODE)
    except ValueError as exc:
        raise ConfigError(f"{model.path}: transformers has no causal LM for this GGUF file's model_type "
                          f"{config.model_type!r}: {' '.join(str(exc).split())[:160]}") from None
    weights = sum(p.numel() for p in skeleton.parameters())
    held = sum(prod(dims) for dims in model.tensors.values())
    if weights > SIZE_SLACK * held + SIZE_SPARE:
        keys = [f"{k}={model.metadata[k]}" for k in (f"{model.architecture}.{s}" for s in ("block_count", *SIZE_KEYS))
                if k in model.metadata]
        raise ConfigError(f"{model.path}: its metadata ({', '.join(keys[:6])}) describes a {type(skeleton).__name__} "
                          f"of {weights:,} weights, but the file's tensors hold {held:,} values; the metadata does "
                          "not describe the tensors (a damaged or mis-written file)")


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer transformers builds from the GGUF file's vocabulary."""
    from transformers import AutoTokenizer

    folder, name = split(path)
    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True, **NO_REMOTE_CODE)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: transformers cannot build its tokenizer from the GGUF file: "
                          f"{' '.join(str(exc).split())[:200]}") from None


def load_model(path: str | os.PathLike, *, dtype="float32"):
    """The causal LM of a GGUF file, dequantized to ``dtype`` (float32, bfloat16, float16), in eval mode. Refused
    before loading as ``load_config`` refuses, and after it as ``posenc eval`` refuses a folder's weights
    (posenc.hf.weights.refuse_unloaded_weights): a tensor missing, left over or of another shape than the
    metadata's model would leave parts of it at random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from posenc.hf.weights import refuse_unloaded_weights

    config = load_config(path)
    folder, name = split(path)
    model, info = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, config=config, dtype=getattr(torch, dtype), local_files_only=True,
        output_loading_info=True, ignore_mismatched_sizes=True, **NO_REMOTE_CODE)
    refuse_unloaded_weights(info, Path(path), None, type(model).__name__)
    return model.eval()


def plain_copy(model):
    """A model of the same class and config without the GGUF quantization config, holding ``model``'s weights:
    what ``save_pretrained`` accepts."""
    import torch

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    dtype = next(model.parameters()).dtype
    fresh = type(model)(config).to(dtype)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    tied = set(getattr(fresh, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ConfigError(f"the GGUF model's weights do not fit a fresh {type(model).__name__} (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]})")
    with torch.no_grad():
        if getattr(config, "tie_word_embeddings", False):
            fresh.tie_weights()
    return fresh.eval()


def check_convert_out(path: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> Path:
    """``out`` checked as convert's output before anything loads (ConfigError naming --out): not the GGUF file nor
    a folder holding it, no model file (posenc._internal.outputs), empty unless ``overwrite``, its parent a folder where
    files can be created."""
    from posenc._internal.atomic import check_writable_folder
    from posenc._internal.outputs import check_output

    out = check_output(out, f"out {out} (--out)", inputs=[("input GGUF file", path)], replaces_folder=True)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConfigError(f"out {out}: already exists and is not an empty folder; pass --overwrite to replace it")
    if not out.parent.exists():
        raise ConfigError(f"out {out}: its parent folder {out.parent} does not exist")
    check_writable_folder(out.parent, f"out {out} (--out)")   # the folder is built beside out
    return out


def convert_gguf(path: str | os.PathLike, out: str | os.PathLike, *, dtype: str = "float32",
                 overwrite: bool = False, log=print, progress: bool = True) -> list[Path]:
    """Write the GGUF model at ``path`` as a transformers folder ``out`` (weights in ``dtype``) -> the files written.
    The folder is built beside ``out`` and moved into place at the end (posenc._internal.atomic.atomic_folder), so an
    interrupted convert leaves no half folder; an existing non-empty ``out`` is replaced only with ``overwrite``,
    and never when it is the GGUF file, holds it or is a model file (``check_convert_out``)."""
    from posenc._internal.atomic import atomic_folder

    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    out = check_convert_out(path, out, overwrite)
    from posenc.hf.quiet import quiet_transformers

    t0 = time.perf_counter()
    with quiet_transformers(progress):
        model = load_model(path, dtype=dtype)
        tokenizer = load_tokenizer(path)
    fresh = plain_copy(model)
    del model
    with atomic_folder(out) as tmp:
        with quiet_transformers(progress):   # ("Writing model shards" is a bar too)
            fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    written = sorted(p for p in out.iterdir() if p.is_file())
    log(f"wrote {', '.join(p.name for p in written)} into {out} ({dtype}, {time.perf_counter() - t0:.0f} s)")
    return written


# ---- command line ------------------------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    from posenc._internal.flags import add_shared

    parser.add_argument("model", help="a .gguf model file (an architecture transformers' GGUF loader knows)")
    add_shared(parser, "out", required=True, help="the transformers folder to write")
    add_shared(parser, "dtype", default="float32", choices=DTYPE_NAMES,
               help="dtype of the written weights (default float32: the dequantized values exactly)")
    add_shared(parser, "overwrite", help="replace a non-empty --out folder")
    add_shared(parser, "no_progress")


def run(args) -> int:
    from posenc.gguf import is_gguf

    if not is_gguf(args.model):
        raise ConfigError(f"model {args.model}: expected a .gguf file")
    convert_gguf(args.model, args.out, dtype=args.dtype, overwrite=args.overwrite, progress=not args.no_progress)
    return 0
