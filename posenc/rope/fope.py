"""The ``fope`` rope type: the frequencies of FoPE (Hua et al. 2024, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", arXiv 2412.17739), default RoPE with its floor clipped.

    inv_j = theta^(-2j/d)   if theta^(-2j/d) >= 2 pi / L
            0               otherwise (the pair's wavelength exceeds the training length L: cos = 1, sin = 0)

A pair whose period is longer than the training length never completes a turn in training, so its angles past L
are ones the model never saw; FoPE zeroes those "floor" frequencies, and the pair carries no position (a constant
channel, as in NoPE). L is the config's ``original_max_position_embeddings`` (the training length), or
``max_position_embeddings`` when that is absent; a config with neither is a ConfigError. The comparison is made in
float64 against the float32 default frequencies (the authors' code compares in float32: only a frequency within a
float32 rounding of 2 pi / L could land on the other side).

What a config holds is only this: the clipped frequencies. The rest of FoPE, the learned Fourier coefficients that
mix every kept frequency into each pair's cos and sin, lives in the model's weights (the lab scheme ``fope``,
``posenc.schemes.fope``); with identity coefficients FoPE is RoPE at these frequencies.

    >>> from posenc.rope.scaling import rope_parameters
    >>> inv, _ = rope_parameters({"head_dim": 8, "rope_theta": 1e4, "original_max_position_embeddings": 64,
    ...                           "rope_scaling": {"rope_type": "fope"}})
    >>> inv.tolist()                                   # 2 pi / 64 = 0.098: pairs 2 and 3 (0.01, 0.001) are clipped
    [1.0, 0.10000000149011612, 0.0, 0.0]
"""

from __future__ import annotations

import math

import torch

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError
from posenc.rope.config import RopeConfig
from posenc.rope.frequencies import default_inv_freq
from posenc.rope.registry import register_rope_type


def floor_frequency(train_len: int) -> float:
    """2 pi / L: the lowest frequency that completes one turn within the training length L (a positive int)."""
    length = check_int(train_len, "train_len", min=1, error=ConfigError)
    return 2 * math.pi / length


def clipped_inv_freq(rotary_dim: int, theta: float, train_len: int) -> torch.Tensor:
    """Default RoPE frequencies theta^(-2j/d), float32 [rotary_dim // 2], with every one below 2 pi / train_len
    set to 0 (those pairs do not rotate)."""
    inv = default_inv_freq(rotary_dim, theta)
    return torch.where(inv.double() < floor_frequency(train_len), torch.zeros_like(inv), inv)


def _training_length(cfg: RopeConfig) -> int:
    """L: original_max_position_embeddings, else max_position_embeddings; a ConfigError naming both if neither."""
    length = cfg.original_max_position_embeddings or cfg.max_position_embeddings
    if not length:
        raise ConfigError("rope_type 'fope' needs the training length to clip at: original_max_position_embeddings "
                          "(or max_position_embeddings), a positive int; the config has neither")
    return length


@register_rope_type("fope")
def fope_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """FoPE's frequencies: default theta^(-2j/d) with those below 2 pi / L zeroed (L = original_max_position_
    embeddings, else max_position_embeddings); attention scaling 1. The learned coefficients are not in a config."""
    return clipped_inv_freq(cfg.rotary_dim, cfg.theta, _training_length(cfg)), 1.0
