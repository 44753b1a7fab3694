"""``resonance-rope``: Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of
Large Language Models", arXiv 2403.00071): RoPE with every pair's wavelength rounded to the nearest integer, so the
angles a pair takes repeat exactly every lambda positions (rope type "resonance", ``posenc.rope.lessons``).

    inv_freq[j] = 2 pi / round(2 pi / theta^(-2j/d))

Extendable with YaRN only, as the paper combines it ("Resonance YaRN": YaRN's frequencies, then rounded); any other
extension method's rope type would drop the rounding, so it is refused.
"""

from __future__ import annotations

from typing import Mapping

from posenc._internal.errors import ConfigError
from posenc.schemes.builtin import RoPEScheme
from posenc.schemes.registry import register_scheme


@register_scheme("resonance-rope")
class ResonanceRoPEScheme(RoPEScheme):
    """RoPE with integer wavelengths (Wang et al. 2024); with YaRN, Resonance YaRN."""

    def __init__(self, head_dim: int, n_heads: int, *, rope_base: float = 10000.0, max_len: int = 2048,
                 rope_scaling: Mapping | None = None, rope_layout: str = "half"):
        super().__init__(head_dim, n_heads, rope_base=rope_base, max_len=max_len, rope_scaling=rope_scaling,
                         rope_layout=rope_layout)

    def set_rope_scaling(self, scaling: Mapping | None, max_position_embeddings: int | None = None) -> None:
        """None: Resonance RoPE; a yarn mapping: Resonance YaRN (the same keys under rope type "resonance")."""
        if scaling and dict(scaling).get("rope_type", dict(scaling).get("type")) not in ("yarn", "resonance"):
            raise ConfigError(f"the resonance-rope scheme extends with yarn only (Resonance YaRN, as Wang et al. "
                              f"2024 combine them); got rope_type {dict(scaling).get('rope_type')!r}, whose "
                              "frequencies would lose the integer wavelengths")
        resonance = {**dict(scaling or {}), "rope_type": "resonance"}
        resonance.pop("type", None)
        super().set_rope_scaling(resonance, max_position_embeddings)

    def describe(self) -> str:
        return self.name if self.rotary.config.factor is None else f"{self.name} (Resonance YaRN)"
