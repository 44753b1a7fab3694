"""ALiBi attention without the [heads, N, N] bias tensor.

The materialised path (``posenc.alibi_bias`` + SDPA) stores H * Tq * Tk floats: 4.3 GB at H=16, N=8192 in fp32.
Two paths here compute the same attention without it:

- ``"chunked"``: SDPA over blocks of queries (causal; one call when bidirectional). Each block's bias is a strided *view* of one small [H, Tq + Tk]
  template (see the note above ``bias_template``), which SDPA's fused CPU kernel reads in place, so extra memory
  is O(H * N + output). Under a causal mask a block only reads the keys up to its last query, so the masked half
  is skipped too. Plain eager torch: no compiler, works on any device (elsewhere than CPU each block's bias is
  copied out, its size bounded by BIAS_BUDGET_ELEMENTS).
- ``"flex"``: ``torch.nn.attention.flex_attention`` (compiled) with a score_mod adding -m_h * |i - j| inside the
  kernel and a block mask that skips key blocks above the causal diagonal. The first call per shape compiles
  (tens of seconds on CPU).

``backend="auto"`` picks ``"flex"`` on CUDA when it compiles (falling back to ``"chunked"`` with a warning), and
``"chunked"`` on CPU: it has no compile cost and, measured in docs/performance-alibi.md, is as fast.

Positions: query i sits at absolute position i + q_offset (default Tk - Tq: queries are the last Tq of the Tk keys,
the KV-cache convention of flash-attn and ``posenc.alibi_bias``); key j at position j.
Under a causal mask the key-only form m_h * j gives the same softmax (shift invariance per row; tested), but its
values grow with N and lose fp32 precision near the diagonal at long N; both paths use the exact -m_h * |i - j|.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch
import torch.nn.functional as F

from posenc.errors import PosencError

BACKENDS = ("auto", "chunked", "flex")

# The chunked path aims for a per-block bias of about this many fp32 elements (32 MiB): large enough that each
# SDPA call has work to amortise, small enough to stay far below the full bias for any N worth chunking.
BIAS_BUDGET_ELEMENTS = 8 * 2**20
MIN_BLOCK = 16
MIN_CPU_BLOCK = 256


def alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor | None = None, *,
                    causal: bool = True, q_offset: int | None = None, scale: float | None = None,
                    block_size: int | None = None, backend: str = "auto") -> torch.Tensor:
    """softmax(q k^T * scale - m_h * |pos_i - j| [+ causal mask]) v, without building the full bias.

    q: [B, H, Tq, D]; k: [B, Hkv, Tk, D]; v: [B, Hkv, Tk, Dv] with H a multiple of Hkv (grouped-query attention:
    query head h reads key head h // (H // Hkv)). slopes: [H] (default ``posenc.alibi_slopes(H)``).
    causal: query i sees keys j <= pos_i; otherwise all keys, with the symmetric distance |pos_i - j|.
    q_offset: absolute position of query 0 (default Tk - Tq). scale: default 1/sqrt(D).
    block_size: queries per block of the chunked path (default: chosen from a memory budget).
    backend: "auto", "chunked" or "flex". Returns [B, H, Tq, Dv] in q's dtype.
    """
    if backend not in BACKENDS:
        raise PosencError(f"backend must be one of {BACKENDS}, got {backend!r}")
    offset = _check_inputs(q, k, v, q_offset)
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    slopes = _check_slopes(slopes, H, q.device)
    if scale is not None:
        scale = _check_scale(scale)
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise PosencError(f"block_size must be a positive integer (queries per block), got {block_size!r}")
    if backend == "flex" or (backend == "auto" and _auto_backend(q) == "flex"):
        try:
            return _flex(q, k, v, slopes, causal, offset, scale)
        except Exception as err:  # noqa: BLE001 - auto falls back whatever broke inside the compiler
            if backend == "flex":
                raise
            _warn_fallback(err)
    block = block_size if block_size is not None else default_block_size(H, Tq, Tk, q.device, causal)
    return _chunked(q, k, v, slopes, causal, offset, scale, block)


def default_block_size(n_heads: int, q_len: int, k_len: int, device: torch.device | str = "cpu",
                       causal: bool = True) -> int:
    """Queries per block of the chunked path.

    CPU: SDPA reads the bias as a strided view, so a block costs no bias memory and blocks exist only to skip
    masked keys. Causal: 1/8 of the queries per block (at least MIN_CPU_BLOCK) skips all but 1/16 of the masked
    keys; more blocks measured no faster (more calls). Bidirectional: one call. Elsewhere each block's bias is
    copied out, so [n_heads, block, k_len] is kept near BIAS_BUDGET_ELEMENTS (H=16, N=8192: 64 queries, a 32 MiB
    block bias against the 4.3 GB full bias).
    """
    if torch.device(device).type == "cpu":
        block = max(MIN_CPU_BLOCK, -(-q_len // 8)) if causal else q_len
    else:
        block = max(MIN_BLOCK, BIAS_BUDGET_ELEMENTS // max(1, n_heads * k_len))
    return max(1, min(q_len, block))


# ----------------------------------------------------------------------------------------------- argument checks

def _check_inputs(q, k, v, q_offset) -> int:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PosencError(f"{name} must be a 4-D tensor [batch, heads, seq, head_dim], got {shape}")
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise PosencError(f"k must have shape [B={B}, Hkv, Tk, D={D}] to match q {tuple(q.shape)}, "
                          f"got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise PosencError(f"v must have shape [B, Hkv, Tk, Dv] = {tuple(k.shape[:3])} + [Dv] like k, "
                          f"got {tuple(v.shape)}")
    if k.shape[1] == 0 or H % k.shape[1]:
        raise PosencError(f"q's head count ({H}) must be a multiple of k's ({k.shape[1]}) for grouped-query "
                          f"attention")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise PosencError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise PosencError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    Tk = k.shape[2]
    if Tq == 0 or Tk == 0:
        raise PosencError(f"q and k need at least one position, got Tq={Tq}, Tk={Tk}")
    if q_offset is None:
        if Tq > Tk:
            raise PosencError(f"q has more positions ({Tq}) than k ({Tk}): pass q_offset to place the queries "
                              f"(queries default to the last Tq of the Tk key positions)")
        return Tk - Tq
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise PosencError(f"q_offset must be a non-negative integer (absolute position of query 0), "
                          f"got {q_offset!r}")
    return q_offset


def _check_slopes(slopes, n_heads: int, device) -> torch.Tensor:
    if slopes is None:
        from posenc.alibi import alibi_slopes
        return alibi_slopes(n_heads).to(device)
    slopes = torch.as_tensor(slopes, dtype=torch.float32, device=device)
    if slopes.shape != (n_heads,):
        raise PosencError(f"slopes must have shape [H] = [{n_heads}] (one per query head), "
                          f"got {tuple(slopes.shape)}")
    if not torch.isfinite(slopes).all():
        raise PosencError("slopes must be finite")
    return slopes


def _check_scale(scale) -> float:
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise PosencError(f"scale must be a positive number, got {scale!r}") from None
    if not (s > 0 and math.isfinite(s)):
        raise PosencError(f"scale must be a positive finite number, got {scale!r}")
    return s


# ----------------------------------------------------------------------------------------------- chunked (SDPA)
#
# The bias of a block of queries is never written out. With the keys in reverse order, the bias of (query row r,
# reversed key c) depends on r + c only (a Hankel matrix), so it is a strided view (row stride 1, column stride 1)
# of one "template" row per head, [H, Tq + Tk - 1 + offset]. SDPA's fused CPU kernel reads that view in place: no
# [H, block, Tk] tensor exists. Attention does not care about key order, so reversing k and v (one copy each per
# call) is free of error. Other devices get a contiguous copy of each block's bias, kept within
# BIAS_BUDGET_ELEMENTS by the block size.

def bias_template(slopes: torch.Tensor, q_len: int, k_len: int, offset: int, causal: bool) -> torch.Tensor:
    """fp32 [H, q_len + k_len - 1 + offset]: entry t holds the bias at distance d = t - (k_len - 1 - offset).

    d = (query position) - (key position) runs from offset - (k_len - 1) (query 0, last key) to q_len - 1 + offset
    (last query, key 0). Bias: -m_h * |d| (bidirectional), or -m_h * d for d >= 0 and -inf for d < 0 (causal).
    """
    d = torch.arange(q_len + k_len - 1 + offset, device=slopes.device, dtype=torch.float64) - (k_len - 1 - offset)
    bias = -slopes.double().unsqueeze(1) * d.abs()
    if causal:
        bias.masked_fill_(d < 0, float("-inf"))
    return bias.float()


def reversed_keys_bias(template: torch.Tensor, k_len: int, start: int, stop: int, visible: int) -> torch.Tensor:
    """View [1, H, stop - start, visible] of ``template``: the bias of queries start..stop-1 against keys
    visible-1, visible-2, ..., 0 (reversed; ``visible`` <= k_len). Overlapping strides, nothing is copied."""
    H, L = template.shape
    return template.as_strided((1, H, stop - start, visible), (H * L, L, 1, 1),
                               template.storage_offset() + start + k_len - visible)


def _chunked(q, k, v, slopes, causal, offset, scale, block) -> torch.Tensor:
    Tq, Tk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    # CPU SDPA reads the strided view in place, in fp32 for bf16/fp16 inputs (the bias keeps its precision);
    # other devices get a contiguous copy per block in q's dtype
    cpu = q.device.type == "cpu"
    template = bias_template(slopes, Tq, Tk, offset, causal)
    if q.dtype == torch.float64 or not cpu:
        template = template.to(q.dtype)
    k_rev, v_rev = k.flip(2), v.flip(2)
    outs = []
    for s in range(0, Tq, block):
        e = min(s + block, Tq)
        kv = min(Tk, e + offset) if causal else Tk   # causal: keys past the block's last query are never read
        bias = reversed_keys_bias(template, Tk, s, e, kv)
        if not cpu:
            bias = bias.contiguous()
        outs.append(F.scaled_dot_product_attention(q[:, :, s:e], k_rev[:, :, Tk - kv:], v_rev[:, :, Tk - kv:],
                                                   attn_mask=bias, scale=scale, enable_gqa=gqa))
    # one concatenation instead of a copy per block: on a busy CPU each small op costs a scheduler wait
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


# ----------------------------------------------------------------------------------------------- FlexAttention

FLEX_BLOCK = 128
_compiled_flex: dict[str, object] = {}


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _flex_attention_fn(device_type: str):
    """torch.compile(flex_attention), one per device type.

    CPU compiles with static shapes: in torch 2.13 the CPU flex template fails to build once dynamo turns on
    dynamic shapes for a second shape (inductor C++ error "'cur_kvSplitSize5' was not declared"), so every new
    (Tq, Tk) compiles afresh (seconds). GPUs keep torch's default (dynamic after the first recompile), which KV-cache
    decoding with a growing Tk needs.
    """
    if device_type not in _compiled_flex:
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex[device_type] = torch.compile(flex_attention, dynamic=False if device_type == "cpu" else None)
    return _compiled_flex[device_type]


def _flex(q, k, v, slopes, causal, offset, scale) -> torch.Tensor:
    if not flex_available():
        raise PosencError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); "
                          "use backend='chunked'")
    Tq, Tk = q.shape[2], k.shape[2]
    # the offset enters as a tensor, not a Python int that dynamo would bake into the kernel and recompile for
    off = torch.tensor(offset, device=q.device, dtype=torch.int64)

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx + off - kv_idx).abs()

    block_mask = causal_block_mask(Tq, Tk, offset, str(q.device)) if causal else None
    return _flex_attention_fn(q.device.type)(q, k, v, score_mod=alibi_score, block_mask=block_mask, scale=scale,
                                enable_gqa=q.shape[1] != k.shape[1])


@lru_cache(maxsize=16)
def causal_block_mask(q_len: int, k_len: int, offset: int, device: str):
    """FlexAttention BlockMask for j <= i + offset, built from block indices (O((N/128)^2), never [Tq, Tk]).

    Key blocks entirely at or below the diagonal of a query block are "full" (no mask_mod call); blocks that cross
    it, or the ragged last block, are "partial"; the rest are skipped.
    """
    from torch.nn.attention.flex_attention import BlockMask

    bs = FLEX_BLOCK
    nq, nk = -(-q_len // bs), -(-k_len // bs)
    q_first = torch.arange(nq, device=device) * bs + offset                               # lowest position
    q_last = torch.clamp(torch.arange(1, nq + 1, device=device) * bs, max=q_len) - 1 + offset
    k_first = torch.arange(nk, device=device) * bs
    k_last = torch.clamp(torch.arange(1, nk + 1, device=device) * bs, max=k_len) - 1
    seen = k_first[None, :] <= q_last[:, None]                                            # [nq, nk]
    full = (k_last[None, :] <= q_first[:, None]) & (k_last[None, :] - k_first[None, :] == bs - 1)
    partial = seen & ~full

    def indices(sel):
        # per query block: selected key-block indices first (ascending), count of them
        order = torch.argsort((~sel).to(torch.int8), dim=1, stable=True).to(torch.int32)
        return sel.sum(1).to(torch.int32)[None, None], order[None, None]

    off = torch.tensor(offset, device=device, dtype=torch.int64)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + off

    kv_num, kv_idx = indices(partial)
    full_num, full_idx = indices(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs, mask_mod=mask_mod,
                                    seq_lengths=(q_len, k_len))


def _auto_backend(q: torch.Tensor) -> str:
    if q.device.type == "cuda" and flex_available():
        return "flex"
    return "chunked"


def _warn_fallback(err: Exception) -> None:  # pragma: no cover - only when compilation fails on a machine
    warnings.warn(f"flex_attention failed ({err}); using the chunked ALiBi path", RuntimeWarning, stacklevel=3)
