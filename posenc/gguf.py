"""GGUF files (llama.cpp's format): the model metadata in config.json form, as transformers' GGUF loader reads it.

A GGUF file stores the model's settings as ``{architecture}.{key}`` entries (``llama.context_length``,
``llama.rope.freq_base``, ``llama.rope.dimension_count``...). ``read_gguf(path)`` reads them through
posenc.gguf_layout (metadata only: the weights stay on disk; every count and length in the file is checked against
the bytes left before it is read) and returns a ``GGUFModel`` whose ``config`` is the mapping
transformers builds for that file (``AutoConfig.from_pretrained(folder, gguf_file=name)``): the same key names,
the same per-architecture choices (``rope.dimension_count`` is the head size for llama / mistral and ignored by the
other families; Gemma's head size is ``attention.key_length``), the same model_type renames (``gemma3`` ->
``gemma3_text``, a llama named "mistral" -> ``mistral``). Where the file says more than transformers reads (llama.cpp's
``rope.scaling.*`` keys, a rotary dimension transformers does not take), ``GGUFModel.notes`` says so: the model
transformers loads runs without it, and posenc's tools describe that model.

    >>> model = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> model.config["rope_theta"], model.config["max_position_embeddings"]
    (100000.0, 8192)

Everything posenc reads a config from (``posenc.rope.config.read_config_file``: inspect, pick, extend, plot) takes a
``.gguf`` path through ``gguf_config``. Loading the weights (``posenc eval``, ``posenc convert``) is transformers'
(posenc.hf.gguf); ``check_loadable`` refuses before that an architecture or a quantization it cannot load, and
metadata whose model dimensions the tensors do not hold (``check_dimensions``). Bad-input messages about a setting
read from a GGUF file name its metadata key, not config.json's (``errors_name_metadata``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc._internal.errors import ConfigError

SUFFIX = ".gguf"

# GGUF key (after "{architecture}.") -> config.json name, for every architecture (llama.cpp's generic key names,
# which transformers' GGUF_CONFIG_MAPPING maps alike for the decoder families)
_COMMON = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
# the keys only some families read (transformers 5.x, integrations/ggml.py): the rotary dimension is the head size
# of llama and mistral only; Gemma gives the head size as key_length and its local window as sliding_window
_FAMILY = {
    "llama": {"rope.dimension_count": "head_dim"},
    "mistral": {"rope.dimension_count": "head_dim"},
    "gemma2": {"attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gemma3": {"attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gemma4": {"attention.key_length": "global_head_dim", "attention.sliding_window": "sliding_window",
               "rope.freq_base": None},
    "gpt2": {"context_length": "n_positions", "embedding_length": "n_embd", "block_count": "n_layer",
             "attention.head_count": "n_head", "rope.freq_base": None},
    "starcoder2": {"rope.freq_base": "rope_theta"},
}
# llama.cpp architecture name -> transformers model_type, where they differ
_MODEL_TYPE = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2",
               "gemma3": "gemma3_text", "gemma4": "gemma4_text"}
# the tokenizer's vocabulary arrays: large, and no part of the model's settings
_SKIPPED_PREFIX = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.added_tokens")


@dataclass
class GGUFModel:
    """What a GGUF file says about its model.

    architecture: llama.cpp's name (``general.architecture``); model_type: transformers' for it; metadata: every
    entry except the tokenizer's vocabulary arrays ({key: value}); rope_keys: the entries posenc read for RoPE and
    context ({gguf key: value}); config: config.json form, as transformers' GGUF loader builds it; scaling: the
    ``rope.scaling.*`` entries the file declares ({suffix: value}, empty when none); tensor_types: the quantization
    types of its tensors ({type name: count}); tensors: each tensor's dimensions in GGUF order ({name: dims},
    dims[0] the row length); notes: what the file says that transformers does not read.
    """

    path: str
    architecture: str
    model_type: str
    metadata: dict[str, Any]
    rope_keys: dict[str, Any]
    config: dict[str, Any]
    scaling: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_gguf(path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; a folder never is)."""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(SUFFIX) and not Path(path).is_dir()


def _layout(path: str | os.PathLike):
    """The file's layout (posenc.gguf_layout.read_layout: every size checked against the file before it is read),
    the tokenizer's vocabulary arrays checked but not kept."""
    try:
        import gguf  # noqa: F401  (its quantization tables size the tensors)
    except ImportError:
        raise ConfigError(f"{os.fspath(path)}: reading a GGUF file needs the gguf package (pip install gguf, or "
                          "posenc[hf])") from None
    from posenc.gguf_layout import read_layout

    return read_layout(path, keep=lambda key: not key.startswith(_SKIPPED_PREFIX))


def read_metadata(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, int]]:
    """(every metadata entry of a GGUF file except the tokenizer's vocabulary arrays, {tensor type: count})."""
    return _metadata(_layout(path))


