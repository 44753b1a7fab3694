"""Position schemes behind one interface, so attention never branches on a scheme's name.

A scheme can touch three places; each hook is a no-op unless the scheme uses it:

    embed(x, positions)                  x [B, T, D] token embeddings -> x + position signal   (sinusoidal, learned)
    rotate(x, positions, total_len)      x [B, H, T, Dh] queries or keys -> rotated            (rope, rope+alibi)
    bias(q_len, k_len, device)           -> [H, q_len, k_len] float added to the scores         (alibi, rope+alibi)

``positions`` is a LongTensor [T] of absolute positions (with a KV cache they start at the cache length).
``total_len`` is the length of the whole sequence seen so far (cache + new tokens): length-dependent scalings
(dynamic NTK, LongRoPE) pick their frequencies from it.

Names: nope, sinusoidal, learned, rope, alibi, rope+alibi (see ``SCHEME_NAMES`` and ``make_scheme``).
"""

from __future__ import annotations

import copy
from typing import Mapping

import torch
from torch import nn

from posenc.errors import ConfigError

SCHEME_NAMES = ("nope", "sinusoidal", "learned", "rope", "alibi", "rope+alibi")


class Scheme(nn.Module):
    """Base class: a scheme that adds nothing (NoPE behaves exactly like this)."""

    name = "nope"
    rotates = False  # rotate() changes q/k
    has_bias = False  # bias() returns a tensor
    length_dependent = False  # rotate() depends on total_len: cache keys before rotation
    max_len: int | None = None  # positions >= max_len have no encoding (learned table size)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, total_len: int) -> torch.Tensor:
        return x

    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                  total_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, H, T, hd] and k [B, H, T, hd] at the same positions (one cos/sin table where it matters)."""
        return self.rotate(q, positions, total_len), self.rotate(k, positions, total_len)

    def bias(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor | None:
        return None

    def describe(self) -> str:
        return self.name


class NoPEScheme(Scheme):
    """No position signal at all: the causal mask is the only source of order."""


class SinusoidalScheme(Scheme):
    """Adds the fixed sin/cos table (posenc.absolute) to the token embeddings; defined at every position."""

    name = "sinusoidal"

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        from posenc.absolute import SinusoidalPositionalEncoding

        self.pe = SinusoidalPositionalEncoding(d_model, base=base)

    def embed(self, x, positions):
        return self.pe(x, positions)


class LearnedScheme(Scheme):
    """A learned table of ``max_len`` position vectors added to the embeddings. Undefined past the table."""

    name = "learned"

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        from posenc.absolute import LearnedPositionalEmbedding

        self.max_len = int(max_len)
        self.table = LearnedPositionalEmbedding(self.max_len, d_model)

    def embed(self, x, positions):
        return self.table(x, positions)


class RoPEScheme(Scheme):
    """Rotary embeddings on q and k, with any scaling that ``posenc.rope_parameters`` knows.

    ``config`` is a Hugging Face style mapping (rope_theta, head_dim, max_position_embeddings, rope_scaling, ...).
    Frequencies come from ``posenc.rope_parameters(config, seq_len=total_len)``; static types are computed once,
    length-dependent ones (dynamic, longrope) once per total length. ``layout`` is "half" (HF rotate_half pairs
    j, j+d/2) or "interleaved" (pairs 2j, 2j+1): the same math up to a permutation of the head dimension.
    """

    name = "rope"
    rotates = True

    def __init__(self, head_dim: int, n_heads: int, *, base: float = 10000.0, max_position_embeddings: int = 2048,
                 scaling: Mapping | None = None, layout: str = "half"):
        super().__init__()
        if layout not in ("half", "interleaved"):
            raise ConfigError(f"rope layout: expected 'half' or 'interleaved', got {layout!r}")
        if head_dim % 2:
            raise ConfigError(f"head_dim: RoPE needs an even head dimension, got {head_dim}")
        self.layout = layout
        self.base_config = {
            "rope_theta": float(base),
            "head_dim": int(head_dim),
            "num_attention_heads": int(n_heads),
            "hidden_size": int(head_dim * n_heads),
            "max_position_embeddings": int(max_position_embeddings),
        }
        self.set_scaling(scaling)

    def set_scaling(self, scaling: Mapping | None, max_position_embeddings: int | None = None) -> None:
        """Switch the scaling method (None = plain RoPE); used to evaluate extension methods on a trained model."""
        config = dict(self.base_config)
        if max_position_embeddings is not None:
            config["max_position_embeddings"] = int(max_position_embeddings)
        if scaling:
            config["rope_scaling"] = copy.deepcopy(dict(scaling))
        self.config = config
        from posenc.rope.config import load_rope_config
        from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS

        self.rope_type = load_rope_config(config).rope_type
        # the registry says whether frequencies depend on the length: then keys are cached before rotation
        self.length_dependent = getattr(ROPE_SCALING_FUNCTIONS[self.rope_type], "seq_len_rule", None) is not None
        self._cache: dict = {}
        self.frequencies(self.config["max_position_embeddings"])  # validate the config now, not mid-run

    def frequencies(self, total_len: int) -> tuple[torch.Tensor, float]:
        """-> (inv_freq float32 [head_dim // 2], attention_scaling) for a sequence of ``total_len`` tokens."""
        key = int(total_len) if self.length_dependent else None
        if key not in self._cache:
            from posenc import rope_parameters

            if len(self._cache) >= 256:  # length-dependent types key by length: keep long generations bounded
                self._cache.clear()

            inv_freq, scaling = rope_parameters(self.config, seq_len=int(total_len))
            self._cache[key] = (torch.as_tensor(inv_freq, dtype=torch.float32), float(scaling))
        return self._cache[key]

    def _frequencies_on(self, total_len: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """frequencies(total_len) with inv_freq moved to ``device`` once, not on every call."""
        key = int(total_len) if self.length_dependent else None
        inv_freq, scaling = self.frequencies(total_len)
        if inv_freq.device != device:
            inv_freq = inv_freq.to(device)
            self._cache[key] = (inv_freq, scaling)
        return inv_freq, scaling

    def rotate(self, x, positions, total_len):
        from posenc import apply_rope

        inv_freq, scaling = self._frequencies_on(total_len, x.device)
        return apply_rope(x, positions, inv_freq=inv_freq, layout=self.layout, attention_scaling=scaling)

    def rotate_qk(self, q, k, positions, total_len):
        from posenc import apply_rope_qk

        inv_freq, scaling = self._frequencies_on(total_len, q.device)
        return apply_rope_qk(q, k, positions, inv_freq=inv_freq, layout=self.layout, attention_scaling=scaling)

    def describe(self) -> str:
        return self.name if self.rope_type == "default" else f"{self.name} ({self.rope_type})"


class ALiBiScheme(Scheme):
    """A per-head linear distance penalty on the scores, -m_h * (i - j); no embedding, no rotation."""

    name = "alibi"
    has_bias = True

    def __init__(self, n_heads: int):
        super().__init__()
        from posenc import alibi_slopes

        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self._bias_cache: tuple | None = None

    def bias(self, q_len, k_len, device):
        key = (q_len, k_len, str(device))
        if self._bias_cache is None or self._bias_cache[0] != key:
            from posenc import alibi_bias

            b = alibi_bias(len(self.slopes), q_len, k_len, slopes=self.slopes.to(device), device=device)
            self._bias_cache = (key, b)
        return self._bias_cache[1]


class RoPEALiBiScheme(RoPEScheme):
    """RoPE on q/k and the ALiBi bias on the scores, in the same attention (the lesson's exercise 3)."""

    name = "rope+alibi"
    has_bias = True

    def __init__(self, head_dim: int, n_heads: int, **rope_kwargs):
        super().__init__(head_dim, n_heads, **rope_kwargs)
        self.alibi = ALiBiScheme(n_heads)

    def bias(self, q_len, k_len, device):
        return self.alibi.bias(q_len, k_len, device)


def make_scheme(name: str, *, d_model: int, n_heads: int, max_len: int, rope_base: float = 10000.0,
                rope_layout: str = "half", rope_scaling: Mapping | None = None) -> Scheme:
    """Build a scheme by name. ``max_len`` is the learned table size and RoPE's max_position_embeddings
    (the training length in the lab)."""
    if d_model % n_heads:
        raise ConfigError(f"d_model: must be divisible by n_heads ({n_heads}), got {d_model}")
    head_dim = d_model // n_heads
    rope_kwargs = dict(base=rope_base, max_position_embeddings=max_len, scaling=rope_scaling, layout=rope_layout)
    if name == "nope":
        return NoPEScheme()
    if name == "sinusoidal":
        return SinusoidalScheme(d_model)
    if name == "learned":
        return LearnedScheme(d_model, max_len)
    if name == "rope":
        return RoPEScheme(head_dim, n_heads, **rope_kwargs)
    if name == "alibi":
        return ALiBiScheme(n_heads)
    if name == "rope+alibi":
        return RoPEALiBiScheme(head_dim, n_heads, **rope_kwargs)
    raise ConfigError(f"scheme: expected one of {', '.join(SCHEME_NAMES)}, got {name!r}")
