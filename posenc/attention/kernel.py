"""Causal attention under an attention rule (rules.py), blocked, with an online softmax: memory linear in the length.

For every mode of the rule, q and k are rotated once to the mode's positions. Queries are taken in blocks; for a
block, a mode's keys form a band [min lo, max hi); its middle [max lo, min hi) holds for every row and runs without a
mask, the two edges with a boolean mask of block x edge width. Each piece returns its output and log-sum-exp, and
the pieces are merged exactly (out = sum_p exp(lse_p - lse) out_p). No [T, T] score matrix is ever formed.

On the CPU a piece is torch's flash attention for CPU (``_scaled_dot_product_flash_attention_for_cpu``, which
returns the log-sum-exp); elsewhere a matmul + logsumexp over the piece. GQA: the query heads that share a key head
are stacked along the rows of one call, so keys are never repeated.

``band_attention`` is a sliding-window (local) layer: on the CPU one flash call per block of queries over the keys of
its window, with one additive mask shared by every block past the first window; elsewhere ``rule_attention`` under
a rule of one window mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._internal.errors import PosencError
from posenc.attention.rules import AttentionRule, window_mode
from posenc.rope.apply import apply_rope_table, math_dtype, rope_cos_sin

BLOCK = 256  # query rows per block (times the GQA group): a piece's mask is at most BLOCK x its edge width


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float,
           layout: str) -> torch.Tensor:
    """RoPE of x [B, H, T, D] at float64 ``positions`` [T] (angles in float64, rotation in x's math dtype)."""
    cos, sin = rope_cos_sin(positions, inv_freq.to(positions.device), attention_scaling, dtype=math_dtype(x.dtype))
    return apply_rope_table(x, cos, sin, layout=layout, rotary_dim=2 * inv_freq.numel())


def _flash_cpu(q, k, v, mask, scale):
    if mask is not None:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                        scale=scale)
    return out, lse.to(torch.float32) if lse.dtype != torch.float64 else lse


def _matmul_piece(q, k, v, mask, scale):
    s = torch.matmul(q.float() if q.dtype != torch.float64 else q, (k.float() if k.dtype != torch.float64 else k)
                     .transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.clamp(min=-1e30)[..., None])
    return torch.matmul(p.to(v.dtype), v), lse


def _piece(q, k, v, mask, scale):
    """Attention of q [B, Hk, R, D] over k, v [B, Hk, S, D] with a bool mask [R, S] or None -> (out, lse [B, Hk, R]).
    Rows the mask empties get lse = -inf (so the merge ignores them)."""
    # torch's CPU flash kernel (its exp is a fast approximation: ~1e-8 relative even in float64, so float64 inputs
    # take the exact matmul path)
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16) \
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        out, lse = _flash_cpu(q, k, v, mask, scale)
    else:
        out, lse = _matmul_piece(q, k, v, mask, scale)
    if mask is not None:
        lse = lse.masked_fill(~mask.any(-1), float("-inf"))
    return (out if out.dtype == torch.float64 else out.float()), lse


