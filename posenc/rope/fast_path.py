"""The decode fast path of ``apply_rope`` and ``apply_rope_qk`` (posenc.rope.apply).

A call of a geometry seen before (the key: the mode below, shapes, dtypes, arguments, thread count) that the general
path (posenc.rope.apply's ``_apply``) has already checked and sent to the C kernel with a cached table skips to the
kernel: everything the general path checks is a function of the key, the kernel range-checks the positions itself (a
position past the table returns None here, and the general path grows the table), and what depends on the call
itself (devices, strides, autograd, aliasing of the written tensors) is re-checked by ``run_known``, which leaves
anything unusual to the general path. Only CPU calls without autograd, on contiguous tensors with int64 positions,
are remembered (``remember``); the table is looked up in ``TABLES`` (posenc.rope.tables) on every call, so clearing
or evicting it takes effect at once. xs: (x,) for apply_rope, (q, k) for apply_rope_qk; out: a tensor or a pair.
The remembered calls live in the kernels' one plan cache (posenc.kernels.cpu_rope.PLANS), keyed ("apply", ...).
"""

from __future__ import annotations

import torch

from posenc.kernels.cpu_rope import PLANS
from posenc.kernels.rope_args import LAYOUTS
from posenc.rope.frequencies import math_dtype
from posenc.rope.tables import TABLES, default_table_key

_NEW, _INPLACE, _OUT = 0, 1, 2          # fresh outputs, inplace=True, out=
_PLANS = PLANS
_Tensor = torch.Tensor
_num_threads = torch.get_num_threads


def call_mode(inplace, out, n: int) -> int | None:
    """The call's mode (_NEW, _INPLACE, _OUT) for ``n`` rotated tensors, or None when the fast path cannot take it."""
    if out is None:
        return _NEW if inplace is False else _INPLACE if inplace is True else None
    if inplace is not False:
        return None
    if n == 1:
        return _OUT if type(out) is _Tensor else None
    if type(out) is tuple and len(out) == 2 and type(out[0]) is _Tensor and type(out[1]) is _Tensor:
        return _OUT
    return None


def known_call(mode, xs, p, layout, base, rotary_dim, attention_scaling, out):
    """(key, what remember recorded for it or None); (None, None) for an unhashable argument (the general path
    names it)."""
    try:
        key = ("apply", mode, len(xs), *[x.shape for x in xs], p.shape, *[x.dtype for x in xs], p.dtype, layout, base,
               type(base), rotary_dim, type(rotary_dim), attention_scaling, type(attention_scaling), _num_threads())
        if mode == _OUT:
            key += (out.shape, out.dtype) if len(xs) == 1 else (out[0].shape, out[1].shape, out[0].dtype,
                                                               out[1].dtype)
        return key, _PLANS.recall(key)             # (plan, table key) or None
    except TypeError:
        return None, None


def _writes(mode, xs, out):
    """The tensors a call of this mode writes (their aliasing is re-checked per call), or None if the fast path
    cannot take them."""
    if mode == _OUT:
        outs = (out,) if len(xs) == 1 else out
        if not _lazy["cpu_rope"].plain_cpu(outs[0], outs[-1]) or not _kernel_checks().separate(*xs, *outs):
            return None
        return outs
    if mode == _INPLACE:
        return xs if _kernel_checks().separate(*xs) else None        # (also: no inference tensor outside)
    return ()


def run_known(known, mode, xs, p, out):
    """The remembered call ``known`` on these tensors: the rotated tensors (a tuple like xs), or None (the general
    path then runs)."""
    plan, table_key = known
    cpu = _lazy["cpu_rope"]
    q, k = xs[0], (xs[1] if len(xs) == 2 else None)
    if not cpu.plain_cpu(q, xs[-1], p):
        return None
    entry = TABLES.peek(table_key)
    table = None if entry is None else entry.cos_sin
    if table is None:
        return None
    if mode == _NEW:
        return cpu.run_fresh_qk(plan, q, k, table[0], table[1], p)
    writes = _writes(mode, xs, out)
    if writes is None or not cpu.run_qk(plan, q, k, writes[0], None if k is None else writes[1], table[0], table[1],
                                        p):
        return None
    torch.autograd.graph.increment_version(writes)      # as torch's own in-place and out= ops do
    return writes


def remember(key, xs, p, out, base, rotary_dim, attention_scaling, layout) -> None:
    """Record a call the general path has just completed, if the fast path can repeat it (see _PLANS)."""
    from posenc.kernels import cpu_rope

    _lazy["cpu_rope"] = cpu_rope
    q, k = xs[0], (xs[1] if len(xs) == 2 else None)
    if not (p.dtype == torch.int64 and p.dim() and p.numel() and all(x.numel() for x in xs)) \
            or not cpu_rope.plain_cpu(q, xs[-1], p):
        return
    if type(base) not in (int, float) or type(attention_scaling) not in (int, float) or layout not in LAYOUTS:
        return
    mode = key[1]
    if mode != _NEW and _writes(mode, xs, out) is None:
        return
    dtype = math_dtype(q.dtype)
    table_key = default_table_key(base, rotary_dim, attention_scaling, q.shape[-1], q.device, dtype)
    entry = TABLES.peek(table_key)
    table = None if entry is None else entry.cos_sin
    if table is None:
        return
    plan = cpu_rope.qk_plan(q, k, table[0], table[1], p, layout, entry.rotary_dim, inplace=mode == _INPLACE)
    if plan is None:
        return
    _PLANS.remember(key, plan, table_key)


_lazy: dict = {}


def _kernel_checks():
    """posenc.kernels.rope_checks, imported on first use."""
    checks = _lazy.get("checks")
    if checks is None:
        from posenc.kernels import rope_checks as checks
        _lazy["checks"] = checks
    return checks
