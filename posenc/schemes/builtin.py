"""The built-in schemes: nope, sinusoidal, learned, rope, alibi, rope+alibi (registered in that order).

Each is a thin adapter over the library's math: ``posenc.absolute`` (sinusoidal, learned), ``posenc.Rotary`` (the
one RoPE module: every registered rope type, its length rule and cos/sin cache), ``posenc.alibi`` (slopes, bias).
"""

from __future__ import annotations

import copy
from typing import Mapping

import torch

from posenc._internal.validate import check_choice, even_int, positive_int
from posenc.absolute import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from posenc.alibi import alibi_bias, alibi_slopes
from posenc._internal.errors import ConfigError
from posenc.rope.apply import LAYOUTS, apply_rope_table, math_dtype
from posenc.rope.module import Rotary
from posenc.schemes.base import AttentionContext, NoPEScheme, Scheme
from posenc.schemes.registry import register_scheme

register_scheme("nope", description="no position signal: the causal mask is the only source of order")(NoPEScheme)


@register_scheme("sinusoidal")
class SinusoidalScheme(Scheme):
    """Adds the fixed sin/cos table (Vaswani et al. 2017) to the token embeddings; defined at every position."""

    name = "sinusoidal"
    embeds = True

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.pe = SinusoidalPositionalEncoding(d_model, base=base)

    def embed(self, x, positions):
        return self.pe(x, positions)


@register_scheme("learned")
class LearnedScheme(Scheme):
    """A learned table of ``max_len`` position vectors added to the embeddings (GPT-2). Undefined past it."""

    name = "learned"
    embeds = True

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.max_len = positive_int(max_len, "max_len", error=ConfigError)
        self.table = LearnedPositionalEmbedding(self.max_len, d_model)

    def embed(self, x, positions):
        return self.table(x, positions)


@register_scheme("rope")
class RoPEScheme(Scheme):
    """Rotary embeddings on q and k (Su et al. 2021) through ``posenc.Rotary``, with any registered scaling.

    The RoPE is described by a Hugging Face style mapping (``rope_config``: rope_theta, head_dim,
    max_position_embeddings = the training length, rope_scaling); ``set_rope_scaling`` swaps the scaling, which is
    how the lab applies extension methods to a trained model. ``rope_layout``: "half" (HF rotate_half, pairs
    j, j + d/2) or "interleaved" (pairs 2j, 2j + 1). Length-dependent types (dynamic NTK, LongRoPE) follow
    Rotary's length rule, and each new sequence (nothing cached yet) starts from the original frequencies, so a
    forward at length L uses L's frequencies whatever ran before.
    """

    name = "rope"
    rotates = True
    extendable = True

    def __init__(self, head_dim: int, n_heads: int, *, rope_base: float = 10000.0, max_len: int = 2048,
                 rope_scaling: Mapping | None = None, rope_layout: str = "half"):
        super().__init__()
        self.layout = check_choice(rope_layout, "rope_layout", LAYOUTS, error=ConfigError)
        even_int(head_dim, "head_dim", error=ConfigError)
        self.base_config = {
            "rope_theta": float(rope_base),
            "head_dim": int(head_dim),
            "num_attention_heads": int(n_heads),
            "hidden_size": int(head_dim * n_heads),
            "max_position_embeddings": positive_int(max_len, "max_len", error=ConfigError),
        }
        self.set_rope_scaling(rope_scaling)

    def set_rope_scaling(self, scaling: Mapping | None, max_position_embeddings: int | None = None) -> None:
        """Switch the scaling (None = plain RoPE); validated now, not mid-run. Keeps the module's device."""
        config = dict(self.base_config)
        if max_position_embeddings is not None:
            config["max_position_embeddings"] = positive_int(max_position_embeddings, "max_position_embeddings",
                                                             error=ConfigError)
        if scaling:
            config["rope_scaling"] = copy.deepcopy(dict(scaling))
        rotary = Rotary.from_config(config, layout=self.layout)
        old = getattr(self, "rotary", None)
        self.rotary = rotary if old is None else rotary.to(old.inv_freq.device)
        self.rope_config = config
        self.length_dependent = rotary.seq_len_rule is not None

    @property
    def rope_type(self) -> str:
        return self.rotary.config.rope_type

    def rotate_qk(self, q, k, ctx: AttentionContext):
        if self.length_dependent and ctx.past == 0:
            self.rotary.update(1)  # a new sequence: back to the original frequencies (Rotary's restore rule)
        if ctx.k_positions is ctx.q_positions:
            return self.rotary(q, k, ctx.q_positions)
        return self._rotate(q, ctx.q_positions), self._rotate(k, ctx.k_positions)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary.cos_sin(positions)                  # applies the length rule for these positions
        if cos.dim() == 3:  # per-row positions [B, T, R/2] -> [B, 1, T, R/2]: broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        dtype = math_dtype(x.dtype)
        return apply_rope_table(x, cos.to(x.device, dtype), sin.to(x.device, dtype), layout=self.layout)

    def describe(self) -> str:
        return self.name if self.rope_type == "default" else f"{self.name} ({self.rope_type})"


@register_scheme("alibi")
class ALiBiScheme(Scheme):
    """A per-head linear distance penalty on the logits, -m_h |i - j| (Press et al. 2022); no embedding, no
    rotation."""

    name = "alibi"
    biases = True
    float32_buffers = ("slopes",)

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self._bias_cache: tuple | None = None      # (key, slopes tensor it was made from, bias)

    def bias(self, q, k, ctx: AttentionContext):
        q_len, k_len = ctx.q_positions.shape[-1], ctx.k_positions.shape[-1]
        slopes = self.slopes
        if not ctx.contiguous:  # positions that are not past..past+T-1 (randomized, PoSE): distances from them
            d = ctx.distance().abs()
            return -slopes.view(-1, 1, 1) * (d[:, None] if d.dim() == 3 else d)
        if torch.compiler.is_compiling():    # traced: the bias is built in the graph (no cache keyed by versions)
            return alibi_bias(len(slopes), q_len, k_len, slopes=slopes.to(q.device), device=q.device)
        # the cached bias is valid for these lengths and device, and for these slopes unmodified since
        key = (q_len, k_len, str(q.device), slopes._version)
        cache = self._bias_cache
        if cache is None or cache[0] != key or cache[1] is not slopes:
            b = alibi_bias(len(slopes), q_len, k_len, slopes=slopes.to(q.device), device=q.device)
            self._bias_cache = cache = (key, slopes, b)
        return cache[2]


@register_scheme("rope+alibi")
class RoPEALiBiScheme(RoPEScheme):
    """RoPE on q/k and the ALiBi bias on the logits in the same attention (the lesson's exercise 3)."""

    name = "rope+alibi"
    biases = True

    def __init__(self, head_dim: int, n_heads: int, *, rope_base: float = 10000.0, max_len: int = 2048,
                 rope_scaling: Mapping | None = None, rope_layout: str = "half"):
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_scaling=rope_scaling,
                         rope_layout=rope_layout)
        self.alibi = ALiBiScheme(n_heads)

    def bias(self, q, k, ctx):
        return self.alibi.bias(q, k, ctx)
