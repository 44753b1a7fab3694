"""Rope types of the lab's 2025-26 lessons: Resonance RoPE (integer wavelengths) and DroPE (RoPE dropped).

    resonance   inv_j = 2 pi / round(2 pi / base_j), base_j the default frequencies, or YaRN's when the config
                gives a factor ("Resonance YaRN"); YaRN's attention scaling with it
    drope       inv_j = 0 for every pair: the rotation is the identity, the model runs as NoPE

Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of Large Language
Models", arXiv 2403.00071) rounds each pair's wavelength to the nearest integer, so the angle at position n + k
lambda equals the angle at n exactly: a pair whose wavelength fits inside the training length then meets no unseen
angle past it. The authors' code (``sheryc/resonance_rope``, ``rotary_resonance.py``) rounds every pair, and rounds
YaRN's blended frequencies the same way for their Resonance YaRN; this type does both.

DroPE (Gelberg et al. 2025, "Extending the Context of Pretrained LLMs by Dropping their Positional Embeddings",
arXiv 2512.12167) removes RoPE from a trained model and recalibrates it briefly at the trained length; the frequency
half of that is this type, the recalibration is the lab's (``posenc.extensions.builtin``'s ``drope`` method).
"""

from __future__ import annotations

import math

import torch

from posenc._internal.errors import ConfigError
from posenc.rope.apply import default_inv_freq
from posenc.rope.config import RopeConfig
from posenc.rope.registry import register_rope_type
from posenc.rope.scaling import yarn_rope

YARN_KEYS = ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def round_wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """inv_freq [pairs] -> 2 pi / round(2 pi / inv_freq) [pairs], float32 (computed in float64: wavelengths of a
    base-10^6 RoPE reach 6e6, where float32 still holds integers exactly but not the division's rounding).
    Zero frequencies (pairs that do not rotate) stay zero; a wavelength that rounds to 0 is kept at 1."""
    inv = inv_freq.to(torch.float64)
    rotating = inv > 0
    wavelength = torch.where(rotating, 2 * math.pi / torch.where(rotating, inv, 1.0), 0.0)
    rounded = torch.round(wavelength).clamp(min=1.0)
    return torch.where(rotating, 2 * math.pi / rounded, 0.0).to(torch.float32)


@register_rope_type("resonance", optional=YARN_KEYS)
def resonance_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Resonance RoPE: the default (or, with ``factor``, YaRN's) frequencies with wavelengths rounded to integers.

    With ``factor`` the config also needs original_max_position_embeddings, as YaRN does, and the other YaRN keys
    apply (beta_fast, beta_slow, mscale, attention_factor); the attention scaling is YaRN's.
    """
    if cfg.params.get("factor") is None:
        return round_wavelengths(default_inv_freq(cfg.rotary_dim, cfg.theta)), 1.0
    if cfg.original_max_position_embeddings is None:
        raise ConfigError("rope_type 'resonance' with a factor (Resonance YaRN) needs "
                          "original_max_position_embeddings, the length the model was trained at")
    inv_freq, scaling = yarn_rope(cfg, seq_len)
    return round_wavelengths(inv_freq), scaling


@register_rope_type("drope")
def drope_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """DroPE's dropped RoPE: every frequency 0, so cos = 1, sin = 0 and q, k pass unrotated (NoPE)."""
    return torch.zeros(cfg.rotary_dim // 2, dtype=torch.float32), 1.0
