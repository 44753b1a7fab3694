"""The engine registry: engine name -> rule function returning an ``EngineRope``, and the model an audit reads.

Each rule says what one inference engine computes for one RoPE layer type of a model at one length: the inverse
frequencies, the attention (temperature) factor on cos and sin, when it switches between short and long factors,
its context limit and its layout. Rules are written as differences from posenc.rope.scaling (the transformers
formulas, checked against transformers by tests/rope/test_scaling_hf_parity.py): a rule changes the rope type or
parameters it feeds ``rope_frequencies`` and never restates a formula posenc already owns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posenc._internal.errors import ConfigError


@dataclass
class AuditModel:
    """What every rule reads. cfg: the text RoPE section in config.json form; configs: one RopeConfig per RoPE layer
    type (key None for a model with one set of parameters); length: the length L the audit evaluates at; gguf: the
    GGUFModel when the source is a GGUF file (llama.cpp reads its metadata directly), else None."""

    source: str
    cfg: Mapping[str, Any]
    model_type: str | None
    configs: dict[str | None, Any]
    length: int
    layout: str
    gguf: Any = None


@dataclass
class EngineRope:
    """One engine's RoPE for one layer type. ``inv_freq`` / ``attention_factor`` are what the engine runs (also for a
    config it does not support as written, when it runs something else: llama.cpp runs a dynamic-NTK model unscaled);
    None when nothing is known. ``supported`` False means the engine does not run the config as written; ``reason``
    says why."""

    engine: str
    layer_type: str | None
    method: str
    inv_freq: Any = None
    attention_factor: float | None = None
    switch: str = "none"
    context_limit: int | None = None
    context_note: str = ""
    layout: str = ""
    supported: bool = True
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    # what the engine itself reported for the file, where the audit could run it (llama.cpp with the engines set-up)
    checked: dict | None = None


Rule = Callable[[AuditModel, "str | None"], EngineRope]


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine: its name, label, the sources its rules were read from, and its rule function."""

    name: str
    label: str
    source: str
    rule: Rule


ENGINES: dict[str, EngineEntry] = {}


def register_engine(name: str, *, label: str, source: str, replace: bool = False):
    """Decorator registering ``rule(model, layer_type) -> EngineRope`` as engine ``name``."""
    def decorate(rule: Rule) -> Rule:
        if name in ENGINES and not replace:
            raise ConfigError(f"engine {name!r} is already registered (pass replace=True to override it)")
        ENGINES[name] = EngineEntry(name, label, source, rule)
        return rule
    return decorate
