"""Query/key positions for relative attention biases: the one owner of "relative position" and of the KV-cache
alignment (new queries are the last q_len of the k_len keys).

Positions are tensors [..., T] (a leading batch shape is allowed, e.g. randomized positions per row); query and
key positions must share their leading shape (or broadcast). Relative position r[..., i, j] = key_j - query_i,
the sign convention of T5 (memory position minus query position): r <= 0 for keys a causal query can see.
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_int, positive_int
from posenc._internal.errors import PosencError
from posenc.positions import as_positions


def end_aligned_positions(q_len: int, k_len: int | None = None, *, offset: int = 0,
                          device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(query_positions [q_len], key_positions [k_len]) as int64, queries aligned to the end of the keys.

    Keys sit at offset .. offset + k_len - 1 and queries at the last q_len of them: with a KV cache holding
    k_len - q_len tokens this is exactly where the new tokens are.
    """
    positive_int(q_len, "q_len")
    offset = check_int(offset, "offset")
    k_len = q_len if k_len is None else positive_int(k_len, "k_len")
    if k_len < q_len:
        raise PosencError(f"k_len must be >= q_len (queries are the last q_len of the k_len keys); "
                          f"got q_len={q_len}, k_len={k_len}")
    keys = torch.arange(offset, offset + k_len, device=device)
    return keys[k_len - q_len:], keys


def check_positions(query_positions, key_positions, *, integer: bool = False,
                    device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and return (query_positions [..., Tq], key_positions [..., Tk]) as tensors on one device
    (``device``, else the query positions' device).

    ``integer``: require integer dtypes (bucketed biases have no meaning between integers).
    """
    q = as_positions(query_positions, device)
    k = as_positions(key_positions, q.device)
    for name, t in (("query_positions", q), ("key_positions", k)):
        if t.dim() < 1:
            raise PosencError(f"{name} must have shape [..., seq] (at least 1-D), got a scalar")
        if integer and t.is_floating_point():
            raise PosencError(f"{name} must be integers (bucket indices are defined on whole positions), "
                              f"got dtype {t.dtype}")
    try:
        torch.broadcast_shapes(q.shape[:-1], k.shape[:-1])
    except RuntimeError:
        raise PosencError(f"query_positions {list(q.shape)} and key_positions {list(k.shape)} must share their "
                          "leading (batch) dims [..., seq]") from None
    return q, k


def relative_positions(query_positions, key_positions, *, dtype: torch.dtype | None = None,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """r = key - query, [..., Tq, Tk], on ``device`` (default: the query positions') in ``dtype`` (default: int64
    for integer positions, else the wider float of the two).

    The difference is exact before any conversion: integer positions subtract in int64 (uint8 or int16 positions
    cannot wrap around), float ones in float64 (a distance of 1 at position 1e8 survives a float32 result).
    """
    q, k = check_positions(query_positions, key_positions, device=device)
    if q.is_floating_point() or k.is_floating_point():
        work = torch.float64
        dtype = dtype or torch.promote_types(q.dtype, k.dtype)
    else:
        work = torch.int64
    r = k.to(work).unsqueeze(-2) - q.to(work).unsqueeze(-1)
    return r if dtype is None or dtype == work else r.to(dtype)
