"""Training-free extension methods that change attention instead of RoPE's frequencies: each keeps every relative
position the model sees inside (or near) its trained range by giving some query-key pairs other positions.

A rule is described as a few *modes*. In mode m, query i is rotated to position ``q_pos(i)`` and key j to
``k_pos(j)`` (so the pair sees relative position q_pos(i) - k_pos(j)), and query i attends in that mode to the keys
of one interval ``[lo(i), hi(i))`` (lo and hi non-decreasing in i). The intervals of a rule's modes are disjoint and
together cover the keys the query attends to (all j <= i, or fewer for attention sinks). Every pair's score comes
from exactly one mode; one softmax runs over all of them. The blocked kernel (kernel.py) reads only this
description; the plain-loop oracle (reference.py) writes each paper's per-pair rule independently.

Notation: i query index, j key index (absolute token positions 0, 1, ...; j <= i), L the trained length.

- Self-Extend (Jin et al. 2024, arXiv 2401.01325; datamllab/LongLM): a key within the neighbour window (i - j < W)
  keeps its position j and the query i; a farther key is grouped: key floor(j / G), query floor(i / G) + W -
  floor(W / G), so the grouped distance continues the window's. Reach (L - W) * G + W.
- ReRoPE (Su 2023): relative position min(i - j, w): past the window every key looks w away. Leaky ReRoPE:
  w + (i - j - w) / k past the window (k > 1), so far keys stay ordered but compressed k times.
- Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama): chunks of c = chunk_size -
  local_window tokens; keys sit at j mod c. Same chunk: the query at i mod c (the true distance). Previous chunk:
  the query at min(i mod c + c, chunk_size) (locality kept for the first tokens of a chunk). Older chunks: the
  query at min(2c - 1, chunk_size), a constant. The largest distance is chunk_size.
- Attention sinks (Xiao et al. 2023, StreamingLLM, arXiv 2309.17453): the cache keeps the first n_sink tokens and
  the last ``window`` tokens (the current one included); positions are places in the cache, so a recent key keeps
  distance i - j and a sink s is at distance min(i, n_sink + window - 1) - s. Evicted keys are not attended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from posenc._validate import check_float, check_int
from posenc.errors import ConfigError

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


def _same(x: torch.Tensor) -> torch.Tensor:
    return x.double()


def _zeros(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)


def _constant(value: float) -> IntFn:
    return lambda x: torch.full(x.shape, float(value), dtype=torch.float64, device=x.device)


def window_mode(name: str, window: int) -> Mode:
    """Plain RoPE positions for the keys i - window < j <= i."""
    return Mode(name, _same, _same, lambda i: (i - window + 1).clamp(min=0), lambda i: i + 1)


class AttentionRule:
    """Base of the rules: ``modes()``, ``max_distance`` (the largest relative position a pair gets, None when it
    grows with the length), ``identity_below(n)`` and ``keeps`` (what it keeps, for reports)."""

    name = ""

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


@dataclass(frozen=True)
class SelfExtend(AttentionRule):
    """Self-Extend: neighbour window W (group_size G grouping past it). G = 1 is plain RoPE."""

    group_size: int
    window: int
    name = "self-extend"

    def __post_init__(self):
        check_int(self.group_size, "group_size", min=1, error=ConfigError)
        check_int(self.window, "window", min=1, error=ConfigError)

    def modes(self):
        g, w = self.group_size, self.window
        shift = w - w // g
        return (window_mode("neighbour", w),
                Mode("grouped", lambda i: (torch.div(i, g, rounding_mode="floor") + shift).double(),
                     lambda j: torch.div(j, g, rounding_mode="floor").double(),
                     _zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.group_size == 1 or self.window >= n

    def reach(self, train_len: int) -> int:
        """Longest input whose largest grouped distance stays below train_len: (L - W) * G + W."""
        return (train_len - self.window) * self.group_size + self.window

    @property
    def keeps(self):
        return f"exact within {self.window}, grouped by {self.group_size} beyond"


@dataclass(frozen=True)
class ReRoPE(AttentionRule):
    """ReRoPE: relative position min(i - j, window)."""

    window: int
    name = "rerope"

    def __post_init__(self):
        check_int(self.window, "window", min=1, error=ConfigError)

    def modes(self):
        w = self.window
        return (window_mode("local", w),
                Mode("clamped", _constant(w), lambda j: torch.zeros(j.shape, dtype=torch.float64, device=j.device),
                     _zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.window >= n

    @property
    def keeps(self):
        return f"exact within {self.window}, all farther at {self.window}"


@dataclass(frozen=True)
class LeakyReRoPE(AttentionRule):
    """Leaky ReRoPE: relative position i - j within the window, window + (i - j - window) / leak beyond."""

    window: int
    leak: float
    name = "leaky-rerope"

    def __post_init__(self):
        check_int(self.window, "window", min=1, error=ConfigError)
        check_float(self.leak, "leak", min=1.0, error=ConfigError)

    def modes(self):
        w, k = self.window, float(self.leak)
        return (window_mode("local", w),
                Mode("leaky", lambda i: w - w / k + i.double() / k, lambda j: j.double() / k,
                     _zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.window >= n or self.leak == 1.0

    @property
    def keeps(self):
        return f"exact within {self.window}, compressed {self.leak:.3g}x beyond"


@dataclass(frozen=True)
class DualChunk(AttentionRule):
    """Dual Chunk Attention with chunk_size s and local_window w (chunks of s - w tokens)."""

    chunk_size: int
    local_window: int
    name = "dca"

    def __post_init__(self):
        check_int(self.chunk_size, "chunk_size", min=2, error=ConfigError)
        check_int(self.local_window, "local_window", min=0, error=ConfigError)
        if self.local_window >= self.chunk_size:
            raise ConfigError(f"local_window must be below chunk_size ({self.chunk_size}), got {self.local_window}")

    @property
    def chunk(self) -> int:
        return self.chunk_size - self.local_window

    def modes(self):
        c, s = self.chunk, self.chunk_size

        def chunk_of(x):
            return torch.div(x, c, rounding_mode="floor")

        def in_chunk(x):
            return (x - chunk_of(x) * c).double()

        return (Mode("intra", in_chunk, in_chunk, lambda i: chunk_of(i) * c, lambda i: i + 1),
                Mode("successive", lambda i: (in_chunk(i) + c).clamp(max=s), in_chunk,
                     lambda i: ((chunk_of(i) - 1) * c).clamp(min=0), lambda i: chunk_of(i) * c),
                Mode("inter", _constant(min(2 * c - 1, s)), in_chunk,
                     _zeros, lambda i: ((chunk_of(i) - 1) * c).clamp(min=0)))

    def identity_for(self, n):
        return self.chunk >= n

    @property
    def keeps(self):
        return f"exact within chunks of {self.chunk}, distances capped at {self.chunk_size}"


@dataclass(frozen=True)
class Sinks(AttentionRule):
    """Attention sinks: the first n_sink tokens plus the last ``window`` (the current token included)."""

    n_sink: int
    window: int
    name = "sinks"

    def __post_init__(self):
        check_int(self.n_sink, "n_sink", min=0, error=ConfigError)
        check_int(self.window, "window", min=1, error=ConfigError)

    def modes(self):
        n, w = self.n_sink, self.window
        recent = window_mode("recent", w)
        if n == 0:
            return (recent,)
        return (recent, Mode("sink", lambda i: i.clamp(max=n + w - 1).double(), _same,
                             _zeros, lambda i: (i - w + 1).clamp(min=0, max=n)))

    def identity_for(self, n):
        return self.window >= n

    @property
    def keeps(self):
        return f"first {self.n_sink} + last {self.window} tokens only"