def _merge(acc, piece):
    if acc is None:
        return piece
    (o1, l1), (o2, l2) = acc, piece
    lse = torch.logaddexp(l1, l2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w1, w2 = torch.exp(l1 - safe)[..., None], torch.exp(l2 - safe)[..., None]
    return o1 * w1 + o2.to(o1.dtype) * w2, lse


def _checked_offset(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int | None) -> int:
    """The queries' offset among the keys (default Tk - Tq) after checking the shapes: PosencError naming them."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise PosencError(f"q, k, v must be [B, H, T, D]; got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    if Hq % Hk or v.shape[:3] != k.shape[:3] or k.shape[-1] != D or k.shape[0] != B:
        raise PosencError(f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}: k and v must share [B, Hk, T] "
                          "and q's heads must be a multiple of k's")
    q_offset = Tk - Tq if q_offset is None else int(q_offset)
    if q_offset < 0 or q_offset + Tq > Tk:
        raise PosencError(f"q_offset: queries must sit among the keys (0 <= q_offset <= Tk - Tq = {Tk - Tq}), "
                          f"got {q_offset}")
    return q_offset


def rule_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rule: AttentionRule, inv_freq: torch.Tensor, *,
                   attention_scaling: float = 1.0, scale: float | None = None, layout: str = "half",
                   q_offset: int | None = None, block: int = BLOCK) -> torch.Tensor:
    """Causal attention of UNROTATED q [B, Hq, Tq, D] over unrotated k [B, Hk, Tk, D], v [B, Hk, Tk, Dv] -> [B, Hq,
    Tq, Dv] (q's dtype), with RoPE positions given by ``rule``.

    Keys sit at positions 0..Tk-1, queries at q_offset..q_offset+Tq-1 (default Tk - Tq: the last tokens, as after a
    KV cache). inv_freq: [R/2] (R the rotary dim, the first R dims rotate in ``layout``); attention_scaling
    multiplies cos and sin (transformers' convention); scale: the softmax scale (default 1/sqrt(D)). Hq must be a
    multiple of Hk (GQA: query head h uses key head h // (Hq / Hk)).
    """
    q_offset = _checked_offset(q, k, v, q_offset)
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    rule.check_resolved()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    g = Hq // Hk
    dev = q.device
    qi = torch.arange(q_offset, q_offset + Tq, device=dev)
    kj = torch.arange(Tk, device=dev)
    out = torch.empty(B, Hq, Tq, v.shape[-1], dtype=q.dtype, device=dev)
    rotated = []
    for mode in rule.modes():
        lo, hi = mode.lo(qi).clamp(0, Tk), torch.minimum(mode.hi(qi), qi + 1)
        if not bool((hi > lo).any()):
            continue
        rotated.append((mode, lo, hi, rotate(q, mode.q_pos(qi), inv_freq, attention_scaling, layout)
                        .view(B, Hk, g, Tq, D), rotate(k, mode.k_pos(kj), inv_freq, attention_scaling, layout)))
    step = max(1, block // g)
    for a in range(0, Tq, step):
        b = min(Tq, a + step)
        acc = None
        for mode, lo_all, hi_all, qm, km in rotated:
            lo, hi = lo_all[a:b], hi_all[a:b]
            bounds = torch.stack([lo.min(), hi.max(), lo.max(), hi.min()]).tolist()
            band_lo, band_hi, full_lo, full_hi = bounds
            if band_hi <= band_lo:
                continue
            rows = qm[:, :, :, a:b].reshape(B, Hk, g * (b - a), D)
            if full_lo < full_hi:
                cuts = [(band_lo, full_lo, True), (full_lo, full_hi, False), (full_hi, band_hi, True)]
            else:
                cuts = [(band_lo, band_hi, True)]
            for c0, c1, masked in cuts:
                if c1 <= c0:
                    continue
                mask = None
                if masked:
                    j = torch.arange(c0, c1, device=dev)
                    mask = ((j >= lo[:, None]) & (j < hi[:, None])).repeat(g, 1)
                    if not bool(mask.any()):
                        continue
                acc = _merge(acc, _piece(rows, km[:, :, c0:c1], v[:, :, c0:c1], mask, scale))
        if acc is None:
            raise PosencError(f"attention rule {rule.name!r} leaves query {q_offset + a} with no key")
        o, lse = acc
        if bool(torch.isinf(lse).any()):
            raise PosencError(f"attention rule {rule.name!r} leaves a query of rows {q_offset + a}..{q_offset + b - 1}"
                              " with no key")
        out[:, :, a:b] = o.view(B, Hk, g, b - a, -1).reshape(B, Hq, b - a, -1).to(q.dtype)
    return out


@dataclass(frozen=True)
class BandRule(AttentionRule):
    """Plain RoPE over the keys i - window < j <= i: a sliding-window (local) layer as a rule of one mode, so the
    kernel visits only the band of keys each block of queries can see. Internal: not a registered method."""

    window: int
    name = "band"

    def modes(self):
        return (window_mode("band", self.window),)

    def identity_for(self, n):
        return n <= self.window

    @property
    def keeps(self):
        return f"the last {self.window} keys"


def band_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, inv_freq: torch.Tensor | None, *,
                   attention_scaling: float = 1.0, scale: float | None = None, layout: str = "half",
                   q_offset: int | None = None, block: int = BLOCK) -> torch.Tensor:
    """Sliding-window causal attention of UNROTATED q [B, Hq, Tq, D] over k, v [B, Hk, Tk, D] -> [B, Hq, Tq, Dv]:
    query i (at q_offset + n, default Tk - Tq) sees the keys i - window < j <= i, with plain RoPE at its index.
    Cost Tq x (window + block) instead of Tq x Tk: each block of queries reads only its band of keys.

    ``inv_freq`` None: q and k are already rotated (transformers applied RoPE at the model's own positions, as for
    plain sdpa), so nothing is rotated here and only the window's mask depends on the indices.

    On the CPU (float32, bf16, fp16, no autograd: ``band_in_one_call``) a block is ONE call of torch's flash kernel
    over its band with an additive mask, and every block past the first window has the same mask (built once): no
    pieces to merge. Any other case runs ``rule_attention`` under ``BandRule`` (middle unmasked, edges masked,
    merged), the exact path the tests hold both to."""
    window = int(window)
    if window < 1:
        raise PosencError(f"window: a sliding window holds at least 1 key, got {window}")
    if not band_in_one_call(q, k, v):
        if inv_freq is None:       # rotated already: zero frequencies rotate by nothing (cos 1, sin 0: exact)
            inv_freq, attention_scaling = torch.zeros(q.shape[-1] // 2, dtype=torch.float32), 1.0
        return rule_attention(q, k, v, BandRule(window), inv_freq, attention_scaling=attention_scaling, scale=scale,
                              layout=layout, q_offset=q_offset, block=block)
    q_offset = _checked_offset(q, k, v, q_offset)
    B, Hq, Tq, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    g = Hq // Hk
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    qr, kr = q, k
    if inv_freq is not None:
        qi = torch.arange(q_offset, q_offset + Tq, device=q.device, dtype=torch.float64)
        qr = rotate(q, qi, inv_freq, attention_scaling, layout).to(q.dtype)
        kr = rotate(k, torch.arange(Tk, device=k.device, dtype=torch.float64), inv_freq, attention_scaling,
                    layout).to(k.dtype)
    qr = qr.reshape(B, Hk, g, Tq, D)   # (a view where it can: the rows of one key head's group, stacked below)
    out = torch.empty(B, Hq, Tq, v.shape[-1], dtype=q.dtype, device=q.device)
    masks: dict = {}
    step = max(1, block // g)
    for a in range(0, Tq, step):
        b = min(Tq, a + step)
        first, last = q_offset + a, q_offset + b          # the block's queries (absolute), [first, last)
        k0 = max(0, first - window + 1)                   # its band of keys: [k0, last)
        shape = (b - a, first - k0, last - k0)            # the mask depends on these only: the same past the start
        if shape not in masks:
            masks[shape] = _band_mask(*shape, window, g, q.dtype, q.device)
        rows = qr[:, :, :, a:b].reshape(B, Hk, g * (b - a), D)
        o = _flash_band(rows, kr[:, :, k0:last], v[:, :, k0:last], masks[shape], scale)
        out[:, :, a:b] = o.view(B, Hk, g, b - a, -1).reshape(B, Hq, b - a, -1)
    return out


def band_in_one_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``band_attention`` runs its one-flash-call-per-block path on q, k, v ([B, H, T, D]): CPU tensors of
    float32, bf16 or fp16 with no gradient to track (torch's CPU flash kernel has no backward through our blocks)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)))


def _flash_band(q, k, v, mask, scale):
    """torch's CPU flash kernel on q [B, Hk, R, D] over one band k, v [B, Hk, S, D] with an additive mask [R, S]."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                      scale=scale)[0]


def _band_mask(rows: int, first: int, width: int, window: int, g: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """Additive mask [g * rows, width] (0 kept, -inf not) of a block whose query n sits at key index first + n of its
    band: keys first + n - window < j <= first + n; its rows repeated for the g query heads stacked per key head."""
    i = torch.arange(first, first + rows, device=device)[:, None]
    j = torch.arange(width, device=device)[None, :]
    keep = (j <= i) & (j > i - window)
    return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, float("-inf")).repeat(g, 1)
