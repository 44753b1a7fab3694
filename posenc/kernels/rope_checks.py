"""The memory rules every RoPE write obeys, whatever the backend (C kernel, eager fallback, Triton): torch's own.

A kernel that writes through raw pointers bypasses the checks torch's in-place and ``out=`` ops make, so
posenc.kernels.rope_dispatch applies them here, before anything is written:

- a written tensor (``inplace=True``'s input, or an ``out=`` tensor) must not have two elements at one address
  (an expanded view): torch's "more than one element of the written-to tensor refers to a single memory location";
- a written tensor must not partially overlap an input: torch's "some elements of the input tensor and the
  written-to tensor refer to a single memory location". Exactly its own input's memory is fine (that is in place);
- a written tensor must not share memory with another input or another written tensor: with
  ``apply_rope_qk(q, q, inplace=True)`` the shared elements would be rotated twice;
- inference tensors are written only inside ``torch.inference_mode()``.

Stricter than torch in one corner: torch skips the overlap checks for views it cannot analyse cheaply ("too hard":
non-dense views such as ``x[..., :64]``) and then writes whatever falls out. Here such views are checked exactly:
two views of one geometry (q and k of a fused qkv buffer, even and odd columns) at any size by a branch and bound
over their strides, other pairs row by row (once per geometry) up to 2^22 rows, past which they are treated as
overlapping; a written view whose own elements may collide is refused.
The autograd rules (version counters, ``out=`` with tensors that require grad, leaves written in place) live in
posenc.kernels.rope_dispatch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from posenc._internal.errors import PosencError

_MAX_INTERVALS = 1 << 22     # rows enumerated by the exact overlap test; beyond it "may overlap" is assumed


class RopeAliasError(PosencError, RuntimeError):
    """A RoPE write that torch's rules forbid (overlapping memory, out= under autograd, a leaf written in place).

    A RuntimeError like torch's own error for the same write, and a PosencError like posenc's other faults."""


class TableIndexError(PosencError, IndexError):
    """A position outside the cos/sin table it indexes (raised before anything is written)."""


@functools.lru_cache(maxsize=1024)
def _layout(shape: tuple, stride: tuple) -> tuple[int, bool]:
    """(span in elements from the first to one past the last addressed, whether two elements may share an address).

    Non-overlap is proven by sorting the dims by stride: each stride must exceed everything the smaller ones reach.
    That holds for every dense tensor, every slice, transpose and split of one; a view failing it is treated as
    self-overlapping (expanded views, stride 0, always are)."""
    if 0 in shape:
        return 0, False
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    reach = 0
    overlaps = False
    for st, n in dims:
        if st <= reach:
            overlaps = True
        reach += st * (n - 1)
    return reach + 1, overlaps


def self_overlapping(t: torch.Tensor) -> bool:
    """True if two elements of ``t`` may share one address (an expanded view)."""
    return t.numel() > 1 and _layout(t.shape, t.stride())[1]


def _intervals(shape: tuple, stride: tuple, esize: int) -> torch.Tensor:
    """Byte intervals [start, end) covering t's elements as merged, sorted, disjoint rows: tensor [n, 2] int64."""
    if stride[-1] == 1:                                       # rows of contiguous head vectors
        lead, lead_st, length = shape[:-1], stride[:-1], shape[-1] * esize
    else:
        lead, lead_st, length = shape, stride, esize
    starts = torch.zeros(1, dtype=torch.int64)
    for n, st in zip(lead, lead_st):
        starts = (starts[:, None] + torch.arange(n, dtype=torch.int64) * (st * esize)).reshape(-1)
    starts = starts.sort().values
    ends = torch.cummax(starts + length, 0).values
    first = torch.ones_like(starts, dtype=torch.bool)
    first[1:] = starts[1:] >= ends[:-1]                       # a new merged interval starts here
    idx = first.nonzero().squeeze(1)
    last = torch.cat((idx[1:] - 1, torch.tensor([starts.numel() - 1])))
    return torch.stack((starts[idx], ends[last]), 1)


