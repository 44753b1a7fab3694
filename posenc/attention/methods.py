"""The built-in attention methods, one typed rule each (a frozen dataclass registered with
``register_attention_method``): Self-Extend, ReRoPE, Leaky ReRoPE, Dual Chunk Attention, attention sinks, STRING,
LM-Infinite. A field left None is derived by ``resolve(original, target)`` from the trained length L and the target
N, as the method's paper or official code suggests (each ``resolve`` says how).

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
- STRING (An et al. 2024, arXiv 2410.18745; HKUNLP/STRING): distances d = i - j below the shift S keep d; from S on
  the query moves back by S - W, so d becomes d - S + W (W the small local window): the rarely trained largest
  distances are never used, the well-trained ones from W on are used twice. Reach L + S - W.
- LM-Infinite (Han et al. 2024, NAACL, arXiv 2308.16137; Glaciohound/LM-Infinite): a Lambda-shaped mask (the first
  n_global tokens and the last n_local) with a distance ceiling c: a pair is at min(i - j, c).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._internal.validate import check_float, check_int
from posenc.attention.registry import register_attention_method
from posenc.attention.rules import AttentionRule, Mode, capped_mode, constant, same, zeros, window_mode
from posenc._internal.errors import ConfigError

TWO_SCORE_PASSES = "two score passes per far pair region (normal and remapped), one softmax; keys cached unrotated"


def _int(value, name: str, minimum: int) -> None:
    """A field that is set must be an int >= minimum (None: derived by resolve)."""
    if value is not None:
        check_int(value, name, min=minimum, error=ConfigError)


@register_attention_method(
    "self-extend", label="Self-Extend", costs=TWO_SCORE_PASSES,
    note="zero-shot (Jin et al. 2024; the LongLM README's passkey demo: Llama-2 trained at 4k answers none of 5 "
         "prompts of 5,144 tokens, with Self-Extend all 5; Mistral likewise at 9,994 tokens). Reach (L - W) * G + W; "
         "the README suggests G 2-64 and W 512-1536 for Llama-2.")
@dataclass(frozen=True)
class SelfExtend(AttentionRule):
    """Self-Extend: neighbour window W (group_size G grouping past it). G = 1 is plain RoPE."""

    group_size: int | None = None
    window: int | None = None

    def __post_init__(self):
        _int(self.group_size, "group_size", 1)
        _int(self.window, "window", 1)

    def resolve(self, original, target):
        """window default L // 4; group_size default the smallest G with W + (N - W) / G <= 2L/3 (the LongLM
        README's rule of thumb: the largest grouped distance between half and two thirds of L)."""
        window = max(1, original // 4) if self.window is None else self.window
        room = 2 * original / 3 - window
        group = 1 if target <= window else max(1, math.ceil((target - window) / max(room, 1.0)))
        return self.with_defaults(window=window, group_size=group)

    def modes(self):
        g, w = self.group_size, self.window
        shift = w - w // g
        return (window_mode("neighbour", w),
                Mode("grouped", lambda i: (torch.div(i, g, rounding_mode="floor") + shift).double(),
                     lambda j: torch.div(j, g, rounding_mode="floor").double(),
                     zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.group_size == 1 or self.window >= n

    def reach(self, train_len: int) -> int:
        """Longest input whose largest grouped distance stays below train_len: (L - W) * G + W."""
        return (train_len - self.window) * self.group_size + self.window

    @property
    def keeps(self):
        return f"exact within {self.window}, grouped by {self.group_size} beyond"


@register_attention_method(
    "rerope", label="ReRoPE", costs=TWO_SCORE_PASSES,
    note="zero-shot (Su 2023): relative positions capped at the window; every key beyond it looks equally far, so "
         "order among far keys is lost.")
@dataclass(frozen=True)
class ReRoPE(AttentionRule):
    """ReRoPE: relative position min(i - j, window)."""

    window: int | None = None

    def __post_init__(self):
        _int(self.window, "window", 1)

    def resolve(self, original, target):
        """window default L // 2."""
        return self.with_defaults(window=max(1, original // 2))

    def modes(self):
        w = self.window
        return (window_mode("local", w), capped_mode("clamped", w, zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.window >= n

    @property
    def keeps(self):
        return f"exact within {self.window}, all farther at {self.window}"


@register_attention_method(
    "leaky-rerope", label="Leaky ReRoPE", costs=TWO_SCORE_PASSES,
    note="zero-shot (Su 2023): like ReRoPE but far distances compressed by the leak factor instead of capped.")
@dataclass(frozen=True)
class LeakyReRoPE(AttentionRule):
    """Leaky ReRoPE: relative position i - j within the window, window + (i - j - window) / leak beyond."""

    window: int | None = None
    leak: float | None = None

    def __post_init__(self):
        _int(self.window, "window", 1)
        if self.leak is not None:
            check_float(self.leak, "leak", min=1.0, error=ConfigError)

    def resolve(self, original, target):
        """window default L // 2; leak default (N - 1 - w) / (L - 1 - w) (the farthest pair lands at L - 1), at
        least 1."""
        window = max(1, original // 2) if self.window is None else self.window
        leak = max(1.0, (target - 1 - window) / max(original - 1 - window, 1))
        return self.with_defaults(window=window, leak=leak)

    def modes(self):
        w, k = self.window, float(self.leak)
        return (window_mode("local", w),
                Mode("leaky", lambda i: w - w / k + i.double() / k, lambda j: j.double() / k,
                     zeros, lambda i: (i - w + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.window >= n or self.leak == 1.0

    @property
    def keeps(self):
        return f"exact within {self.window}, compressed {self.leak:.3g}x beyond"


@register_attention_method(
    "dca", label="Dual Chunk",
    costs="three score passes (intra, successive, inter chunk), one softmax; keys cached unrotated",
    note="zero-shot (An et al. 2024; the ChunkLlama README: Llama-2 7B/13B trained at 4k extended to 32k, 70B to "
         "128k, 'more than 8x' the pre-training length).")
@dataclass(frozen=True)
class DualChunk(AttentionRule):
    """Dual Chunk Attention with chunk_size s and local_window w (chunks of s - w tokens)."""

    chunk_size: int | None = None
    local_window: int | None = None

    def __post_init__(self):
        _int(self.chunk_size, "chunk_size", 2)
        _int(self.local_window, "local_window", 0)
        if None not in (self.chunk_size, self.local_window) and self.local_window >= self.chunk_size:
            raise ConfigError(f"local_window must be below chunk_size ({self.chunk_size}), got {self.local_window}")

    def resolve(self, original, target):
        """ChunkLlama's defaults: chunk_size 3L // 4, local_window L // 16."""
        return self.with_defaults(chunk_size=max(2, 3 * original // 4), local_window=original // 16)

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
                Mode("inter", constant(min(2 * c - 1, s)), in_chunk,
                     zeros, lambda i: ((chunk_of(i) - 1) * c).clamp(min=0)))

    def identity_for(self, n):
        return self.chunk >= n

    @property
    def keeps(self):
        return f"exact within chunks of {self.chunk}, distances capped at {self.chunk_size}"


@register_attention_method(
    "sinks", label="attention sinks",
    costs="one pass over n_sink + window keys per query (cheaper than full attention); keys cached unrotated and "
          "re-indexed; tokens evicted from the middle cannot be retrieved",
    note="streaming (Xiao et al. 2023): stable perplexity over 4 million tokens (Llama-2, MPT, Falcon, Pythia), but "
         "only the first n_sink and the last window tokens are attended: their StreamEval accuracy drops to zero "
         "once the answer is farther back than the cache.")
@dataclass(frozen=True)
class Sinks(AttentionRule):
    """Attention sinks: the first n_sink tokens plus the last ``window`` (the current token included)."""

    n_sink: int | None = None
    window: int | None = None

    def __post_init__(self):
        _int(self.n_sink, "n_sink", 0)
        _int(self.window, "window", 1)

    def resolve(self, original, target):
        """n_sink default 4 (StreamingLLM); window default L - n_sink (the cache holds L tokens)."""
        n_sink = 4 if self.n_sink is None else self.n_sink
        return self.with_defaults(n_sink=n_sink, window=max(1, original - n_sink))

    def modes(self):
        n, w = self.n_sink, self.window
        recent = window_mode("recent", w)
        if n == 0:
            return (recent,)
        return (recent, Mode("sink", lambda i: i.clamp(max=n + w - 1).double(), same,
                             zeros, lambda i: (i - w + 1).clamp(min=0, max=n)))

    def identity_for(self, n):
        return self.window >= n

    @property
    def keeps(self):
        return f"first {self.n_sink} + last {self.window} tokens only"


@register_attention_method(
    "string", label="STRING",
    costs="two score passes (the exact diagonal band and the shifted rest), one softmax; keys cached unrotated",
    note="zero-shot (An et al. 2024, arXiv 2410.18745): with S = L/3 and W = 128, Llama 3.1 8B/70B and Qwen2 72B "
         "gain on RULER and InfiniteBench at their own 128k training length (the HKUNLP/STRING README lists "
         "Llama3.1-70B-STRING at 81.9 average on RULER 128k). Works inside the trained length; reach L + S - W.")
@dataclass(frozen=True)
class STRING(AttentionRule):
    """STRING: relative distance d below ``shift`` (S) kept, d - S + ``local_window`` (W) from S on (W < S)."""

    shift: int | None = None
    local_window: int | None = None

    def __post_init__(self):
        _int(self.shift, "shift", 2)
        _int(self.local_window, "local_window", 1)
        if None not in (self.shift, self.local_window) and self.local_window >= self.shift:
            raise ConfigError(f"local_window must be below shift ({self.shift}), got {self.local_window}")

    def resolve(self, original, target):
        """shift default L // 3 (the paper's S = L/3; the README's int(0.33 * L)); local_window default 128 (the
        paper's and README's W), capped at shift // 4 so that short trained lengths still shift (posenc's choice)."""
        shift = max(2, original // 3) if self.shift is None else self.shift
        return self.with_defaults(shift=shift, local_window=max(1, min(128, shift // 4)))

    def modes(self):
        s, w = self.shift, self.local_window
        # the shifted query position i - S + W: distance d = i - j >= S is seen as d - S + W
        return (window_mode("diagonal", s),
                Mode("shifted", lambda i: (i - s + w).double(), same, zeros, lambda i: (i - s + 1).clamp(min=0)))

    def identity_for(self, n):
        return self.shift >= n

    def reach(self, train_len: int) -> int:
        """Longest input whose largest shifted distance stays below train_len: L + S - W."""
        return train_len + self.shift - self.local_window

    @property
    def keeps(self):
        return f"exact within {self.shift}, shifted back by {self.shift - self.local_window} beyond"


@register_attention_method(
    "lm-infinite", label="LM-Infinite",
    costs="three score passes (recent window, starting tokens near and past the ceiling), one softmax over "
          "n_global + n_local keys per query; keys cached unrotated; middle tokens cannot be retrieved",
    note="zero-shot (Han et al. 2024, NAACL; the Glaciohound/LM-Infinite README: Llama-2, LLaMA, GPT-J and MPT "
         "generalize to 128k tokens with no training). Like attention sinks it attends only the first n_global and "
         "the last n_local tokens, so nothing from the middle of a longer input can be retrieved.")
@dataclass(frozen=True)
class LMInfinite(AttentionRule):
    """LM-Infinite: the first ``n_global`` and the last ``n_local`` tokens, every distance capped at ``ceiling``."""

    n_global: int | None = None
    n_local: int | None = None
    ceiling: int | None = None

    def __post_init__(self):
        _int(self.n_global, "n_global", 0)
        _int(self.n_local, "n_local", 1)
        _int(self.ceiling, "ceiling", 1)
        if None not in (self.n_local, self.ceiling) and self.ceiling < self.n_local:
            raise ConfigError(f"ceiling must be at least n_local ({self.n_local}), got {self.ceiling}")

    def resolve(self, original, target):
        """n_global default 10 (the README's convert_llama_model(model, 4096, 10); it finds 10-100 alike); n_local
        and ceiling default L (the paper's L_pretrain for both)."""
        return self.with_defaults(n_global=10, n_local=original, ceiling=original)

    def modes(self):
        g, w, c = self.n_global, self.n_local, self.ceiling

        def split(i):  # starting tokens before it are farther than the ceiling
            return (i - c).clamp(min=0, max=g)

        recent = window_mode("recent", w)
        if g == 0:
            return (recent,)
        return (recent,
                Mode("global", same, same, split, lambda i: (i - w + 1).clamp(min=0, max=g)),
                capped_mode("global-capped", c, zeros, split))

    def identity_for(self, n):
        return self.n_local >= n

    @property
    def keeps(self):
        return f"first {self.n_global} + last {self.n_local} tokens, distances capped at {self.ceiling}"
