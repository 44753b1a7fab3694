"""GGUF files (llama.cpp's format): the model metadata in config.json form, as transformers' GGUF loader reads it.

A GGUF file stores the model's settings as ``{architecture}.{key}`` entries (``llama.context_length``,
``llama.rope.freq_base``, ``llama.rope.dimension_count``...). ``read_gguf(path)`` reads them with the ``gguf``
package (metadata only: the weights stay on disk) and returns a ``GGUFModel`` whose ``config`` is the mapping
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
(posenc.hf.gguf); ``check_loadable`` refuses before that an architecture or a quantization it cannot load.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc.errors import ConfigError

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
    types of its tensors ({type name: count}); notes: what the file says that transformers does not read.
    """

    path: str
    architecture: str
    model_type: str
    metadata: dict[str, Any]
    rope_keys: dict[str, Any]
    config: dict[str, Any]
    scaling: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_gguf(path) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; a folder never is)."""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(SUFFIX) and not Path(path).is_dir()


def _reader(path: str | os.PathLike):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError(f"{os.fspath(path)}: reading a GGUF file needs the gguf package (pip install gguf, or "
                          "posenc[hf])") from None
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"GGUF file not found: {str(p)!r}")
    try:
        return GGUFReader(p)
    except (ValueError, OSError, KeyError, IndexError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"{str(p)!r} is not a readable GGUF file: {text}") from None


def _value(entry) -> Any:
    value = entry.contents()
    return value.item() if hasattr(value, "item") else value


def read_metadata(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, int]]:
    """(every metadata entry of a GGUF file except the tokenizer's vocabulary arrays, {tensor type: count})."""
    reader = _reader(path)
    meta = {k: _value(f) for k, f in reader.fields.items()
            if not k.startswith(_SKIPPED_PREFIX) and not k.startswith("GGUF.")}
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    if "tokenizer.ggml.tokens" in reader.fields:
        meta["tokenizer.ggml.tokens (count)"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    meta["tensors (count)"] = len(reader.tensors)
    meta["output.weight present"] = any(t.name == "output.weight" for t in reader.tensors)
    return meta, types


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Read a GGUF file's model settings (no weights) -> GGUFModel; ConfigError for a file that is not GGUF or
    names no architecture. Parsing a file's metadata takes seconds (the vocabulary arrays are parsed too), so the
    answer is kept per (path, size, modification time); the caller gets its own copy."""
    import copy

    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        _reader(p)                        # the one-line error for a missing file
        raise
    model = copy.deepcopy(_read_gguf(os.path.abspath(p), stat.st_size, stat.st_mtime_ns))
    model.path = os.fspath(path)
    return model


@functools.lru_cache(maxsize=8)
def _read_gguf(path: str, size: int, mtime_ns: int) -> GGUFModel:
    meta, types = read_metadata(path)
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
                     rope_keys=rope_keys, config=config, scaling=scaling, tensor_types=types, notes=notes)


def gguf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The config.json-form mapping transformers builds for a GGUF file (``read_gguf(path).config``)."""
    return read_gguf(path).config


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


def check_loadable(model: GGUFModel) -> None:
    """ConfigError (one line) unless transformers can load the file's weights: an architecture its GGUF loader
    knows, and tensor types the gguf package dequantizes."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = model.architecture
    if arch not in GGUF_SUPPORTED_ARCHITECTURES and model.model_type not in GGUF_SUPPORTED_ARCHITECTURES and \
            arch.replace("-", "_") not in GGUF_SUPPORTED_ARCHITECTURES:
        known = ", ".join(sorted(GGUF_SUPPORTED_ARCHITECTURES))
        raise ConfigError(f"{model.path}: GGUF architecture {arch!r} is not one transformers' GGUF loader can load "
                          f"(it loads {known})")
    bad = unsupported_quantizations(model.tensor_types)
    if bad:
        raise ConfigError(f"{model.path}: tensors quantized as {', '.join(bad)}, which the gguf package cannot "
                          "dequantize, so transformers cannot load them; use a file of another quantization")