@functools.lru_cache(maxsize=256)
def _elements_overlap(delta: int, shape_a: tuple, stride_a: tuple, esize_a: int, shape_b: tuple, stride_b: tuple,
                      esize_b: int) -> bool:
    """Whether any byte of tensor a (at 0) is also a byte of tensor b (at ``delta`` bytes): exact, row by row.

    Translation-invariant, so cached by geometry: a model's layers hit the same entry every call. Two views of one
    geometry (q and k of a fused qkv buffer, even and odd columns) are decided exactly at any size
    (``_translate_overlap``); other pairs row by row, up to ``_MAX_INTERVALS`` rows."""
    if shape_a == shape_b and stride_a == stride_b and esize_a == esize_b and not _layout(shape_a, stride_a)[1]:
        return _translate_overlap(delta, shape_a, stride_a, esize_a)
    count = max(_numel(shape_a[:-1] if stride_a[-1] == 1 else shape_a),
                _numel(shape_b[:-1] if stride_b[-1] == 1 else shape_b))
    if count > _MAX_INTERVALS:
        return True                                           # too many rows to enumerate: assume they may
    a = _intervals(shape_a, stride_a, esize_a)
    b = _intervals(shape_b, stride_b, esize_b) + delta
    i = torch.searchsorted(a[:, 0].contiguous(), b[:, 0].contiguous(), right=True) - 1   # a interval starting at/before
    before = (i >= 0) & (a[i.clamp(min=0), 1] > b[:, 0])
    nxt = i + 1
    after = (nxt < a.shape[0]) & (a[nxt.clamp(max=a.shape[0] - 1), 0] < b[:, 1])
    return bool((before | after).any())


