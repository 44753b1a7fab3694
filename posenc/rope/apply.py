"""Rotary position embedding (RoPE): the math, in one place.

Each pair of dimensions of a query/key at position p is rotated by the angle p * inv_freq[j]:

    [x'_a]   [cos  -sin] [x_a]
    [x'_b] = [sin   cos] [x_b]          inv_freq[j] = base^(-2j/d)   (j = 0 .. d/2 - 1)

Layouts (same math up to a permutation of the head dimension, see ``interleaved_to_half_permutation``):
    "interleaved": pair j = (2j, 2j+1)       the lesson, GPT-J, Meta's original Llama, torchtune
    "half":        pair j = (j, j + d/2)     GPT-NeoX, Hugging Face ``rotate_half``, vLLM neox

Angles are computed in float64 and cos/sin tables kept in float32 for every activation dtype but float64 (which
gets float64 tables and math): bf16 cannot even hold position 257, and fp32 angles drift by ~pos * 6e-8 rad.

Call cost: the functional API keeps one cos/sin table per frequency set (``TABLES``) and the CPU kernel reads row
``position`` of it directly, range-checking positions itself; argument checks run once per frequency set, so a
decode step costs little more than the kernel call (docs/performance.md). The frequencies live in
posenc.rope.frequencies, the tables in posenc.rope.tables, the decode fast path in posenc.rope.fast_path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc._internal.validate import check_bool, check_float, even_int
from posenc.angles import Angles, angles_cos_sin
from posenc._internal.errors import PosencError
from posenc.kernels.rope_args import LAYOUTS, check_table, index_error  # noqa: F401 (LAYOUTS re-exported)
from posenc.kernels.rope_args import check_broadcast as _check_broadcast, check_layout as _check_layout
from posenc.kernels.rope_args import check_out as _check_out, check_qk, check_rotary_dim as _check_rotary_dim
from posenc.kernels.rope_args import check_x as _check_x
from posenc.positions import FLOAT_POSITIONS, INT_DTYPES, as_positions, check_position_dtype  # noqa: F401 (re-exported)
from posenc.rope.fast_path import call_mode, known_call, remember, run_known
# the frequencies' public names are re-exported here, where users import them (posenc.rope.apply.default_inv_freq)
from posenc.rope.frequencies import base_powers, checked_inv_freq, default_inv_freq, math_dtype  # noqa: F401
from posenc.rope.frequencies import rope_cos_sin  # noqa: F401 (re-exported)
from posenc.rope.tables import TABLES, RopeTableCache, table_for  # noqa: F401 (RopeTableCache re-exported)

# devices whose RoPE kernel computes cos/sin itself from an Angles (the Triton kernel); tests add "cpu" to run that
# route through triton's interpreter
KERNEL_ANGLE_DEVICES = frozenset({"cuda"})


_PLAIN_NUMBERS = (float, int)
_Tensor = torch.Tensor
_dynamo_compiling = torch.compiler.is_dynamo_compiling    # False in eager; torch.compile folds it to True


def _low_base(base) -> None:
    """The warning for a base <= 1 (posenc.rope.config.check_theta owns it)."""
    from posenc.rope.config import check_theta

    check_theta(base, "base")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int) -> torch.Tensor:
    """The readable eager formula: rotate the first ``rotary_dim`` dims of x [..., seq, dim].

    cos, sin: [..., seq, rotary_dim // 2] in the math dtype, broadcastable against x's leading dims.
    """
    xr = x[..., :rotary_dim].to(cos.dtype)
    if layout == "interleaved":
        a, b = xr[..., 0::2], xr[..., 1::2]
    else:
        a, b = xr[..., : rotary_dim // 2], xr[..., rotary_dim // 2:]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    rot = torch.stack((ra, rb), dim=-1).flatten(-2) if layout == "interleaved" else torch.cat((ra, rb), dim=-1)
    rot = rot.to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return rot
    return torch.cat((rot, x[..., rotary_dim:]), dim=-1)


def _rotate_fast(xs: Sequence[torch.Tensor], cos, sin: torch.Tensor | None, layout: str, rotary_dim: int,
                 inplace: bool, outs: list[torch.Tensor] | None, names: Sequence[str],
                 index: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Rotate each of xs with one table through posenc.kernels (C on CPU, Triton on CUDA, autograd included).

    cos, sin: the table; or cos a posenc.angles.Angles (constant frequencies) and sin None.

    Differentiable frequencies (cos/sin requiring grad, e.g. a learned inv_freq) take the readable ``_rotate``,
    which autograd differentiates through the table too.
    """
    rope = _kernel_rope()
    if sin is None or not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)):
        out_names = None if outs is None else (("out",) if len(xs) == 1 else tuple(f"out[{i}]" for i in
                                                                                  range(len(xs))))
        return rope(xs, cos, sin, layout=layout, rotary_dim=rotary_dim, inplace=inplace, out=outs, index=index,
                    names=names, out_names=out_names)
    if inplace or outs is not None:
        raise PosencError("inplace=True and out= cannot be used while autograd tracks the frequencies "
                          "(inv_freq requires grad); call without them or under torch.no_grad()")
    if index is not None:
        from posenc.kernels.cpu_rope import gather_table
        cos, sin = gather_table(cos, sin, index)
    return tuple(_rotate(x, cos, sin, layout, rotary_dim) for x in xs)


