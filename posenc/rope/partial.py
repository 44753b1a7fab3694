"""p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?",
arXiv 2410.06205): only the fraction p of pairs with the HIGHEST frequencies rotate; the low-frequency pairs
carry no position at all (NoPE channels free for semantics).

    inv_freq[j] = theta^(-2j/d)   for j < n = int(p * d // 2)      (unchanged RoPE frequencies)
    inv_freq[j] = 0               for j >= n                        (angle 0: the identity rotation)

This is exactly the "proportional" rope type of the registry (Gemma 4's partial RoPE, transformers'
``_compute_proportional_rope_parameters``), so the frequencies come from there and the rotation is RoPE's
kernel over the whole head: a zero frequency leaves its pair untouched. Unlike ``partial_rotary_factor`` in
other types (which rotates the first dims with frequencies recomputed over the smaller rotary dim), the kept
pairs keep the full head's frequencies.
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_float, even_int
from posenc._internal.errors import PosencError
from posenc.rope.config import RopeConfig
from posenc.rope.module import Rotary
from posenc.rope.scaling import proportional_pairs, rope_parameters


def p_rope_config(head_dim: int, fraction: float, theta: float = 10000.0) -> RopeConfig:
    """The RopeConfig of p-RoPE: rope_type "proportional" with partial_rotary_factor = fraction (in (0, 1])."""
    even_int(head_dim, "head_dim")
    fraction = check_float(fraction, "fraction", min=0.0, max=1.0)
    if proportional_pairs(head_dim, fraction) == 0:
        raise PosencError(f"fraction {fraction:g} of head_dim {head_dim} rotates no pair (int(fraction * head_dim "
                          "// 2) = 0): use NoPE, or a fraction of at least 2 / head_dim")
    # rotary_dim = head_dim: proportional RoPE hands out head_dim // 2 frequencies (zeros past the kept ones)
    return RopeConfig(rope_type="proportional", theta=theta, head_dim=head_dim, rotary_dim=head_dim,
                      partial_rotary_factor=fraction)


def p_rope_inv_freq(head_dim: int, fraction: float, theta: float = 10000.0) -> torch.Tensor:
    """float32 [head_dim // 2]: RoPE's frequencies for the first int(fraction * head_dim // 2) pairs, 0 after."""
    return rope_parameters(p_rope_config(head_dim, fraction, theta))[0]


class PRoPE(Rotary):
    """p-RoPE on q and k: ``Rotary`` with the proportional frequencies; forward(q, k, positions) -> (q, k).

    q [B, Hq, T, head_dim], k [B, Hk, T, head_dim], positions [T] or [B, T] (see ``posenc.Rotary``).
    """

    def __init__(self, head_dim: int, fraction: float = 0.25, theta: float = 10000.0, *,
                 layout: str = "interleaved", cache: bool = True):
        super().__init__(config=p_rope_config(head_dim, fraction, theta), layout=layout, cache=cache)
        self.fraction = float(fraction)

    @property
    def rotated_pairs(self) -> int:
        """How many pairs rotate (the rest pass through unchanged)."""
        return int((self.inv_freq > 0).sum())
