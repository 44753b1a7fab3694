"""KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation",
arXiv 2205.09921): a conditionally positive definite distance kernel, per head, added to the attention logits.

    log variant:    bias[h, i, j] = -r1_h * log(1 + r2_h * |i - j|)        r1, r2 > 0
    power variant:  bias[h, i, j] = -r1_h * |i - j| ** r2_h                 r1 > 0, 0 < r2 < 2

With r2 = 1 the power variant is ALiBi with slope r1. The paper reports the log variant extrapolating best.

Parametrisation (``KerpleBias``): r1 = softplus(a), r2 = softplus(b) (log) or 2 * sigmoid(b) (power). The paper's
code instead clamps the raw parameters in place to >= 0.01 at every forward; a smooth map keeps the parameters
strictly inside their range with a gradient everywhere, and leaves forward free of side effects (no in-place
writes to parameters, so it composes with torch.compile and functional training).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from posenc._internal.validate import check_choice, positive_int
from posenc.bias.parametrize import inverse_softplus
from posenc.bias.positions import relative_positions
from posenc._internal.errors import PosencError

VARIANTS = ("log", "power")


def kerple_bias(r1: torch.Tensor, r2: torch.Tensor, query_positions, key_positions, *,
                variant: str = "log") -> torch.Tensor:
    """The KERPLE bias [..., H, Tq, Tk] for positions [..., Tq] and [..., Tk].

    r1, r2: [H] positive per-head parameters (already mapped to their range; the power variant needs r2 <= 2).
    Computed in r1's dtype (float32 or wider); distances are |key - query|, so it is symmetric, and the causal
    mask stays attention's job. Queries may start after the keys (KV cache): only the positions matter.
    """
    check_choice(variant, "variant", VARIANTS)
    r1, r2 = torch.as_tensor(r1), torch.as_tensor(r2)
    if r1.dim() != 1 or r2.shape != r1.shape:
        raise PosencError(f"r1 and r2 must both have shape [n_heads], got {tuple(r1.shape)} and {tuple(r2.shape)}")
    dtype = torch.promote_types(r1.dtype, torch.float32)
    distance = relative_positions(query_positions, key_positions, dtype=dtype, device=r1.device).abs()
    distance = distance.unsqueeze(-3)                                                 # [..., 1, Tq, Tk]
    r1, r2 = r1.to(dtype).view(-1, 1, 1), r2.to(dtype).view(-1, 1, 1)
    if variant == "log":
        return -r1 * torch.log1p(r2 * distance)
    return -r1 * distance.pow(r2)


class KerpleBias(nn.Module):
    """Learned KERPLE bias: forward(query_positions, key_positions) -> [..., n_heads, Tq, Tk] (float32).

    Initial values per head (as in the paper's code, which draws them uniformly): r1 ~ U(0.01, 2),
    r2 ~ U(0.01, 1) for both variants (the power exponent then starts at most 1, i.e. no steeper than ALiBi).
    """

    def __init__(self, n_heads: int, *, variant: str = "log"):
        super().__init__()
        self.n_heads = positive_int(n_heads, "n_heads")
        self.variant = check_choice(variant, "variant", VARIANTS)
        r1 = 0.01 + 1.99 * torch.rand(n_heads)
        r2 = 0.01 + 0.99 * torch.rand(n_heads)
        self.raw_r1 = nn.Parameter(inverse_softplus(r1))
        self.raw_r2 = nn.Parameter(inverse_softplus(r2) if variant == "log" else torch.logit(r2 / 2))

    @property
    def r1(self) -> torch.Tensor:
        """[n_heads] > 0."""
        return F.softplus(self.raw_r1)

    @property
    def r2(self) -> torch.Tensor:
        """[n_heads]: > 0 (log variant) or in (0, 2) (power variant)."""
        return F.softplus(self.raw_r2) if self.variant == "log" else 2 * torch.sigmoid(self.raw_r2)

    def _per_head(self, value, name: str) -> torch.Tensor:
        try:
            t = torch.as_tensor(value, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise PosencError(f"{name} must be a number or {self.n_heads} numbers (one per head), got "
                              f"{type(value).__name__}") from None
        if t.dim() and tuple(t.shape) != (self.n_heads,):
            raise PosencError(f"{name} must be a scalar or have shape [n_heads] = [{self.n_heads}], got "
                              f"{tuple(t.shape)}")
        return t.expand(self.n_heads)

    @torch.no_grad()
    def set_parameters(self, r1, r2) -> None:
        """Set r1, r2 ([n_heads] or scalars) in their natural units (e.g. to start from ALiBi's slopes)."""
        r1, r2 = self._per_head(r1, "r1"), self._per_head(r2, "r2")
        hi = math.inf if self.variant == "log" else 2.0
        if not bool((r1 > 0).all()) or not bool(((r2 > 0) & (r2 < hi)).all()):
            raise PosencError(f"r1 must be > 0 and r2 in (0, {hi}) for the {self.variant} variant, "
                              f"got r1={r1.tolist()}, r2={r2.tolist()}")
        self.raw_r1.copy_(inverse_softplus(r1))
        self.raw_r2.copy_(inverse_softplus(r2) if self.variant == "log" else torch.logit(r2 / 2))

    def forward(self, query_positions, key_positions) -> torch.Tensor:
        return kerple_bias(self.r1, self.r2, query_positions, key_positions, variant=self.variant)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, variant={self.variant!r}"