def _translate_overlap(delta: int, shape: tuple, stride: tuple, esize: int) -> bool:
    """Whether a tensor's elements and the same elements shifted by ``delta`` bytes share a byte: is there an index
    difference k (|k_d| < n_d) with |sum k_d * stride_d * esize - delta| < esize? Exact branch and bound over the
    dims by decreasing stride: what the smaller dims can still add is at most their reach, which (a layout without
    self-overlap) is below the current stride, so each dim leaves at most a few candidate digits."""
    dims = sorted(((st * esize, n) for n, st in zip(shape, stride) if n > 1), reverse=True)
    reach = [0] * (len(dims) + 1)                 # reach[i]: the most dims i.. can add, in bytes
    for i in range(len(dims) - 1, -1, -1):
        reach[i] = reach[i + 1] + dims[i][0] * (dims[i][1] - 1)

    def search(i: int, rest: int) -> bool:
        slack = reach[i] + esize - 1              # |rest| must end below esize after the remaining dims
        if abs(rest) > slack:
            return False
        if i == len(dims):
            return abs(rest) < esize
        st, n = dims[i]
        low = max(-(n - 1), -((-(rest - reach[i + 1] - esize + 1)) // st))     # ceil
        high = min(n - 1, (rest + reach[i + 1] + esize - 1) // st)
        return any(search(i + 1, rest - k * st) for k in range(low, high + 1))

    return search(0, delta)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def overlap(a: torch.Tensor, b: torch.Tensor) -> str:
    """'none' (no shared byte), 'same' (the same elements: one pointer, shape, strides and dtype) or 'partial'."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return "none"
    pa, pb, ea, eb = a.data_ptr(), b.data_ptr(), a.element_size(), b.element_size()
    sa, sb = a.shape, b.shape
    ta, tb = a.stride(), b.stride()
    if pa + _layout(sa, ta)[0] * ea <= pb or pb + _layout(sb, tb)[0] * eb <= pa:
        return "none"                                          # disjoint byte ranges: the common case
    if pa == pb and sa == sb and ta == tb and a.dtype == b.dtype:
        return "same"
    return "partial" if _elements_overlap(pb - pa, sa, ta, ea, sb, tb, eb) else "none"


def _span(t: torch.Tensor) -> tuple[int, int, bool]:
    """(first byte, one past the last byte, may self-overlap) of t's elements."""
    start = t.data_ptr()
    if t.is_contiguous():                     # the common case, without touching shape or strides
        return start, start + t.numel() * t.element_size(), False
    n, overlaps = _layout(t.shape, t.stride())
    return start, start + n * t.element_size(), overlaps


def separate(*tensors: torch.Tensor) -> bool:
    """Whether these contiguous tensors occupy pairwise disjoint bytes and, outside ``torch.inference_mode()``,
    none is an inference tensor (conservative: only written ones matter): then ``check_writes`` accepts any write
    among them, so a fast path may skip it. False means "not shown here": take the path that calls
    ``check_writes`` (which names the fault)."""
    spans = []
    for t in tensors:
        start = t.data_ptr()
        spans.append((start, start + t.nbytes))
        if t.is_inference() and not torch.is_inference_mode_enabled():
            return False
    spans.sort()
    for i in range(1, len(spans)):
        if spans[i][0] < spans[i - 1][1]:
            return False
    return True


def check_writes(xs: Sequence[torch.Tensor], writes: Sequence[torch.Tensor], x_names: Sequence[str],
                 w_names: Sequence[str]) -> None:
    """Refuse, before anything is written, the writes torch refuses (see the module docstring).

    xs: the inputs read; writes: the tensors written (xs themselves for in place; then writes[i] is xs[i]).
    x_names / w_names name them in messages (e.g. ("q", "k") and ("out[0]", "out[1]")). The common case (separate
    buffers, or in place on separate tensors) costs a byte-range comparison per pair."""
    inplace = writes is xs
    if not inplace:
        inplace = True
        for w, x in zip(writes, xs):
            inplace = inplace and w is x
    x_spans = [_span(x) for x in xs]
    w_spans = x_spans if inplace else [_span(w) for w in writes]
    ranges = sorted(x_spans if inplace else x_spans + w_spans)
    disjoint = True
    for i in range(1, len(ranges)):
        disjoint = disjoint and ranges[i][0] >= ranges[i - 1][1]
    for w, name, (_, _, overlaps) in zip(writes, w_names, w_spans):
        if w.is_inference() and not torch.is_inference_mode_enabled():
            raise RopeAliasError(f"{name} is an inference tensor: writing it (in place or as out=) is only "
                                 "allowed inside torch.inference_mode(), as for torch's in-place ops")
        if overlaps and w.numel() > 1:
            raise RopeAliasError(
                f"unsupported operation: more than one element of {name} (the written-to tensor) refers to a single "
                "memory location (an expanded or overlapping view). Please clone() the tensor before performing "
                "the operation.")
    if disjoint:
        return                                 # separate buffers (or in place on separate tensors): nothing shared
    for i, (w, wname, (ws, we, _)) in enumerate(zip(writes, w_names, w_spans)):
        for j, (x, xname, (xs_, xe, _)) in enumerate(zip(xs, x_names, x_spans)):
            if we <= xs_ or xe <= ws or (i == j and inplace):
                continue                       # disjoint byte ranges (or the in-place tensor itself)
            kind = overlap(w, x)
            if kind == "none" or (i == j and kind == "same"):
                continue
            if inplace:
                raise RopeAliasError(
                    f"{wname} and {xname} share memory: with inplace=True their shared elements would be rotated "
                    "twice. Pass tensors that do not overlap (or clone() one), or call without inplace=True.")
            if i == j:
                raise RopeAliasError(
                    f"unsupported operation: some elements of the input tensor {xname} and the written-to tensor "
                    f"{wname} refer to a single memory location. Please clone() the tensor before performing the "
                    "operation.")
            raise RopeAliasError(
                f"{wname} shares memory with the input {xname}: writing it would change {xname} before it is "
                "rotated. Pass a separate output (or clone() the input).")
        if not inplace:
            for j in range(i + 1, len(writes)):
                vs, ve, _ = w_spans[j]
                if not (ve <= ws or we <= vs) and overlap(w, writes[j]) != "none":
                    raise RopeAliasError(f"{wname} and {w_names[j]} share memory: two results cannot be written "
                                         "to one place. Pass separate outputs.")
