"""ALiBi (Press et al. 2022): no embedding; each head adds -m_h * distance to its attention scores.

Slopes follow the paper's reference code (also BLOOM, and MPT with alibi_bias_max=8) for any head count up to
``MAX_HEADS``. The materialised bias here is O(heads * q_len * k_len) and refused above ``MAX_BIAS_ELEMENTS``:
fine for tests and short sequences; long sequences should use ``posenc.alibi_attention``, which never builds it.
This module owns the slopes rule: ``check_slopes`` is what every ALiBi entry point uses to validate custom slopes.
"""

from __future__ import annotations

import math

import torch

from posenc._internal.validate import check_int, positive_int
from posenc._internal.errors import PosencError

# Far beyond any published model (BLOOM-176B: 112 heads; the widest MPT: 64), and small enough that the slope list
# is built in milliseconds: without a bound, alibi_slopes(10**9) grows a Python list until the OOM killer ends it.
MAX_HEADS = 2**16

# A bias of heads * q_len * k_len elements: 2^30 is 4 GiB in fp32 (16 heads at 8192 x 8192). Anything larger is
# refused with a pointer to posenc.alibi_attention, which computes the same attention without the bias.
MAX_BIAS_ELEMENTS = 2**30


def _power_of_two_slopes(n: int) -> list[float]:
    # start = ratio = 2^(-8/n): slopes 2^(-8/n), 2^(-16/n), ..., 2^(-8)
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def _check_heads(n_heads) -> int:
    return check_int(n_heads, "n_heads", min=1, max=MAX_HEADS)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Per-head slopes m_h, float32 [n_heads]; 1 <= n_heads <= MAX_HEADS (65536).

    n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise, with c = 2^floor(log2 n): the slopes for c heads
    followed by the even-indexed slopes for 2c heads, first n - c of them (so n=6 gives 2^-2, 2^-4, 2^-6, 2^-8,
    2^-1, 2^-3: not monotonic, as in the paper).
    """
    n_heads = _check_heads(n_heads)
    c = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(c)
    if c < n_heads:
        slopes += _power_of_two_slopes(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float32)


def check_slopes(slopes, n_heads: int, device: torch.device | str | None = None, *,
                 what: str = "n_heads", values: bool = True) -> torch.Tensor:
    """Custom slopes as a float32 tensor [n_heads] on ``device``, or PosencError: one finite number per head.

    ``what`` names the head count in the message (``"n_heads"``, or ``"H"`` for attention's query heads).
    NaN or inf slopes are refused: one of them turns every score of its head into NaN. While torch.compile /
    torch.export trace, the values are unknown and not checked here (``posenc.alibi_attention``'s op checks them
    when it runs; a materialised bias shows the NaN in the output); ``values=False`` (a fake implementation) skips
    them too.
    """
    try:
        t = torch.as_tensor(slopes, dtype=torch.float32, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise PosencError(f"slopes must be a tensor or sequence of {n_heads} numbers (one per head), "
                          f"got {type(slopes).__name__}") from None
    if t.shape != (n_heads,):
        raise PosencError(f"slopes must have shape [{what}] = [{n_heads}] (one per head), got {tuple(t.shape)}")
    if not values or t.device.type == "meta" or torch.compiler.is_compiling():   # no values: shapes only, a trace
        return t
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = int((~finite).nonzero()[0, 0])
        raise PosencError(f"slopes must be finite numbers, got {t[bad].item()} for head {bad}")
    return t


def alibi_bias(n_heads: int, q_len: int, k_len: int | None = None, *, slopes: torch.Tensor | None = None,
               device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
               max_elements: int = MAX_BIAS_ELEMENTS) -> torch.Tensor:
    """The ALiBi bias, [n_heads, q_len, k_len]: bias[h, i, j] = -m_h * |i + (k_len - q_len) - j|.

    Queries are aligned to the end of the keys (KV-cache decoding: the q_len new tokens are the last ones).
    Symmetric in distance, so it also serves bidirectional (encoder) attention; causal masking is attention's job.
    Refused when n_heads * q_len * k_len exceeds ``max_elements`` (default 2^30, 4 GiB in fp32): use
    ``posenc.alibi_attention`` there, which never builds this tensor.
    """
    n_heads = _check_heads(n_heads)
    q_len = positive_int(q_len, "q_len")
    k_len = q_len if k_len is None else positive_int(k_len, "k_len")
    max_elements = positive_int(max_elements, "max_elements")
    if k_len < q_len:
        raise PosencError(f"k_len must be >= q_len (queries are the last q_len of the k_len keys); "
                          f"got q_len={q_len}, k_len={k_len}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise PosencError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    n = n_heads * q_len * k_len
    if n > max_elements:
        raise PosencError(
            f"alibi_bias({n_heads}, {q_len}, {k_len}) would hold {n:,} elements "
            f"({n * dtype.itemsize / 2**30:.1f} GiB), over max_elements={max_elements:,}: use "
            f"posenc.alibi_attention(q, k, v), which computes ALiBi attention without the [heads, q_len, k_len] "
            f"bias (or raise max_elements if you really need it)")
    if slopes is None:
        slopes = alibi_slopes(n_heads)
    if device is None and isinstance(slopes, torch.Tensor):
        device = slopes.device  # build the distances where the slopes live
    slopes = check_slopes(slopes, n_heads, device)
    i = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    j = torch.arange(k_len, device=device).unsqueeze(0)
    distance = (i - j).abs().to(torch.float32)                                  # [q_len, k_len]
    return (-slopes.view(n_heads, 1, 1) * distance).to(dtype)
