"""``p-rope``: p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings
useful?", arXiv 2410.06205): only the fraction p of pairs with the highest frequencies rotate, the rest carry no
position (NoPE channels).

    inv_freq[j] = theta^(-2j/d) for j < int(p * d / 2), else 0       (rope_type "proportional", ``posenc.rope.partial``)

The RoPE scheme with the registry's "proportional" rope type (``posenc.rope.partial.p_rope_config``): the kept
pairs keep the full head's frequencies. Not extendable: an extension method writes a mapping of its own rope
type, which would drop the partial rotation. Scheme option: ``p`` (default 0.25).

``hope`` (HoPE, Chen et al. 2024) is the same scheme with the cut at the training length (below).
"""

from __future__ import annotations

import math
from typing import Mapping

from posenc._internal.validate import check_float
from posenc._internal.errors import ConfigError
from posenc.rope.scaling import proportional_pairs
from posenc.schemes.builtin import RoPEScheme
from posenc.schemes.registry import register_scheme


@register_scheme("p-rope")
class PRoPEScheme(RoPEScheme):
    """RoPE on the fraction p of highest-frequency pairs only; the other pairs are NoPE (Barbero et al. 2024)."""

    extendable = False

    def __init__(self, head_dim: int, n_heads: int, *, rope_base: float = 10000.0, max_len: int = 2048,
                 rope_layout: str = "half", p: float = 0.25):
        self.fraction = check_float(p, "p", min=0.0, max=1.0, error=ConfigError)
        if proportional_pairs(head_dim, self.fraction) == 0:
            raise ConfigError(f"p = {self.fraction:g} of head_dim {head_dim} rotates no pair (int(p * head_dim // 2)"
                              " = 0): use the nope scheme, or p of at least 2 / head_dim")
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_layout=rope_layout)

    def set_rope_scaling(self, scaling: Mapping | None, max_position_embeddings: int | None = None) -> None:
        if scaling:
            raise ConfigError("the p-rope scheme cannot take an extension method's rope scaling (it would drop the "
                              "partial rotation)")
        super().set_rope_scaling({"rope_type": "proportional", "partial_rotary_factor": self.fraction},
                                 max_position_embeddings)

    def describe(self) -> str:
        return f"{self.name} (p={self.fraction:g})"


def full_period_pairs(head_dim: int, theta: float, length: int) -> int:
    """How many pairs complete a full turn within ``length`` positions: wavelength 2 pi theta^(2j/d) <= length
    (the pairs RoPE trained at ``length`` has seen at every angle)."""
    return sum(1 for j in range(head_dim // 2) if 2 * math.pi * theta ** (2 * j / head_dim) <= length)


@register_scheme("hope")
class HoPEScheme(PRoPEScheme):
    """HoPE (Chen et al. 2024): p-RoPE whose kept pairs are those with a full period within the training length.

    HoPE ("A Novel Positional Encoding Without Long-Term Decay", arXiv 2410.21216) keeps RoPE's high-frequency
    pairs and makes the rest position-independent, with the cut at the training length; it is p-RoPE (Barbero et al.
    2024) with p = (pairs whose wavelength <= max_len) / (head_dim / 2). Option ``p`` overrides that fraction.
    """

    def __init__(self, head_dim: int, n_heads: int, *, rope_base: float = 10000.0, max_len: int = 2048,
                 rope_layout: str = "half", p: float | None = None):
        if p is None:
            kept = full_period_pairs(head_dim, rope_base, max_len)
            if kept == 0:
                raise ConfigError(f"hope: no pair of head_dim {head_dim} completes a turn within max_len {max_len} "
                                  f"(the fastest wavelength is 2 pi = 6.28 positions): use the nope scheme")
            # + 0.5: int(p * head_dim // 2) lands on kept whatever the float rounding; every pair kept is p = 1
            p = min(1.0, (kept + 0.5) / (head_dim // 2))
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_layout=rope_layout, p=p)
        self.kept = proportional_pairs(head_dim, self.fraction)

    def describe(self) -> str:
        return f"{self.name} ({self.kept} of {self.rotary.config.head_dim // 2} pairs rotate)"