def _metadata(layout) -> tuple[dict[str, Any], dict[str, int]]:
    meta = dict(layout.fields)
    types: dict[str, int] = {}
    for t in layout.tensors:
        types[t.type_name] = types.get(t.type_name, 0) + 1
    if "tokenizer.ggml.tokens" in layout.lengths:
        meta["tokenizer.ggml.tokens (count)"] = layout.lengths["tokenizer.ggml.tokens"]
    meta["tensors (count)"] = len(layout.tensors)
    meta["output.weight present"] = any(t.name == "output.weight" for t in layout.tensors)
    return meta, types


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Read a GGUF file's model settings (no weights) -> GGUFModel; ConfigError for a file that is not GGUF or
    names no architecture, and for any size in it that does not fit the file (posenc.gguf_layout). The answer is
    kept per (path, size, modification time); the caller gets its own copy."""
    import copy

    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        _layout(p)                        # the one-line error for a missing file
        raise
    model = copy.deepcopy(_read_gguf(os.path.abspath(p), stat.st_size, stat.st_mtime_ns))
    model.path = os.fspath(path)
    return model


@functools.lru_cache(maxsize=8)
def _read_gguf(path: str, size: int, mtime_ns: int) -> GGUFModel:
    layout = _layout(path)
    meta, types = _metadata(layout)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ConfigError(f"{os.fspath(path)}: the GGUF file has no general.architecture entry")
    name = str(meta.get("general.name") or "")
    family = "mistral" if "llama" in arch and "mistral" in name else arch
    model_type = _MODEL_TYPE.get(family, family)
    mapping = {**_COMMON, **_FAMILY.get(family, {})}
    config: dict[str, Any] = {"model_type": model_type}
    rope_keys: dict[str, Any] = {}
    for suffix, target in mapping.items():
        key = f"{arch}.{suffix}"
        if key in meta:
            rope_keys[key] = meta[key]
            if target is not None:
                config[target] = meta[key]
    # tied embeddings: no separate output matrix in the file (transformers reads it the same way)
    config["tie_word_embeddings"] = not meta["output.weight present"]
    if "vocab_size" not in config and "tokenizer.ggml.tokens (count)" in meta:
        config["vocab_size"] = meta["tokenizer.ggml.tokens (count)"]
    scaling = {k[len(f"{arch}.rope.scaling."):]: v for k, v in meta.items() if k.startswith(f"{arch}.rope.scaling.")}
    notes = []
    for suffix in ("rope.dimension_count", "attention.key_length", "attention.sliding_window"):
        key = f"{arch}.{suffix}"
        if key in meta:
            rope_keys.setdefault(key, meta[key])
    dims = meta.get(f"{arch}.rope.dimension_count")
    if dims is not None and mapping.get("rope.dimension_count") is None:
        heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
        head_dim = meta.get(f"{arch}.attention.key_length") or (hidden // heads if heads and hidden else None)
        if head_dim is not None and dims != head_dim:
            notes.append(f"{arch}.rope.dimension_count is {dims} (the rotary dimension llama.cpp uses) but "
                         f"transformers' GGUF loader does not read it for {model_type}: the loaded model rotates "
                         f"what its config class says (head size {head_dim})")
    if scaling:
        kind = scaling.get("type")
        if model_type == "gpt_oss" and kind is not None:
            # transformers rebuilds this one family's scaling from the file (modeling_gguf_pytorch_utils)
            rebuilt = {"rope_type": kind}
            for k, v in scaling.items():
                if k == "type":
                    continue
                if k in ("original_context_length", "original_max_position_embeddings"):
                    rebuilt["original_max_position_embeddings"] = int(v)
                else:
                    rebuilt[k] = float(v) if k in ("factor", "attention_factor", "beta_fast", "beta_slow") else v
            config["rope_scaling"] = rebuilt
        elif kind not in (None, "none"):
            shown = ", ".join(f"{k}={v}" for k, v in scaling.items())
            notes.append(f"the file declares RoPE scaling ({arch}.rope.scaling.*: {shown}), which llama.cpp applies "
                         f"but transformers' GGUF loader does not read for {model_type}: the model transformers "
                         "loads runs unscaled (what posenc describes); write the scaling with `posenc extend`")
    return GGUFModel(path=os.fspath(path), architecture=arch, model_type=model_type, metadata=meta,
                     rope_keys=rope_keys, config=config, scaling=scaling, tensor_types=types,
                     tensors={t.name: t.dims for t in layout.tensors}, notes=notes)


def gguf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config.json-form mapping transformers builds for a GGUF file (``read_gguf(path).config``)."""
    return read_gguf(path).config


def metadata_names(path: str | os.PathLike) -> dict[str, str]:
    """{config key: the GGUF metadata key it is read from} for the file at ``path`` ("hidden_size" ->
    "llama.embedding_length", "model_type" -> "general.architecture")."""
    model = read_gguf(path)
    family = "mistral" if model.model_type == "mistral" and model.architecture != "mistral" else model.architecture
    names = {"model_type": "general.architecture"}
    for suffix, target in {**_COMMON, **_FAMILY.get(family, {})}.items():
        if target is not None:
            names.setdefault(target, f"{model.architecture}.{suffix}")
    return names


