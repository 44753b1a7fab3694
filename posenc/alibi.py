"""ALiBi (Press et al. 2022): no embedding; each head adds -m_h * distance to its attention scores.

Slopes follow the paper's reference code (also BLOOM, and MPT with alibi_bias_max=8) for any head count.
The materialised bias here is O(heads * q_len * k_len): fine for tests and short sequences; long sequences
should use ``posenc.kernels.alibi_attention`` which never builds it.
"""

from __future__ import annotations

import math

import torch

from posenc._validate import positive_int
from posenc.errors import PosencError


def _power_of_two_slopes(n: int) -> list[float]:
    # start = ratio = 2^(-8/n): slopes 2^(-8/n), 2^(-16/n), ..., 2^(-8)
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes m_h, float32 [n_heads].

    n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise, with c = 2^floor(log2 n): the slopes for c heads
    followed by the even-indexed slopes for 2c heads, first n - c of them (so n=6 gives 2^-2, 2^-4, 2^-6, 2^-8,
    2^-1, 2^-3: not monotonic, as in the paper).
    """
    positive_int(n_heads, "n_heads")
    c = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(c)
    if c < n_heads:
        slopes += _power_of_two_slopes(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, q_len: int, k_len: int | None = None, *, slopes: torch.Tensor | None = None,
               device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ALiBi bias, [n_heads, q_len, k_len]: bias[h, i, j] = -m_h * |i + (k_len - q_len) - j|.

    Queries are aligned to the end of the keys (KV-cache decoding: the q_len new tokens are the last ones).
    Symmetric in distance, so it also serves bidirectional (encoder) attention; causal masking is attention's job.
    """
    positive_int(n_heads, "n_heads")
    positive_int(q_len, "q_len")
    k_len = q_len if k_len is None else positive_int(k_len, "k_len")
    if k_len < q_len:
        raise PosencError(f"k_len must be >= q_len (queries are the last q_len of the k_len keys); "
                          f"got q_len={q_len}, k_len={k_len}")
    if slopes is None:
        slopes = alibi_slopes(n_heads)
    if device is None and isinstance(slopes, torch.Tensor):
        device = slopes.device  # build the distances where the slopes live
    slopes = torch.as_tensor(slopes, dtype=torch.float32, device=device)
    if slopes.shape != (n_heads,):
        raise PosencError(f"slopes must have shape [n_heads] = [{n_heads}], got {tuple(slopes.shape)}")
    i = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    j = torch.arange(k_len, device=device).unsqueeze(0)
    distance = (i - j).abs().to(torch.float32)                                  # [q_len, k_len]
    return (-slopes.view(n_heads, 1, 1) * distance).to(dtype)
