"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context Transformers",
arXiv 2310.04418): a learned function of the progressively normalised distance, added to the attention logits.

    bias[h, i, j] = f_theta( psi(i - j) / psi(max(L, i)) )[h]        psi(x) = log(c * x + 1),  j <= i

f_theta: R -> R^H is a small MLP (one hidden layer, ReLU; width 32 in the paper) whose outputs are the per-head
biases; c > 0 and the threshold L > 0 are learned. Dividing by psi(max(L, i)) maps every distance a query at
position i can see into [0, 1] whatever the sequence length ("progressive interpolation"), which is why FIRE is
reported to extrapolate; below the threshold L the normaliser is fixed, so short contexts keep absolute distances.

Causal only: keys after the query (j > i) get the distance-0 value; the causal mask hides them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from posenc._internal.validate import check_float, positive_int
from posenc.bias.parametrize import inverse_softplus
from posenc.bias.positions import check_positions, relative_positions
from posenc._internal.errors import PosencError


def fire_inputs(query_positions, key_positions, *, c: torch.Tensor | float,
                threshold: torch.Tensor | float) -> torch.Tensor:
    """The MLP's input psi(i - j) / psi(max(L, i)), float32 [..., Tq, Tk], in [0, 1] for j <= i.

    ``c`` and ``threshold`` (L) are positive scalars (tensors keep their gradient). Positions are absolute:
    [..., Tq] queries and [..., Tk] keys (with a KV cache the queries sit after the cached keys).
    """
    device = c.device if isinstance(c, torch.Tensor) else None      # compute where the parameters live
    q, _ = check_positions(query_positions, key_positions, device=device)
    c = torch.as_tensor(c, dtype=torch.float32, device=q.device)
    threshold = torch.as_tensor(threshold, dtype=torch.float32, device=q.device)
    if c.dim() or threshold.dim():
        raise PosencError(f"c and threshold must be scalars, got shapes {tuple(c.shape)} and {tuple(threshold.shape)}")
    distance = (-relative_positions(q, key_positions, dtype=torch.float32)).clamp(min=0)   # i - j, [..., Tq, Tk]
    normaliser = torch.log1p(c * torch.maximum(q.to(torch.float32), threshold))          # [..., Tq]
    return torch.log1p(c * distance) / normaliser.unsqueeze(-1)


def fire_bias(query_positions, key_positions, *, c, threshold,
              mlp: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The FIRE bias [..., H, Tq, Tk]: ``mlp`` maps inputs [..., 1] to per-head values [..., H].

    Memory: the MLP's hidden layer holds Tq * Tk * width floats (32 M for 1024 x 1024 at width 32).
    """
    x = fire_inputs(query_positions, key_positions, c=c, threshold=threshold)
    return mlp(x.unsqueeze(-1)).movedim(-1, -3)


def fire_bias_contiguous(q_len: int, k_len: int, *, c, threshold,
                         mlp: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fire_bias`` for the default positions: keys 0..k_len-1, queries the last q_len of them -> [H, q_len, k_len].

    Every query below the threshold L has the same normaliser psi(L), so on those rows the bias is a function of
    i - j alone and the MLP runs once per distance (k_len inputs instead of rows x k_len: 16x fewer at 128
    tokens); the rows at or past L (normaliser psi(i)) take the general form. Equal to
    ``fire_bias(arange(k_len - q_len, k_len), arange(k_len), ...)`` in value and gradient (tests/bias/test_fire.py;
    a query exactly at L takes the general form, where torch.maximum splits the gradient). Reads L once (a device
    sync on a GPU).
    """
    q_len, k_len = positive_int(q_len, "q_len"), positive_int(k_len, "k_len")
    if k_len < q_len:
        raise PosencError(f"k_len must be >= q_len (queries are the last q_len of the k_len keys); "
                          f"got q_len={q_len}, k_len={k_len}")
    c = torch.as_tensor(c, dtype=torch.float32)
    threshold = torch.as_tensor(threshold, dtype=torch.float32, device=c.device)
    first = k_len - q_len                                                               # the first query's position
    below = min(q_len, max(0, math.ceil(float(threshold.detach())) - first))          # queries at positions < L
    parts = []
    if below:
        last = first + below - 1                                   # the last query below L: it sees every distance
        x = fire_inputs(torch.tensor([last], device=c.device), torch.arange(last, -1, -1, device=c.device),
                        c=c, threshold=threshold)[0]                # distances 0 .. last, normalised by psi(L)
        table = mlp(x.unsqueeze(-1))                                                    # [distances, H]
        i = torch.arange(first, first + below, device=c.device).unsqueeze(-1)
        index = (i - torch.arange(k_len, device=c.device)).clamp_(min=0)              # keys after i read distance 0
        parts.append(table.t()[:, index])                                               # [H, below, k_len]
    if below < q_len:
        parts.append(fire_bias(torch.arange(first + below, k_len, device=c.device),
                               torch.arange(k_len, device=c.device), c=c, threshold=threshold, mlp=mlp))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)


class FIREBias(nn.Module):
    """Learned FIRE bias: forward(query_positions, key_positions) -> [..., n_heads, Tq, Tk] in the MLP's dtype
    (float32 unless the module was cast; the MLP's input is formed in float32 either way).

    Args:
        n_heads: outputs of the MLP (one bias per head).
        width: hidden width of the MLP (32 in the paper).
        init_c, init_threshold: starting c and L (the paper's code starts at 0.1 and 512). A threshold above the
            training length means training never reaches the interpolating regime; the lab may prefer the
            training length.
    c and L are kept positive as softplus(raw) (smooth, with a gradient everywhere; the paper's code uses |c| and
    |m| * L0 with a learned multiplier m and a fixed L0 instead).
    """

    def __init__(self, n_heads: int, *, width: int = 32, init_c: float = 0.1, init_threshold: float = 512.0):
        super().__init__()
        self.n_heads = positive_int(n_heads, "n_heads")
        self.width = positive_int(width, "width")
        self.raw_c = nn.Parameter(inverse_softplus(check_float(init_c, "init_c", positive=True)))
        self.raw_threshold = nn.Parameter(
            inverse_softplus(check_float(init_threshold, "init_threshold", positive=True)))
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))

    @property
    def c(self) -> torch.Tensor:
        return F.softplus(self.raw_c)

    @property
    def threshold(self) -> torch.Tensor:
        return F.softplus(self.raw_threshold)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        # the float32 inputs meet the MLP in its own dtype (a model cast with .to(torch.bfloat16) casts the MLP)
        return self.mlp(x.to(self.mlp[0].weight.dtype))

    def forward(self, query_positions, key_positions) -> torch.Tensor:
        return fire_bias(query_positions, key_positions, c=self.c, threshold=self.threshold, mlp=self._mlp)

    def contiguous(self, q_len: int, k_len: int) -> torch.Tensor:
        """The bias [H, q_len, k_len] at the default positions, from i - j alone on the rows below the threshold
        (``fire_bias_contiguous``)."""
        return fire_bias_contiguous(q_len, k_len, c=self.c, threshold=self.threshold, mlp=self._mlp)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, width={self.width}"