@contextlib.contextmanager
def errors_name_metadata(path: str | os.PathLike):
    """Inside this block, a bad-input message that names a config key read from the GGUF file at ``path`` names the
    file and its metadata key instead ("max_position_embeddings" -> "model.gguf: ... llama.context_length"): the
    user of a .gguf file has no config.json to look in. posenc._internal.faults.to_flags does the renaming."""
    from posenc._internal.errors import PosencError
    from posenc._internal.faults import to_flags

    try:
        yield
    except PosencError as exc:
        if exc.args and isinstance(exc.args[0], str):
            try:
                names = metadata_names(path)
            except PosencError:          # the file itself is what is wrong: its own message stands
                raise exc from None
            text = to_flags(exc.args[0], names)
            if text != exc.args[0]:
                shown = os.fspath(path)
                exc.args = (text if shown in text else f"{shown}: {text}", *exc.args[1:])
        raise


def unsupported_quantizations(types) -> list[str]:
    """The tensor types among ``types`` (names) that the gguf package cannot dequantize to float."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf import dequantize

    bad = []
    for name in types:
        qtype = GGMLQuantizationType[name]
        _, size = GGML_QUANT_SIZES[qtype]           # (block size in values, bytes per block)
        try:
            dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        except (NotImplementedError, ValueError, TypeError):
            bad.append(name)
    return bad


def loadable_architectures() -> list[str]:
    """The GGUF architectures (llama.cpp's names) transformers' GGUF loader loads as a causal language model: those
    it lists (``GGUF_SUPPORTED_ARCHITECTURES``, which also names metadata sections and encoder-decoders) whose
    model_type has a causal LM class."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    llama_cpp = {model_type: arch for arch, model_type in _MODEL_TYPE.items()}
    names = (llama_cpp.get(a, a) for a in GGUF_SUPPORTED_ARCHITECTURES)
    return sorted(n for n in names if _MODEL_TYPE.get(n, n) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_loadable(model: GGUFModel) -> None:
    """ConfigError (one line) unless transformers can load the file's weights into the model its metadata describes:
    an architecture its GGUF loader loads as a causal LM, tensor types the gguf package dequantizes, and metadata
    that agrees with the tensors (``check_dimensions``)."""
    arch = model.architecture
    known = loadable_architectures()
    if arch not in known:
        raise ConfigError(f"{model.path}: GGUF architecture {arch!r} is not one transformers' GGUF loader can load "
                          f"as a causal language model (it loads {', '.join(known)})")
    bad = unsupported_quantizations(model.tensor_types)
    if bad:
        raise ConfigError(f"{model.path}: tensors quantized as {', '.join(bad)}, which the gguf package cannot "
                          "dequantize, so transformers cannot load them; use a file of another quantization")
    check_dimensions(model)


# a tensor of block i is named "blk.{i}.<part>" (llama.cpp's naming for every decoder family)
_BLOCK = re.compile(r"blk\.(\d+)\.")
# the {arch}.* keys that size a weight (a width, a head count, an expert count): a value past every dimension of the
# file's tensors describes a model larger than the file, which transformers would build (and fill at random) first
SIZE_KEYS = ("embedding_length", "feed_forward_length", "expert_feed_forward_length",
             "expert_shared_feed_forward_length", "attention.head_count", "attention.head_count_kv",
             "attention.key_length", "attention.value_length", "expert_count", "expert_used_count", "vocab_size",
             "rope.dimension_count", "ssm.inner_size", "ssm.state_size", "ssm.conv_kernel", "ssm.time_step_rank")
_MISMATCH = "the metadata does not describe the tensors (a damaged or mis-written file)"


def check_dimensions(model: GGUFModel) -> None:
    """ConfigError (one line, naming the key) when the metadata sizes a model the tensors do not hold: a
    ``{arch}.block_count`` other than the blocks the tensors are for (transformers would build that many layers,
    leaving the extra ones at random weights or dropping the tensors of the missing ones), or a ``SIZE_KEYS`` value
    larger than every dimension of every tensor. Checked on the metadata alone, before transformers builds
    anything: a block_count of 10^9 otherwise takes gigabytes of memory in transformers' config."""
    key = f"{model.architecture}.block_count"
    blocks = {int(m.group(1)) for name in model.tensors if (m := _BLOCK.match(name))}
    held = max(blocks) + 1 if blocks else 0
    where = f"blk.0 to blk.{held - 1}" if held else "none"
    claimed = model.metadata.get(key)
    if claimed is None and held:
        raise ConfigError(f"{model.path}: no {key} entry, but the file holds tensors for {held} blocks ({where}); "
                          f"{_MISMATCH}")
    if claimed is not None and (isinstance(claimed, bool) or not isinstance(claimed, int) or claimed != held):
        raise ConfigError(f"{model.path}: {key} is {claimed!r} but the file holds tensors for {held} blocks "
                          f"({where}); {_MISMATCH}")
    largest = max((d for dims in model.tensors.values() for d in dims), default=0)
    for suffix in SIZE_KEYS:
        name = f"{model.architecture}.{suffix}"
        value = model.metadata.get(name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool) and v > largest:
                raise ConfigError(f"{model.path}: {name} is {v} but no tensor in the file has a dimension that "
                                  f"large (the largest is {largest}); {_MISMATCH}")
