"""Helpers the engine rules share: evaluate posenc's scaling registry on a changed RoPE config (how a rule states
its difference from transformers), and the transformers row's own facts that other engines repeat."""

from __future__ import annotations

import dataclasses
import warnings

from posenc.rope.config import RopeConfig
from posenc.rope.scaling import rope_frequencies

# the rope types transformers has no function for (posenc's own and vLLM's variants): no engine reads them from a
# config.json, so the audit reports them as such
POSENC_ONLY_TYPES = frozenset({"ntk", "vllm_dynamic", "vllm_dynamic_alpha", "vllm_ntk", "vllm_longrope"})


def variant(rc: RopeConfig, rope_type: str | None = None, *, drop=(), **params) -> RopeConfig:
    """``rc`` with another rope type and/or parameters (``drop``: keys removed; ``params``: keys set; the lengths
    ``original_max_position_embeddings`` / ``max_position_embeddings`` are fields, set by those names)."""
    fields = {k: params.pop(k) for k in ("original_max_position_embeddings", "max_position_embeddings")
              if k in params}
    merged = {k: v for k, v in rc.params.items() if k not in drop}
    merged.update(params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # the config's own warnings are inspect's business
        return dataclasses.replace(rc, rope_type=rope_type or rc.rope_type, params=merged, **fields)


def frequencies(rc: RopeConfig, seq_len: int | None):
    """(inv_freq float32, attention factor) from posenc's registry, the config's warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rope_frequencies(rc, seq_len)