def _apply(xs: Sequence[torch.Tensor], positions, base, inv_freq, layout: str, rotary_dim, attention_scaling,
           inplace: bool, out, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """The shared body of apply_rope / apply_rope_qk (xs already checked as float tensors of one dtype/device).

    The decode hot path: a handful of attribute reads, one dict lookup for the table, one kernel call.
    Under torch.compile / torch.export: cos/sin computed in the graph, then posenc's custom ops (kernels.ops)."""
    if _kernel_ops().under_trace(xs[0]):
        return _apply_traced(xs, positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out,
                             names)
    if layout not in LAYOUTS:
        _check_layout(layout)
    if inplace is not False and inplace is not True:
        check_bool(inplace, "inplace")
    x = xs[0]
    device = x.device
    p = as_positions(positions, device)
    if p.dim() == 0:
        p = p.reshape(1)
    ps = p.shape
    for t in xs:
        _check_broadcast(ps, t, "positions")
    outs = None if out is None else _check_out(out, xs, inplace, "out")
    dim = int(x.shape[-1])     # (an int: under torch.jit.trace sizes come back as 0-d tensors)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if isinstance(inv_freq, torch.Tensor) and inv_freq.requires_grad and torch.is_grad_enabled():
        return _apply_learned(xs, p, inv_freq, layout, rotary_dim, attention_scaling, inplace, outs, names, dtype)
    entry = table_for(base, inv_freq, rotary_dim, attention_scaling, dim, device, dtype)
    rdim = entry.rotary_dim
    if rdim > dim:
        _check_rotary_dim(rdim, dim)
    if x.device.type in KERNEL_ANGLE_DEVICES and not (p.requires_grad and torch.is_grad_enabled()):
        # the kernel computes cos/sin itself (from a float64 angle): no table, one launch. (Positions that
        # require grad take a table, which autograd differentiates.)
        return _rotate_fast(xs, Angles(p, entry.inv64, entry.scaling, entry.packed()), None, layout, rdim,
                            inplace, outs, names)
    if p.dtype in INT_DTYPES and x.is_cpu:
        index = p if p.dtype == torch.int64 and p.is_contiguous() else p.to(torch.int64).contiguous()
        table = entry.cos_sin
        if table is not None:
            try:
                return _kernel_rope()(xs, table[0], table[1], layout=layout, rotary_dim=rdim, inplace=inplace,
                                      out=outs, index=index, names=names)
            except _table_index_error():
                pass            # a position past the table (or negative): grow below, or compute directly
        if index.numel():
            lo, hi = int(index.min()), int(index.max())
            if lo >= 0 and TABLES.grow(entry, hi + 1):
                table = entry.cos_sin
                return _kernel_rope()(xs, table[0], table[1], layout=layout, rotary_dim=rdim, inplace=inplace,
                                      out=outs, index=index, names=names)
    cos, sin = angles_cos_sin(p, entry.inv64, entry.scaling, dtype)
    return _rotate_fast(xs, cos, sin, layout, rdim, inplace, outs, names)


def _apply_traced(xs, positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out, names):
    """``posenc.apply_rope`` / ``apply_rope_qk`` under a trace: cos/sin of the positions computed in the graph
    (float64 angles, rounded once to the math dtype, as posenc's tables are), then the ops. Arguments as there."""
    x = xs[0]
    _check_layout(layout)
    check_bool(inplace, "inplace")
    p = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
    p = check_position_dtype(p).to(x.device)
    if p.dim() == 0:
        p = p.reshape(1)
    for t in xs:
        _check_broadcast(p.shape, t, "positions")
    outs = None if out is None else _check_out(out, xs, inplace, "out")
    dim = x.shape[-1]
    dtype = math_dtype(x.dtype)
    scaling = check_float(attention_scaling, "attention_scaling", positive=True)
    if inv_freq is None:
        rdim = even_int(dim if rotary_dim is None else rotary_dim, "rotary_dim")
        inv = default_inv_freq(rdim, base).to(x.device)
    else:
        inv = torch.as_tensor(inv_freq, device=x.device)
        rdim = 2 * inv.shape[0] if rotary_dim is None else even_int(rotary_dim, "rotary_dim")
        if inv.dim() != 1 or inv.shape[0] != rdim // 2:
            raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rdim // 2}], got {tuple(inv.shape)}")
    _check_rotary_dim(rdim, dim)
    if inv.requires_grad and torch.is_grad_enabled():      # learned frequencies: the readable formula
        if inplace or outs is not None:
            raise PosencError("inplace=True and out= cannot be used while autograd tracks the frequencies "
                              "(inv_freq requires grad); call without them or under torch.no_grad()")
        angle = p.to(torch.float64).unsqueeze(-1) * inv.to(torch.float64)
        cos, sin = (angle.cos() * scaling).to(dtype), (angle.sin() * scaling).to(dtype)
        return tuple(_rotate(t, cos, sin, layout, rdim) for t in xs)
    cos, sin = angles_cos_sin(p, inv.to(torch.float64), scaling, dtype)
    return _kernel_ops().rope_traced(xs, cos, sin, layout=layout, rotary_dim=rdim, inplace=inplace, out=outs,
                                     names=names)


def _apply_learned(xs, p, inv_freq, layout, rotary_dim, attention_scaling, inplace, outs, names, dtype):
    """Learned frequencies (inv_freq requires grad): the readable formula, differentiated through the table too."""
    x = xs[0]
    check_float(attention_scaling, "attention_scaling", positive=True)
    inv = torch.as_tensor(inv_freq, device=x.device)
    rdim = _check_rotary_dim(2 * inv.shape[0] if rotary_dim is None else rotary_dim, x.shape[-1])
    if inv.shape != (rdim // 2,):
        raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rdim // 2}], got {tuple(inv.shape)}")
    checked_inv_freq(inv.detach(), x.device)
    angle = p.to(torch.float64).unsqueeze(-1) * inv.to(torch.float64)
    cos, sin = (angle.cos() * attention_scaling).to(dtype), (angle.sin() * attention_scaling).to(dtype)
    return _rotate_fast(xs, cos, sin, layout, rdim, inplace, outs, names)


_lazy: dict = {}


def _kernel_rope():
    """posenc.kernels.rope_dispatch.rope, imported on first use (importing posenc builds nothing)."""
    fn = _lazy.get("rope")
    if fn is None:
        from posenc.kernels.rope_checks import TableIndexError
        from posenc.kernels.rope_dispatch import rope as fn
        _lazy.update(rope=fn, TableIndexError=TableIndexError)
    return fn


def _kernel_ops():
    """posenc.kernels.ops (the custom ops the traced route calls), imported on first use."""
    ops = _lazy.get("ops")
    if ops is None:
        from posenc.kernels import ops
        _lazy["ops"] = ops
    return ops



def _table_index_error():
    _kernel_rope()
    return _lazy["TableIndexError"]


def apply_rope(x: torch.Tensor, positions, *, base: float = 10000.0,
               inv_freq: torch.Tensor | Sequence[float] | None = None, layout: str = "interleaved",
               rotary_dim: int | None = None, attention_scaling: float = 1.0, inplace: bool = False,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x by RoPE at the given positions.

    Args:
        x: [..., seq, dim] queries or keys (any float dtype; math in float32, float64 for float64 x; output in x.dtype).
        positions: [seq] or broadcastable to x.shape[:-1] (e.g. [batch, 1, seq] for x [batch, heads, seq, dim]);
            integers (any offset: KV-cache continuation, packed sequences) or finite float32/float64 numbers.
            Broadcasting is torch's, aligned from the right: per-sequence positions for x [batch, heads, seq, dim]
            are [batch, 1, seq]; a [batch, seq] tensor would align with [heads, seq] (``Rotary`` reads [batch, seq]
            as per-sequence rows).
        base: RoPE theta, used when ``inv_freq`` is not given.
        inv_freq: [rotary_dim // 2] frequencies overriding base (scaled variants: see ``posenc.rope_parameters``).
        layout: "interleaved" (pairs 2j, 2j+1) or "half" (pairs j, j + rotary_dim/2).
        rotary_dim: rotate only the first rotary_dim dims (partial rotary); the rest pass through.
        attention_scaling: a positive number multiplying cos and sin (transformers' YaRN/LongRoPE convention).
        inplace: overwrite x (no output allocation). With autograd recording, x must not be a leaf that requires
            grad (as for torch's in-place ops).
        out: a preallocated tensor like x to write into (not while autograd records a tensor that requires grad).
    Returns:
        Tensor with x's shape and dtype (x itself if inplace, ``out`` if given).

    Runs the fused kernel for the device (posenc.kernels: C on CPU, Triton on CUDA): one pass over x, no
    temporaries the size of x, fp32 math for half-precision inputs; ``_rotate`` is the readable equivalent.
    On CPU the cos/sin of integer positions come from a cached table (``TABLES``), built once per frequency set;
    on CUDA the kernel computes them from a float64 angle (one launch, no table).
    Writes obey torch's rules: overlapping outputs are refused, version counters are bumped
    (posenc.kernels.rope_dispatch).
    """
    if base.__class__ in _PLAIN_NUMBERS and base <= 1 and inv_freq is None:
        _low_base(base)   # before the cached paths: every call site with such a base is told
    key = None
    if inv_freq is None and type(x) is _Tensor and type(positions) is _Tensor and not _dynamo_compiling():
        mode = call_mode(inplace, out, 1)
        if mode is not None:
            key, known = known_call(mode, (x,), positions, layout, base, rotary_dim, attention_scaling, out)
            if known is not None:
                rotated = run_known(known, mode, (x,), positions, out)
                if rotated is not None:
                    return rotated[0]
    _check_x(x, "x")
    rotated = _apply((x,), positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out, ("x",))[0]
    if key is not None:
        remember(key, (x,), positions, out, base, rotary_dim, attention_scaling, layout)
    return rotated


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor, positions, *, base: float = 10000.0,
                  inv_freq: torch.Tensor | Sequence[float] | None = None, layout: str = "interleaved",
                  rotary_dim: int | None = None, attention_scaling: float = 1.0, inplace: bool = False,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys at the same positions, sharing one cos/sin table and one kernel call.

    q: [..., Hq, seq, dim], k: [..., Hk, seq, dim] (Hk may differ from Hq: grouped-query attention).
    inplace: overwrite q and k (they must not share memory); out: (q_out, k_out) preallocated like q and k.
    Returns (q_rotated, k_rotated) in their input dtypes. Other arguments: see ``apply_rope``.
    """
    if base.__class__ in _PLAIN_NUMBERS and base <= 1 and inv_freq is None:
        _low_base(base)
    key = None
    if (inv_freq is None and type(q) is _Tensor and type(k) is _Tensor and type(positions) is _Tensor
            and not _dynamo_compiling()):
        mode = call_mode(inplace, out, 2)
        if mode is not None:
            key, known = known_call(mode, (q, k), positions, layout, base, rotary_dim, attention_scaling, out)
            if known is not None:
                rotated = run_known(known, mode, (q, k), positions, out)
                if rotated is not None:
                    return rotated
    _check_x(q, "q")
    _check_x(k, "k")
    qs, ks = q.shape, k.shape
    if qs[-1] != ks[-1] or qs[-2] != ks[-2]:
        raise PosencError(f"q and k must share seq and dim (the last two dims); got q {list(q.shape)}, "
                          f"k {list(k.shape)}")
    if q.dtype != k.dtype or q.device != k.device:
        raise PosencError(f"q and k must share a dtype and device, got q {q.dtype} {q.device}, k {k.dtype} {k.device}")
    q_rot, k_rot = _apply((q, k), positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out,
                          ("q", "k"))
    if key is not None:
        remember(key, (q, k), positions, out, base, rotary_dim, attention_scaling, layout)
    return q_rot, k_rot


def _apply_table(xs: Sequence[torch.Tensor], cos, sin, index, layout: str, rotary_dim, inplace: bool, out,
                 names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """The shared body of apply_rope_table / apply_rope_table_qk (xs already checked as float tensors)."""
    if layout not in LAYOUTS:
        _check_layout(layout)
    if inplace is not False and inplace is not True:
        check_bool(inplace, "inplace")
    rdim, cos, sin, idx = check_table(xs, cos, sin, index, rotary_dim)
    outs = None if out is None else _check_out(out, xs, inplace, "out")
    if idx is None:
        return _rotate_fast(xs, cos, sin, layout, rdim, inplace, outs, names)
    try:
        return _rotate_fast(xs, cos, sin, layout, rdim, inplace, outs, names, idx)
    except _table_index_error() as exc:
        raise index_error(cos.shape[0]) from exc


def apply_rope_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, index: torch.Tensor | None = None,
                     layout: str = "interleaved", rotary_dim: int | None = None, inplace: bool = False,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x with a precomputed cos/sin table (from ``rope_cos_sin`` or a multimodal/axial builder).

    x: [..., seq, dim]. Either cos, sin: [..., seq, rotary_dim // 2], broadcastable against x.shape[:-1] (e.g.
    [seq, R/2] or [batch, 1, seq, R/2]); or, with ``index`` (integers broadcastable against x.shape[:-1], such as
    positions [seq] or [batch, 1, seq]), cos, sin: a table [rows, rotary_dim // 2] of which vector i takes row
    index[i] (no gathered copy: the kernel reads the rows; an index outside [0, rows) raises TableIndexError before
    anything is written). The table is float32 (float64 for float64 x): its dtype is the math dtype.
    rotary_dim defaults to 2 * cos.shape[-1]; the dims past it pass through. Same kernels and rules as ``apply_rope``.
    """
    _check_x(x, "x")
    return _apply_table((x,), cos, sin, index, layout, rotary_dim, inplace, out, ("x",))[0]


def apply_rope_table_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                        index: torch.Tensor | None = None, layout: str = "interleaved", rotary_dim: int | None = None,
                        inplace: bool = False, out: tuple[torch.Tensor, torch.Tensor] | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rope_table`` on q [..., Hq, seq, dim] and k [..., Hk, seq, dim] with one table, in one kernel call."""
    _check_x(q, "q")
    _check_x(k, "k")
    check_qk(q, k)
    q_rot, k_rot = _apply_table((q, k), cos, sin, index, layout, rotary_dim, inplace, out, ("q", "k"))
    return q_rot, k_rot


def interleaved_to_half_permutation(dim: int) -> torch.Tensor:
    """Index ``perm`` with ``half_rope(x[..., perm]) == interleaved_rope(x)[..., perm]``.

    Half-layout slot j holds interleaved dim 2j, slot j + dim/2 holds 2j + 1.
    """
    even_int(dim, "dim")
    return torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))


def half_to_interleaved_permutation(dim: int) -> torch.Tensor:
    """The inverse of ``interleaved_to_half_permutation``: interleaved slot 2j <- half j, 2j+1 <- half j + dim/2."""
    return torch.argsort(interleaved_to_half_permutation(dim))


def permute_qk_weight(weight: torch.Tensor, n_heads: int, head_dim: int, to: str = "half",
                      rotary_dim: int | None = None) -> torch.Tensor:
    """Permute the output rows of a q or k projection so a checkpoint trained with one layout runs with the other.

    Args:
        weight: [n_heads * head_dim, in_features] (or a bias [n_heads * head_dim]); for k use the KV head count.
        to: "half" converts interleaved-trained weights for use with half-split RoPE (what Hugging Face's Llama
            conversion does); "interleaved" converts the other way.
        rotary_dim: only the first rotary_dim dims of each head are permuted (partial rotary).
    Returns:
        The permuted weight, same shape. q.k products are unchanged because q and k are permuted alike.
    """
    if to not in LAYOUTS:
        raise PosencError(f"to must be one of {LAYOUTS}, got {to!r}")
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    even_int(rotary_dim, "rotary_dim")
    if rotary_dim > head_dim:
        raise PosencError(f"rotary_dim must be <= head_dim={head_dim}, got {rotary_dim}")
    if weight.shape[0] != n_heads * head_dim:
        raise PosencError(f"weight's first dimension must be n_heads * head_dim = {n_heads * head_dim}, "
                          f"got {weight.shape[0]}")
    perm = (interleaved_to_half_permutation if to == "half" else half_to_interleaved_permutation)(rotary_dim)
    full = torch.cat((perm, torch.arange(rotary_dim, head_dim))).to(weight.device)
    w = weight.reshape(n_heads, head_dim, *weight.shape[1:])
    return w[:, full].reshape(weight.shape)
