"""cos/sin of position * inv_freq, the angle formed in float64: the one formula every RoPE path builds them with.

``angles_cos_sin`` makes the table; ``Angles`` describes it without making it (positions, float64 frequencies and
the scaling), for a kernel that computes cos/sin itself (the Triton kernel on CUDA) or a backend that builds the
table only when it runs (``Angles.table``). A leaf module (torch only) below both posenc.rope and posenc.kernels:
both import it, and neither imports the other's math to get it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def angles_cos_sin(positions: torch.Tensor, inv64: torch.Tensor, attention_scaling: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [*positions.shape, R/2] of positions * inv64 (float64 [R/2]), times the scaling, in ``dtype``.

    The angle, cos and sin are float64 and rounded to ``dtype`` once at the end; arguments already validated.
    """
    angle = positions.to(torch.float64).unsqueeze(-1) * inv64                 # [..., R/2]
    cos, sin = angle.cos(), angle.sin()
    if attention_scaling != 1.0:
        cos, sin = cos * attention_scaling, sin * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def pack_frequencies(inv64: torch.Tensor, scaling: float) -> torch.Tensor:
    """[R/2 + 1] float64 on inv64's device: the frequencies, then the scaling (what the Triton kernel reads, so
    that it multiplies by the scaling in float64)."""
    inv64 = inv64.reshape(-1)
    return torch.cat((inv64, inv64.new_tensor([float(scaling)])))


class Angles(NamedTuple):
    """cos/sin given as what they are made of: cos = cos(positions * inv_freq) * scaling (sin alike).

    positions: integers or float32/float64, broadcastable to x.shape[:-1]; inv_freq: [rotary_dim // 2] float64
    on x's device; scaling: the attention scaling; packed: None or inv_freq followed by the scaling, [R/2 + 1]
    float64 (what the Triton kernel reads; a cached copy saves building it per call).
    """
    positions: torch.Tensor
    inv_freq: torch.Tensor
    scaling: float
    packed: torch.Tensor | None = None

    def packed_frequencies(self) -> torch.Tensor:
        """``packed`` if given, else built (``pack_frequencies``)."""
        return self.packed if self.packed is not None else pack_frequencies(self.inv_freq, self.scaling)

    def table(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin table [*positions.shape, R/2] in ``dtype``."""
        return angles_cos_sin(self.positions, self.inv_freq, self.scaling, dtype)
