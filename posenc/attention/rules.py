"""What an attention rule is: the base class ``AttentionRule`` and its ``Mode``s. Training-free extension methods that
change attention instead of RoPE's frequencies keep every relative position the model sees inside (or near) its
trained range by giving some query-key pairs other positions.

A rule is described as a few *modes*. In mode m, query i is rotated to position ``q_pos(i)`` and key j to
``k_pos(j)`` (so the pair sees relative position q_pos(i) - k_pos(j)), and query i attends in that mode to the keys
of one interval ``[lo(i), hi(i))`` (lo and hi non-decreasing in i). The intervals of a rule's modes are disjoint and
together cover the keys the query attends to (all j <= i, or fewer for attention sinks). Every pair's score comes
from exactly one mode; one softmax runs over all of them. The blocked kernel (kernel.py) reads only this
description; the plain-loop oracle (reference.py) writes each paper's per-pair rule independently.

Each method's rule is one frozen dataclass in methods.py (its per-pair rule written there), registered in
registry.py; the kernel and the lab's scheme read only ``AttentionRule``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Callable

import torch

from posenc._internal.errors import ConfigError

IntFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Mode:
    """One way of positioning pairs: positions q_pos(i), k_pos(j) (float64 tensors from int64 index tensors) and the
    key interval [lo(i), hi(i)) that query i attends to in this mode (int64 tensors, clipped to [0, i + 1])."""

    name: str
    q_pos: IntFn
    k_pos: IntFn
    lo: IntFn
    hi: IntFn


def same(x: torch.Tensor) -> torch.Tensor:
    return x.double()


def zeros(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)


def constant(value: float) -> IntFn:
    return lambda x: torch.full(x.shape, float(value), dtype=torch.float64, device=x.device)


def window_mode(name: str, window: int) -> Mode:
    """Plain RoPE positions for the keys i - window < j <= i."""
    return Mode(name, same, same, lambda i: (i - window + 1).clamp(min=0), lambda i: i + 1)


def capped_mode(name: str, distance: int, lo: IntFn, hi: IntFn) -> Mode:
    """Every key of [lo(i), hi(i)) seen at relative position ``distance`` (query at it, key at 0): the distance
    ceiling that ReRoPE puts past its window and LM-Infinite puts on its far starting tokens."""
    return Mode(name, constant(distance), lambda j: torch.zeros(j.shape, dtype=torch.float64, device=j.device), lo, hi)


class AttentionRule:
    """Base of the rules. A rule is a frozen dataclass whose fields are the method's options (the typed form
    ``posenc.SelfExtend(group_size=4, window=1024)``); a field left None is derived from the model's trained length
    and the target by ``resolve``. A resolved rule gives ``modes()``, ``identity_for(n)`` and ``keeps`` (what it
    keeps, for reports). ``name`` is the registered method name (set by ``register_attention_method``)."""

    name = ""

    def resolve(self, original: int, target: int) -> "AttentionRule":
        """This rule with every field left None set from the trained length ``original`` and the length the
        defaults plan for, ``target`` (a rule without derived fields returns itself)."""
        return self

    def unresolved(self) -> tuple[str, ...]:
        """The fields still None (derived by ``resolve``)."""
        if not is_dataclass(self):
            return ()
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is None)

    def check_resolved(self) -> None:
        """ConfigError naming the first field still None: the kernel needs every position rule settled."""
        missing = self.unresolved()
        if missing:
            raise ConfigError(f"{missing[0]}: the {self.name or type(self).__name__} rule has no {missing[0]} "
                              "(posenc.patch and attention_rule derive it from the trained length; set it to run "
                              "the rule directly)")

    def modes(self) -> tuple[Mode, ...]:
        raise NotImplementedError

    def identity_for(self, n: int) -> bool:
        """True when, for sequences of at most ``n`` tokens, every pair keeps its plain RoPE position."""
        raise NotImplementedError

    @property
    def keeps(self) -> str:
        raise NotImplementedError

    def params(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    def with_defaults(self, **derived) -> "AttentionRule":
        """This rule with each field that is None set to its value in ``derived`` (the fields given stay)."""
        return replace(self, **{k: v for k, v in derived.items() if getattr(self, k) is None})
