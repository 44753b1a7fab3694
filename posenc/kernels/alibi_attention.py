"""ALiBi attention without the [heads, N, N] bias tensor.

The materialised path (``posenc.alibi_bias`` + SDPA) stores H * Tq * Tk floats: 4.3 GB at H=16, N=8192 in fp32.
Two backends here compute the same attention without it:

- ``"chunked"``: torch's fused SDPA kernel reading the bias as a strided *view* of one small [H, Tq + Tk - 1]
  template (see the note above ``bias_template``): no [H, Tq, Tk] tensor exists, extra memory is O(H * N + output).
  Bidirectional: one call. Causal on CPU, one of two schedules (both skip the keys above the diagonal):
  * blocks (``causal_blocks``): one SDPA call per block of CPU_BLOCK queries against the keys up to its last query;
  * split (``split_causal_attention``, long inputs without autograd): every block of SPLIT_OUTER queries is split
    into the keys all its queries see (one call, nothing masked) and its diagonal square (calls of SPLIT_INNER
    queries, batched over all blocks), merged exactly by their log-sum-exp.
  Before either, from BAND_MIN_QUERIES queries on, steep heads are banded (``posenc.kernels.alibi_band``): the keys
  far beyond a row's nearest one weigh under 1e-4 of the arithmetic's roundoff of that key's weight, a bound from
  the inputs' norms, so those heads attend to a band of keys in calls of their own; the others take the schedules.
  Elsewhere than CPU each block's bias is copied out, its size bounded by BIAS_BUDGET_ELEMENTS.
- ``"flex"``: ``torch.nn.attention.flex_attention`` (compiled) with a score_mod adding -m_h * |i - j| inside the
  kernel and a block mask that skips key blocks above the causal diagonal. The first call per shape compiles
  (tens of seconds on CPU).

``backend="auto"`` picks ``"flex"`` on CUDA when it compiles (falling back to ``"chunked"`` with a warning), and
``"chunked"`` on CPU: it has no compile cost and, measured in docs/performance-alibi.md, is faster there.

Positions: query i sits at absolute position i + q_offset (default Tk - Tq: queries are the last Tq of the Tk keys,
the KV-cache convention of flash-attn and ``posenc.alibi_bias``); key j at position j.
Under a causal mask the key-only form m_h * j gives the same softmax (shift invariance per row; tested), but its
values grow with N and lose fp32 precision near the diagonal at long N; both backends use the exact -m_h * |i - j|.
Why SDPA's own ``is_causal`` is not used: it masks by index (key column <= query row), while the bias view needs
exactly one of queries or keys in reverse order (below), which turns the visible triangle into the other one; in
natural order the bias would have to be materialised.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc._internal.errors import PosencError
from posenc.kernels import alibi_args, alibi_band
from posenc.kernels.alibi_view import hankel_view

BACKENDS = alibi_args.BACKENDS
MAX_POSITION = alibi_args.MAX_POSITION

# CPU schedules, chosen by measurement (docs/performance-alibi.md). Torch's fused CPU kernel tiles the queries of a
# call by 256 when it has >= 768 of them (by 64 from 192, else by 32) and the keys by 512; under is_causal it
# computes each 256-query tile against the keys up to its last query. CPU_BLOCK = 256 therefore wastes exactly what
# SDPA's own causal mask wastes (the triangle above the diagonal inside each tile).
CPU_BLOCK = 256
# The split schedule: off-diagonal calls of SPLIT_OUTER >= 768 queries get the kernel's 256-query tiles (each key
# tile is read once per 256 queries instead of once per 64: what limits long inputs), the diagonal is computed in
# calls of SPLIT_INNER queries. Used from SPLIT_MIN_QUERIES queries on, for float32/float64 without autograd (the
# log-sum-exp it merges with has no gradient in torch).
SPLIT_OUTER = 1024
SPLIT_INNER = 256
SPLIT_MIN_QUERIES = 4096

# Off CPU each block's bias is copied out: about this many elements (32 MiB of fp32) per block.
BIAS_BUDGET_ELEMENTS = 8 * 2**20
MIN_BLOCK = 16

# torch's fused CPU attention returning the log-sum-exp of each row (what F.scaled_dot_product_attention calls on
# CPU); the split schedule needs it to merge two partial softmaxes. Absent from a torch build: blocks are used.
_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor | None = None, *,
                    causal: bool = True, q_offset: int | None = None, scale: float | None = None,
                    block_size: int | None = None, backend: str = "auto") -> torch.Tensor:
    """softmax(q k^T * scale - m_h * |pos_i - j| [+ causal mask]) v, without building the full bias.

    q: [B, H, Tq, D]; k: [B, Hkv, Tk, D]; v: [B, Hkv, Tk, Dv] with H a multiple of Hkv (grouped-query attention:
    query head h reads key head h // (H // Hkv)). slopes: [H] finite numbers (default ``posenc.alibi_slopes(H)``).
    causal: query i sees keys j <= pos_i; otherwise all keys, with the symmetric distance |pos_i - j|.
    q_offset: absolute position of query 0 (default Tk - Tq). scale: default 1/sqrt(D).
    block_size: queries per SDPA call of the chunked backend (default: chosen per device and length, see
    ``default_block_size``; giving one also selects the block schedule on CPU).
    backend: "auto", "chunked" or "flex". Returns [B, H, Tq, Dv] in q's dtype.
    """
    args = alibi_args.checked_args(q, k, v, slopes, causal, q_offset, scale, block_size, backend)
    if torch.compiler.is_compiling():     # torch.compile / export: one custom op (below)
        return alibi_attention_op(q, k, v, *args)
    return _alibi_eager(q, k, v, *args)


def default_block_size(n_heads: int, q_len: int, k_len: int, device: torch.device | str = "cpu",
                       causal: bool = True) -> int:
    """Queries per SDPA call of the block schedule.

    CPU: the bias is a view, so blocks only serve to skip masked keys: CPU_BLOCK (256) queries when causal (the
    kernel's own causal granularity, see CPU_BLOCK), one call when bidirectional. Elsewhere each block's bias is
    copied out, so [n_heads, block, k_len] is kept near BIAS_BUDGET_ELEMENTS (H=16, N=8192: 64 queries, a 32 MiB
    block bias against the 4.3 GB full bias).
    """
    if torch.device(device).type == "cpu":
        block = CPU_BLOCK if causal else q_len
    else:
        block = max(MIN_BLOCK, BIAS_BUDGET_ELEMENTS // max(1, n_heads * k_len))
    return max(1, min(q_len, block))


# ----------------------------------------------------------------------------------------------- the bias view
#
# The bias of a block of queries is never written out. With the keys in reverse order, the bias of (query row r,
# reversed key c) depends on r + c only (a Hankel matrix), so it is a strided view (row stride 1, column stride 1)
# of one "template" row per head, [H, Tq + Tk - 1]. SDPA's fused CPU kernel reads that view in place. Attention
# does not care about key order, so reversing k and v (one copy each per call) is free of error. Reversing the
# queries instead works the same way (the output then comes out reversed): it is what a decoding step does, where
# the one new query is cheaper to reverse than the cache. A natural-order bias would be a Toeplitz matrix, whose
# view needs a negative stride, which torch does not allow.

def bias_template(slopes: torch.Tensor, q_len: int, k_len: int, offset: int, causal: bool,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[H, q_len + k_len - 1] in ``dtype``: entry t holds the bias at distance d = t - (k_len - 1 - offset).

    d = (query position) - (key position) runs from offset - (k_len - 1) (query 0, last key) to q_len - 1 + offset
    (last query, key 0). Bias: -m_h * |d| (bidirectional), or -m_h * d for d >= 0 and -inf for d < 0 (causal).
    Built in float64 (exact distances), rounded once to ``dtype`` (fp32; fp64 for fp64 inputs).
    """
    d = torch.arange(q_len + k_len - 1, device=slopes.device, dtype=torch.float64) - (k_len - 1 - offset)
    bias = -slopes.double().unsqueeze(1) * d.abs()
    if causal:
        bias.masked_fill_(d < 0, float("-inf"))
    return bias.to(dtype)


# Templates up to this many elements (16 MiB of fp32) are cached by value: every layer of a model calls with the same
# slopes and shapes, and building one is several small parallel ops, each a wait for the slowest thread on a busy CPU.
TEMPLATE_CACHE_ELEMENTS = 4 * 2**20


def cached_template(slopes: torch.Tensor, q_len: int, k_len: int, offset: int, causal: bool, dtype: torch.dtype,
                    reverse: bool = False) -> torch.Tensor:
    """``bias_template`` (flipped along the distance axis when ``reverse``), from a small cache keyed by the slopes'
    values. Slopes that require grad, and large templates, are built afresh (gradients reach learnable slopes)."""
    if slopes.requires_grad or slopes.numel() * (q_len + k_len) > TEMPLATE_CACHE_ELEMENTS:
        t = bias_template(slopes, q_len, k_len, offset, causal, dtype)
        return t.flip(1) if reverse else t
    return _template_cache(tuple(slopes.tolist()), q_len, k_len, offset, causal, dtype, str(slopes.device), reverse)


@lru_cache(maxsize=8)
def _template_cache(slopes: tuple, q_len, k_len, offset, causal, dtype, device, reverse) -> torch.Tensor:
    with torch.inference_mode(False):       # cached across calls: never an inference tensor (autograd saves it)
        t = bias_template(torch.tensor(slopes, dtype=torch.float32, device=device), q_len, k_len, offset, causal,
                          dtype)
        return t.flip(1) if reverse else t


def reversed_keys_bias(template: torch.Tensor, k_len: int, start: int, stop: int, visible: int) -> torch.Tensor:
    """View [1, H, stop - start, visible] of ``template``: the bias of queries start..stop-1 against keys
    visible-1, visible-2, ..., 0 (reversed; ``visible`` <= k_len). Overlapping strides, nothing is copied."""
    return hankel_view(template, start + k_len - visible, stop - start, visible)


# ----------------------------------------------------------------------------------------------- chunked

def _chunked(q, k, v, slopes, causal, offset, scale, block_size) -> torch.Tensor:
    if q.device.type != "cpu":
        block = block_size or default_block_size(q.shape[1], q.shape[2], k.shape[2], q.device, causal)
        return _device_blocks(q, k, v, slopes, causal, offset, scale, block)
    if causal:
        # keys after the last query's position are never seen
        keep = min(k.shape[2], q.shape[2] + offset)
        k, v = k[:, :, :keep], v[:, :, :keep]
    if block_size is None and q.shape[2] >= alibi_band.BAND_MIN_QUERIES:
        windows = alibi_band.band_windows(q, k, slopes, scale if scale is not None else q.shape[-1] ** -0.5)
        banded = alibi_band.banded_heads(windows, k.shape[2])
        if banded:
            return _with_bands(q, k, v, slopes, causal, offset, scale, windows, banded)
    return _cpu_schedule(q, k, v, slopes, causal, offset, scale, block_size)


def _with_bands(q, k, v, slopes, causal, offset, scale, windows, banded) -> torch.Tensor:
    """CPU: the heads in ``banded`` over their bands (posenc.kernels.alibi_band), the others together through
    ``_cpu_schedule``. Returns [B, H, Tq, Dv]."""
    B, H, Tq, _ = q.shape
    group = H // k.shape[1]
    out = q.new_empty(B, H, Tq, v.shape[-1])
    is_banded = set(banded)
    wide = [h for h in range(H) if h not in is_banded]
    if wide:
        qs, ks, vs, ss = _head_subset(q, k, v, slopes, wide)
        part = _cpu_schedule(qs, ks, vs, ss, causal, offset, scale, None)
        if wide == list(range(wide[0], wide[-1] + 1)):
            out[:, wide[0]:wide[-1] + 1] = part
        else:
            out[:, wide] = part
    template = cached_template(slopes, Tq, k.shape[2], offset, causal, _template_dtype(q))
    for kv_head in sorted({h // group for h in banded}):
        # one key head reversed at a time: the copy is 1/Hkv of k and v
        k_rev, v_rev = k[:, kv_head:kv_head + 1].flip(2), v[:, kv_head:kv_head + 1].flip(2)
        for h in banded:
            if h // group == kv_head:
                alibi_band.banded_head(out, q, k_rev, v_rev, template, h, 0, windows[h], causal=causal,
                                       offset=offset, scale=scale)
    return out


def _head_subset(q, k, v, slopes, heads: list[int]):
    """(q, k, v, slopes) of the query heads ``heads`` only: views where they are one run of whole key-head groups,
    else copies (each query head then gets its own copy of its key head)."""
    group = q.shape[1] // k.shape[1]
    a, b = heads[0], heads[-1] + 1
    if heads == list(range(a, b)) and a % group == 0 and b % group == 0:
        return q[:, a:b], k[:, a // group:b // group], v[:, a // group:b // group], slopes[a:b]
    index = torch.tensor(heads, device=q.device)
    kv_index = torch.div(index, group, rounding_mode="floor")
    return (q.index_select(1, index), k.index_select(1, kv_index), v.index_select(1, kv_index),
            slopes.index_select(0, index))


def _cpu_schedule(q, k, v, slopes, causal, offset, scale, block_size) -> torch.Tensor:
    """CPU, every head alike: the split schedule for long causal inputs without autograd, else blocks."""
    if causal and block_size is None and _split_applies(q, k, v, offset):
        return split_causal_attention(q, k, v, slopes, offset=offset, scale=scale, outer=SPLIT_OUTER,
                                      inner=SPLIT_INNER)
    if block_size is None and v.shape[-1] != q.shape[-1]:
        # the fused kernel needs Dv = D; torch's fallback writes out [B, H, block, Tk] scores: keep them bounded
        block_size = max(MIN_BLOCK, BIAS_BUDGET_ELEMENTS // max(1, q.shape[0] * q.shape[1] * k.shape[2]))
    block = block_size or default_block_size(q.shape[1], q.shape[2], k.shape[2], "cpu", causal)
    return causal_blocks(q, k, v, slopes, causal=causal, offset=offset, scale=scale, block=block)


def _split_applies(q, k, v, offset) -> bool:
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (_flash_cpu is not None and not needs_grad and q.dtype in (torch.float32, torch.float64)
            and q.shape[2] >= SPLIT_MIN_QUERIES and k.shape[2] == q.shape[2] + offset
            and v.shape[-1] == q.shape[-1])


def _template_dtype(q: torch.Tensor) -> torch.dtype:
    # fp64 inputs get an fp64 bias; others fp32, which SDPA on CPU adds in its fp32 accumulator
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def causal_blocks(q, k, v, slopes, *, causal: bool, offset: int, scale: float | None, block: int) -> torch.Tensor:
    """CPU: SDPA over blocks of ``block`` queries (one call when bidirectional or block >= Tq), each against the keys
    it can see, the bias a view of one template. Reverses whichever of q or (k, v) is smaller. Differentiable.

    q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D/Dv]; slopes: [H]; offset: position of query 0. Returns [B, H, Tq, Dv].
    """
    B, H, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    # reverse the side that is cheaper to copy: q (Tq * H rows, block by block; the blocks' outputs are put back in
    # order by the copy into the output that every block makes anyway) or k and v (Tk * Hkv rows each); on a tie q
    reverse_q = Tq * H <= Tk * Hkv
    # row r reversed is query Tq-1-r: the bias of (row r, key c) is then template[L-1-(r+c)], the template flipped
    template = cached_template(slopes, Tq, Tk, offset, causal, _template_dtype(q), reverse=reverse_q)
    if not reverse_q:
        k_rev, v_rev = k.flip(2), v.flip(2)
    gqa = H != Hkv
    out = None
    for s in range(0, Tq, block):
        e = min(s + block, Tq)
        if reverse_q:   # rows s..e-1 (reversed) are queries Tq-1-s down to Tq-e: keys 0..Tq-1-s+offset, in order;
            # each block reverses its own queries: no reversed copy of all of q is ever held
            kv = min(Tk, Tq - s + offset) if causal else Tk
            qs, ks, vs, first = q[:, :, Tq - e:Tq - s].flip(2), k[:, :, :kv], v[:, :, :kv], s
        else:           # queries s..e-1 against keys kv-1..0
            kv = min(Tk, e + offset) if causal else Tk
            qs, ks, vs, first = q[:, :, s:e], k_rev[:, :, Tk - kv:], v_rev[:, :, Tk - kv:], s + Tk - kv
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=hankel_view(template, first, e - s, kv),
                                           scale=scale, enable_gqa=gqa)
        if e - s == Tq:
            if not reverse_q:
                return o
            del qs   # the reversed copy goes before the output is turned around (peak: two outputs, not three)
            return o.flip(2)
        if out is None:   # one output filled block by block: measured as fast as one concatenation of a list of
            out = o.new_empty(B, H, Tq, o.shape[-1])   # blocks, at a third of its peak memory (9 vs 24 MB, S=2048)
        if reverse_q and o.requires_grad:   # out= has no autograd: flip, then copy
            out[:, :, Tq - e:Tq - s] = o.flip(2)
        elif reverse_q:   # rows of queries Tq-1-s .. Tq-e, written back in order in the same copy
            torch.index_select(o, 2, torch.arange(e - s - 1, -1, -1, device=o.device), out=out[:, :, Tq - e:Tq - s])
        else:
            out[:, :, s:e] = o
    return out


def split_causal_attention(q, k, v, slopes, *, offset: int, scale: float | None, outer: int = SPLIT_OUTER,
                           inner: int = SPLIT_INNER) -> torch.Tensor:
    """CPU, causal, no autograd: the block schedule with the diagonal taken out of the long calls.

    q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D] with Tk = Tq + offset (queries are the last Tq positions).
    Queries go in blocks of ``outer`` (a ragged first block of Tq mod outer goes through ``causal_blocks``). Block
    [s, s + outer) sees keys [0, s + offset) completely: one SDPA call, nothing masked, keys reversed as in
    ``causal_blocks``. Its diagonal square, keys [s + offset, s + offset + outer), is the same problem for every
    block (the same bias), so it runs as ``outer // inner`` calls of ``inner`` queries each, batched over all blocks,
    the keys of each square reversed in place. The two partial softmaxes are merged exactly by their log-sum-exp:
    out = o_diag + sigmoid(lse_rect - lse_diag) * (o_rect - o_diag).
    """
    if _flash_cpu is None:
        raise PosencError("split_causal_attention needs torch's fused CPU attention "
                          "(aten._scaled_dot_product_flash_attention_for_cpu); use causal_blocks")
    B, H, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if Tk != Tq + offset or outer % inner or Tq < outer or Dv != D:
        raise PosencError(f"split_causal_attention needs Tk = Tq + offset, Dv = D (torch's fused kernel) and outer "
                          f"({outer}) a multiple of inner ({inner}), at most Tq; got Tq={Tq}, Tk={Tk}, "
                          f"offset={offset}, D={D}, Dv={Dv}")
    n, head = divmod(Tq, outer)       # n full blocks after a ragged head of `head` queries
    out = q.new_empty(B, H, Tq, Dv)
    if head:
        out[:, :, :head] = causal_blocks(q[:, :, :head], k[:, :, :head + offset], v[:, :, :head + offset], slopes,
                                         causal=True, offset=offset, scale=scale, block=inner)
    template = cached_template(slopes, Tq, Tk, offset, True, _template_dtype(q))
    L = template.shape[1]

    # diagonal squares, all blocks at once: batch = block, heads = (batch, head) merged
    q = q if q.stride(-1) == 1 and (B == 1 or q.stride(0) == H * q.stride(1)) else q.contiguous()
    sH, sM = q.stride(1), q.stride(2)
    kd, vd = (t[:, :, head + offset:].unflatten(2, (n, outer)).flip(3).contiguous()      # [B, Hkv, n, outer, *]
              for t in (k, v))
    tb = template.repeat(B, 1) if B > 1 else template                                 # [B*H, L]
    lse_diag = torch.empty(n, B * H, outer, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    for u in range(outer // inner):
        kv = (u + 1) * inner  # rows u*inner.. of each square see its first kv keys: the last kv of the reversed
        rows = head + u * inner
        qu = q.as_strided((n, B * H, inner, D), (outer * sM, sH, sM, 1), q.storage_offset() + rows * sM)
        ku, vu = (t.as_strided((n, B * Hkv, kv, t.shape[-1]), (outer * t.shape[-1], n * outer * t.shape[-1],
                                                                 t.shape[-1], 1),
                                t.storage_offset() + (outer - kv) * t.shape[-1])
                  for t in (kd, vd))
        # row r, reversed key c: distance r + c + 1 - inner, template index r + c + Tq - inner
        mask = tb.as_strided((1, B * H, inner, kv), (0, L, 1, 1), tb.storage_offset() + Tq - inner)
        o, lse = _flash_cpu(qu, ku, vu, 0.0, False, attn_mask=mask, scale=scale)
        out.as_strided((n, B * H, inner, Dv), (outer * Dv, Tq * Dv, Dv, 1), rows * Dv).copy_(o)
        lse_diag[:, :, u * inner:(u + 1) * inner] = lse
    del kd, vd

    # the rest of each block's keys: [0, s + offset), all visible
    k_rev, v_rev = k.flip(2), v.flip(2)
    for t in range(n):
        s = head + t * outer
        kv = s + offset
        if kv == 0:
            continue
        o, lse = _flash_cpu(q[:, :, s:s + outer], k_rev[:, :, Tk - kv:], v_rev[:, :, Tk - kv:], 0.0, False,
                            attn_mask=hankel_view(template, s + Tk - kv, outer, kv), scale=scale)
        weight = torch.sigmoid(lse - lse_diag[t].view(B, H, outer))
        out[:, :, s:s + outer].lerp_(o, weight.unsqueeze(-1))
    return out


def _device_blocks(q, k, v, slopes, causal, offset, scale, block) -> torch.Tensor:
    """Not CPU: the same blocks and reversed keys, each block's bias copied out contiguous in q's dtype."""
    Tq, Tk = q.shape[2], k.shape[2]
    template = bias_template(slopes, Tq, Tk, offset, causal, q.dtype)
    k_rev, v_rev = k.flip(2), v.flip(2)
    outs = []
    for s in range(0, Tq, block):
        e = min(s + block, Tq)
        kv = min(Tk, e + offset) if causal else Tk
        bias = reversed_keys_bias(template, Tk, s, e, kv).contiguous()
        outs.append(F.scaled_dot_product_attention(q[:, :, s:e], k_rev[:, :, Tk - kv:], v_rev[:, :, Tk - kv:],
                                                   attn_mask=bias, scale=scale, enable_gqa=q.shape[1] != k.shape[1]))
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


def _flex(q, k, v, slopes, causal, offset, scale, compiled=None) -> torch.Tensor:
    """FlexAttention with the ALiBi score_mod; ``compiled``: another compiled flex_attention (benchmarks)."""
    if not flex_available():
        raise PosencError("backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); "
                          "use backend='chunked'")
    Tq, Tk = q.shape[2], k.shape[2]
    # the offset enters as a tensor, not a Python int that dynamo would bake into the kernel and recompile for
    off = torch.tensor(offset, device=q.device, dtype=torch.int64)

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx + off - kv_idx).abs()

    block_mask = causal_block_mask(Tq, Tk, offset, str(q.device)) if causal else None
    fn = compiled or _flex_attention_fn(q.device.type)
    # Past torch._dynamo.config.recompile_limit compiled shapes, dynamo would silently run flex_attention unfused,
    # which builds the [B, H, Tq, Tk] scores: exactly the N^2 memory this module exists to avoid (seen on CPU at
    # the 9th shape). Make that an error instead; alibi_attention turns it into the chunked path or a PosencError.
    flag, limit_hit = _recompile_limit_guard()
    try:
        with torch._dynamo.config.patch(**{flag: True}):
            return fn(q, k, v, score_mod=alibi_score, block_mask=block_mask, scale=scale,
                      enable_gqa=q.shape[1] != k.shape[1])
    except limit_hit as err:
        raise FlexRecompileLimit(
            "backend='flex': torch.compile has compiled flex_attention for as many shapes as "
            "torch._dynamo.config.recompile_limit allows and would now run it unfused, building the full "
            "[batch, heads, Tq, Tk] scores; use backend='chunked' (or 'auto'), or raise that limit") from err


def _recompile_limit_guard() -> tuple[str, type]:
    """(dynamo config flag that makes hitting the recompile limit an error, the error) across torch versions
    (torch 2.5 named them after the 'cache' limit)."""
    import torch._dynamo
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        return "fail_on_recompile_limit_hit", torch._dynamo.exc.FailOnRecompileLimitHit
    return "fail_on_cache_limit_hit", torch._dynamo.exc.FailOnCacheLimitHit


class FlexRecompileLimit(PosencError):
    """FlexAttention would fall back to its unfused (N^2 memory) form: too many compiled shapes."""


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


def _warn_fallback(err: Exception) -> None:
    warnings.warn(f"flex_attention failed ({err}); using the chunked ALiBi path", RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------------------------- the custom op
#
# Under torch.compile / torch.export ``alibi_attention`` is one op, ``posenc::alibi_attention`` (posenc.kernels.ops
# holds RoPE's): a fake implementation (the output shape, contiguous), the schedules above as its CPU and CUDA
# implementations, and autograd through ``posenc::alibi_attention_backward``, which recomputes the forward under
# autograd (SDPA's own backward; no attention weights kept between the passes). Both ops apply
# ``alibi_attention``'s argument checks (posenc.kernels.alibi_args) when they run, and their fakes the shape checks.

def _alibi_eager(q, k, v, slopes, causal, q_offset, scale, block_size, backend):
    """alibi_attention's eager body on checked arguments (the op's implementation and its recompute)."""
    if backend == "flex" or (backend == "auto" and _auto_backend(q) == "flex"):
        try:
            return _flex(q, k, v, slopes, causal, q_offset, scale)
        except Exception as err:  # noqa: BLE001 - auto falls back whatever broke inside the compiler
            if backend == "flex":
                raise
            _warn_fallback(err)   # (chunked never builds the N^2 bias either)
    return _chunked(q, k, v, slopes, causal, q_offset, scale, block_size)


@torch.library.custom_op("posenc::alibi_attention", mutates_args=())
def alibi_attention_op(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, causal: bool, q_offset: int,
                    scale: Optional[float], block_size: Optional[int], backend: str) -> Tensor:
    """posenc.alibi_attention (its argument checks, then its schedules): [B, H, Tq, Dv], contiguous."""
    return _op_forward(q, k, v, slopes, causal, q_offset, scale, block_size, backend)


def _op_forward(q, k, v, slopes, causal, q_offset, scale, block_size, backend):
    args = alibi_args.checked_args(q, k, v, slopes, causal, q_offset, scale, block_size, backend)
    return _alibi_eager(q, k, v, *args).contiguous()


_recompute_pool: list = []


def _in_fresh_thread(fn):
    """fn() on a worker thread, whose thread-local state is torch's default: the dispatcher runs an op's
    implementation below the autograd keys, so autograd cannot record inside it on this thread."""
    if not _recompute_pool:
        import concurrent.futures
        _recompute_pool.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="posenc-alibi-bwd"))
    return _recompute_pool[0].submit(fn).result()


@torch.library.custom_op("posenc::alibi_attention_backward", mutates_args=())
def alibi_attention_backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, causal: bool,
                             q_offset: int, scale: Optional[float], block_size: Optional[int], backend: str,
                             needs: list[bool]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``alibi_attention`` for q, k, v and slopes (zeros where ``needs`` is False): the forward
    recomputed under autograd (SDPA's own backward), so no activations are kept between the passes."""
    given = (q, k, v, slopes)
    slopes, causal, q_offset, scale, block_size, backend = alibi_args.checked_backward_args(
        grad, q, k, v, slopes, causal, q_offset, scale, block_size, backend, needs)
    leaves = [t.detach().requires_grad_(bool(n)) for t, n in zip((q, k, v, slopes), needs)]
    wanted = [t for t in leaves if t.requires_grad]

    def recompute():
        with torch.enable_grad():
            out = _alibi_eager(*leaves, causal, q_offset, scale, block_size, backend)
            return torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ()
    got = iter(_in_fresh_thread(recompute))
    grads = []
    for t, orig in zip(leaves, given):
        g = next(got) if t.requires_grad else None
        g = torch.zeros_like(t, memory_format=torch.contiguous_format) if g is None else g.contiguous()
        grads.append(g.to(orig.dtype))      # (slopes given as another dtype than float32: in theirs)
    return tuple(grads)


@alibi_attention_op.register_fake
def _(q, k, v, slopes, causal, q_offset, scale, block_size, backend):
    alibi_args.checked_args(q, k, v, slopes, causal, q_offset, scale, block_size, backend, values=False)
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3])


@alibi_attention_backward_op.register_fake
def _(grad, q, k, v, slopes, causal, q_offset, scale, block_size, backend, needs):
    alibi_args.checked_backward_args(grad, q, k, v, slopes, causal, q_offset, scale, block_size, backend, needs,
                                     values=False)
    return tuple(t.new_empty(t.shape) for t in (q, k, v, slopes))


for _device in ("cpu", "cuda"):    # the chunked SDPA schedule on the CPU; FlexAttention (or chunked) on CUDA
    alibi_attention_op.register_kernel(_device)(_op_forward)


def _setup_alibi(ctx, inputs, output):
    q, k, v, slopes, causal, q_offset, scale, block_size, backend = inputs
    ctx.save_for_backward(q, k, v, slopes)
    ctx.spec = (causal, q_offset, scale, block_size, backend)


def _alibi_backward(ctx, grad):
    q, k, v, slopes = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:4])
    dq, dk, dv, ds = alibi_attention_backward_op(grad.contiguous(), q, k, v, slopes, *ctx.spec, needs)
    return (*(g if n else None for g, n in zip((dq, dk, dv, ds), needs)), None, None, None, None, None)


alibi_attention_op.register_autograd(_alibi_backward, setup_context=_setup_alibi)
