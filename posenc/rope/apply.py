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
decode step costs little more than the kernel call (docs/performance.md).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch

from posenc._validate import check_bool, check_float, even_int
from posenc.errors import PosencError
from posenc.kernels.cpu_rope import PLANS
from posenc.angles import Angles, angles_cos_sin, pack_frequencies
from posenc.kernels.rope_args import LAYOUTS, check_table, index_error  # noqa: F401 (LAYOUTS re-exported)
from posenc.kernels.rope_args import check_broadcast as _check_broadcast, check_layout as _check_layout
from posenc.kernels.rope_args import check_out as _check_out, check_qk, check_rotary_dim as _check_rotary_dim
from posenc.kernels.rope_args import check_x as _check_x
from posenc.positions import FLOAT_POSITIONS, INT_DTYPES, as_positions, check_position_dtype  # noqa: F401 (re-exported)

# devices whose RoPE kernel computes cos/sin itself from an Angles (the Triton kernel); tests add "cpu" to run that
# route through triton's interpreter
KERNEL_ANGLE_DEVICES = frozenset({"cuda"})


_PLAIN_NUMBERS = (float, int)


def _low_base(base) -> None:
    """The warning for a base <= 1 (posenc.rope.config.check_theta owns it)."""
    from posenc.rope.config import check_theta

    check_theta(base, "base")


def default_inv_freq(dim: int, base: float = 10000.0, device: torch.device | str | None = None) -> torch.Tensor:
    """inv_freq[j] = base^(-2j/dim) for j < dim/2, as float32 [dim // 2].

    Computed exactly as Hugging Face transformers does (float32 exponent and power), so scaled variants built
    on it match transformers bit for bit. Always computed on the CPU (as transformers does at model init), then
    moved to ``device``: CUDA's float32 pow can differ by 1-2 ulp, and one ulp of inv_freq times position 5000 is
    a 3e-4 rad angle error.
    """
    inv = 1.0 / base_powers(dim, base)
    return inv if device is None else inv.to(device)


def base_powers(dim: int, base: float = 10000.0, pairs: int | None = None) -> torch.Tensor:
    """base^(2j/dim) for j < pairs (default dim/2), float32 [pairs], on the CPU: plain RoPE's wavelengths / (2 pi).

    The one owner of transformers' float32 exponent and power. The scaled types divide 1 by a product with it, in
    transformers' order (YaRN 1 / (s * powers), LongRoPE 1 / (ext * powers)), so they match it bit for bit too.
    ``pairs`` computes only the first pairs (Gemma 4's proportional RoPE): the same length as transformers matters,
    since torch's vectorised pow can round an element differently from its scalar tail loop.
    """
    even_int(dim, "dim")
    # (no warning for a base <= 1 here: the callers that take a base from the user warn -- apply_rope,
    # apply_rope_qk, rope_parameters' config reader -- so that one setting warns once)
    base = check_float(base, "base", positive=True)
    pairs = dim // 2 if pairs is None else pairs
    exponent = torch.arange(0, 2 * pairs, 2, dtype=torch.int64).to(torch.float32) / dim
    return base ** exponent


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions * inv_freq, each of shape [*positions.shape, len(inv_freq)] in ``dtype``.

    ``dtype`` is float32 (the table every activation dtype uses) or float64 (for float64 inputs).
    Both are multiplied by ``attention_scaling`` (transformers' convention: logits then scale by its square).
    The angle is formed in float64 so that large positions (1e5 and beyond) keep full precision.
    Non-finite positions, inv_freq or attention_scaling are refused (they would give NaN tables).
    """
    positions = check_position_dtype(as_positions(positions, None))
    attention_scaling = check_float(attention_scaling, "attention_scaling", positive=True)
    inv64 = _checked_inv_freq(inv_freq, positions.device)
    return angles_cos_sin(positions, inv64, attention_scaling, dtype)


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE's arithmetic runs in: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _checked_inv_freq(inv_freq, device) -> torch.Tensor:
    """inv_freq as a finite float64 1-D tensor on ``device`` (gradients kept), or a PosencError naming it."""
    try:
        inv = torch.as_tensor(inv_freq, device=device)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PosencError(f"inv_freq must be a 1-D tensor or sequence of numbers, got "
                          f"{type(inv_freq).__name__} ({exc})") from None
    if inv.dim() != 1 or not (inv.is_floating_point() or inv.dtype in INT_DTYPES):
        raise PosencError(f"inv_freq must be a 1-D real tensor [rotary_dim // 2], got shape {tuple(inv.shape)} "
                          f"dtype {inv.dtype}")
    if inv.device.type != "meta" and not bool(torch.isfinite(inv).all()):    # (meta tensors hold no values)
        raise PosencError("inv_freq must be finite, got NaN or inf (check the scaling factors it came from)")
    return inv.to(torch.float64)


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


# ---------------------------------------------------------------------------------------------------------------
# cos/sin tables: built once per frequency set in float64, stored in the math dtype, indexed by position
# ---------------------------------------------------------------------------------------------------------------

class _Table:
    """One frequency set's rows 0..rows-1 of cos/sin (CPU), or just its validated float64 frequencies (elsewhere)."""

    __slots__ = ("inv64", "scaling", "rotary_dim", "dtype", "cos_sin", "ref", "_packed")

    def __init__(self, inv64: torch.Tensor, scaling: float, dtype: torch.dtype, ref=None):
        self.inv64, self.scaling, self.dtype, self.ref = inv64, scaling, dtype, ref
        self.rotary_dim = 2 * inv64.shape[0]
        self.cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None   # swapped whole: readers see one pair
        self._packed: torch.Tensor | None = None

    def packed(self) -> torch.Tensor:
        """[R/2 + 1] float64 on the frequencies' device: inv_freq then the scaling (the GPU kernel's input)."""
        if self._packed is None:
            self._packed = pack_frequencies(self.inv64, self.scaling)
        return self._packed

    @property
    def rows(self) -> int:
        return 0 if self.cos_sin is None else self.cos_sin[0].shape[0]

    @property
    def nbytes(self) -> int:
        return 0 if self.cos_sin is None else 2 * self.cos_sin[0].numel() * self.cos_sin[0].element_size()


class RopeTableCache:
    """cos/sin tables for ``apply_rope`` / ``apply_rope_qk``, keyed by everything that changes their values.

    Key: the frequencies (``base`` and rotary_dim, or ``inv_freq``'s values: a CPU tensor or sequence by content, a
    tensor on another device by identity and version counter), ``attention_scaling``, the device and the math dtype.
    A table holds rows 0..n-1, built in float64 and stored in the math dtype; a position past it grows it (to at
    least twice the rows) by computing only the new rows, so earlier rows never change. Bounded: one table never
    exceeds ``max_table_bytes`` (positions past that are computed per call, uncached) and all tables together
    ``max_bytes`` / ``max_entries`` (least recently used dropped first). Tables are kept on CPU only: elsewhere the
    cos/sin of each call's positions are computed on the device (no host sync to learn the largest position); on
    CUDA inside the RoPE kernel itself, from the entry's float64 frequencies.
    """

    def __init__(self, max_bytes: int = 256 << 20, max_table_bytes: int = 128 << 20, max_entries: int = 32,
                 min_rows: int = 4096):
        self.max_bytes, self.max_table_bytes, self.max_entries, self.min_rows = (
            max_bytes, max_table_bytes, max_entries, min_rows)
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in list(self._entries.values()))

    def clear(self) -> None:
        """Drop every table (they are rebuilt on demand)."""
        with self._lock:
            self._entries.clear()

    def get(self, key, build) -> _Table:
        """The entry for ``key``, made by ``build()`` (which validates the frequencies) on a miss."""
        entries = self._entries
        entry = entries.get(key)
        if entry is not None and (entry.ref is None or entry.ref() is not None):
            try:
                entries.move_to_end(key)         # least recently used is evicted first
            except KeyError:                     # evicted by another thread meanwhile: still valid for this call
                pass
            return entry
        with torch.inference_mode(False):        # cached across calls: never an inference tensor (see grow)
            entry = build()
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._evict(entry)
        return entry

    def peek(self, key) -> _Table | None:
        """The entry for ``key`` if it is cached (marked recently used), else None: builds nothing."""
        entry = self._entries.get(key)
        if entry is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:                     # evicted by another thread meanwhile: still valid for this call
                pass
        return entry

    def max_rows(self, entry: _Table) -> int:
        return self.max_table_bytes // (entry.rotary_dim * torch.empty((), dtype=entry.dtype).element_size())

    def grow(self, entry: _Table, rows: int) -> bool:
        """Extend ``entry`` to at least ``rows`` rows (CPU); False if that would pass ``max_table_bytes``."""
        cap = self.max_rows(entry)
        if rows > cap:
            return False
        with self._lock:
            have = entry.rows
            if rows <= have:
                return True
            target = min(cap, max(rows, 2 * have, self.min_rows))
            # a table built inside torch.inference_mode() would be an inference tensor, which a later call with
            # autograd cannot save for backward: cached tensors are always made as ordinary ones
            with torch.inference_mode(False):
                cos, sin = angles_cos_sin(torch.arange(have, target), entry.inv64, entry.scaling, entry.dtype)
                if have:      # only the new rows are computed: the old ones stay bit for bit
                    cos, sin = torch.cat((entry.cos_sin[0], cos)), torch.cat((entry.cos_sin[1], sin))
            entry.cos_sin = (cos, sin)               # new tensors: a table handed out earlier is never mutated
            self._evict(entry)
        return True

    def _evict(self, keep: _Table) -> None:
        for key in list(self._entries):
            over = len(self._entries) > self.max_entries or self.nbytes > self.max_bytes
            if not over:
                break
            if self._entries[key] is not keep:
                del self._entries[key]


TABLES = RopeTableCache()


def _default_table_key(base, rotary_dim, attention_scaling, dim: int, device: torch.device, dtype: torch.dtype):
    """TABLES' key for the frequencies of ``base`` (no inv_freq given). Types are part of it: 16.0 == 16 as keys,
    but only the integer is a valid rotary_dim (the entry's first build validates the arguments)."""
    return (type(base), base, dim if rotary_dim is None else rotary_dim, type(rotary_dim), type(attention_scaling),
            attention_scaling, device, dtype)


def _table_for(base, inv_freq, rotary_dim, attention_scaling, dim: int, device: torch.device,
               dtype: torch.dtype) -> _Table:
    """The cached entry for these frequencies; arguments are validated when the entry is first made."""
    if inv_freq is None:
        key = _default_table_key(base, rotary_dim, attention_scaling, dim, device, dtype)
    elif isinstance(inv_freq, torch.Tensor):
        if inv_freq.device.type == "cpu":
            t = (inv_freq.detach() if inv_freq.requires_grad else inv_freq).resolve_neg()
            vals = (t if t.dtype in FLOAT_POSITIONS else t.double()).numpy().tobytes() if t.dim() == 1 else id(t)
            key = ("values", t.dtype, vals, rotary_dim, type(rotary_dim), type(attention_scaling), attention_scaling,
                   device, dtype)
        else:      # no device->host copy per call: identity + version counter (an in-place change bumps it)
            key = ("tensor", id(inv_freq), inv_freq._version, rotary_dim, type(rotary_dim), type(attention_scaling),
                   attention_scaling, device, dtype)
    else:
        try:     # by value: a 0-d tensor element hashes by identity and would miss an in-place change
            key = ("seq", tuple(map(float, inv_freq)), rotary_dim, type(rotary_dim), type(attention_scaling),
                   attention_scaling, device, dtype)
        except (TypeError, ValueError, RuntimeError):
            raise PosencError(f"inv_freq must be a 1-D tensor or sequence of numbers, got "
                              f"{type(inv_freq).__name__}") from None

    def build() -> _Table:
        scaling = check_float(attention_scaling, "attention_scaling", positive=True)
        if inv_freq is None:
            rdim = even_int(dim if rotary_dim is None else rotary_dim, "rotary_dim")
            inv = default_inv_freq(rdim, base, device=device)
        else:
            inv = inv_freq.detach() if isinstance(inv_freq, torch.Tensor) else inv_freq
        inv64 = _checked_inv_freq(inv, device)
        if rotary_dim is not None and inv_freq is not None:
            even_int(rotary_dim, "rotary_dim")
            if inv64.shape != (rotary_dim // 2,):
                raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rotary_dim // 2}], "
                                  f"got {tuple(inv64.shape)}")
        ref = weakref.ref(inv_freq) if isinstance(inv_freq, torch.Tensor) and inv_freq.device.type != "cpu" else None
        return _Table(inv64, scaling, dtype, ref)

    return TABLES.get(key, build)       # (an id is only reused after its tensor died: get() sees the dead ref)


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
    entry = _table_for(base, inv_freq, rotary_dim, attention_scaling, dim, device, dtype)
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
    _checked_inv_freq(inv.detach(), x.device)
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


def _kernel_checks():
    """posenc.kernels.rope_checks, imported on first use."""
    checks = _lazy.get("checks")
    if checks is None:
        from posenc.kernels import rope_checks as checks
        _lazy["checks"] = checks
    return checks


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
        mode = _call_mode(inplace, out, 1)
        if mode is not None:
            key, known = _known_call(mode, (x,), positions, layout, base, rotary_dim, attention_scaling, out)
            if known is not None:
                rotated = _run_known(known, mode, (x,), positions, out)
                if rotated is not None:
                    return rotated[0]
    _check_x(x, "x")
    rotated = _apply((x,), positions, base, inv_freq, layout, rotary_dim, attention_scaling, inplace, out, ("x",))[0]
    if key is not None:
        _remember(key, (x,), positions, out, base, rotary_dim, attention_scaling, layout)
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
        mode = _call_mode(inplace, out, 2)
        if mode is not None:
            key, known = _known_call(mode, (q, k), positions, layout, base, rotary_dim, attention_scaling, out)
            if known is not None:
                rotated = _run_known(known, mode, (q, k), positions, out)
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
        _remember(key, (q, k), positions, out, base, rotary_dim, attention_scaling, layout)
    return q_rot, k_rot


# The decode fast path of apply_rope and apply_rope_qk. A call of a geometry seen before (the key: the mode below,
# shapes, dtypes, arguments, thread count) that _apply has already checked and sent to the C kernel with a cached
# table skips to the kernel: everything _apply checks is a function of the key, the kernel range-checks the
# positions itself (a position past the table returns None here, and the general path grows the table), and what
# depends on the call itself (devices, strides, autograd, aliasing of the written tensors) is re-checked by
# _run_known, which leaves anything unusual to the general path. Only CPU calls without autograd, on contiguous
# tensors with int64 positions, are remembered; the table is looked up in TABLES on every call, so clearing or
# evicting it takes effect at once. xs: (x,) for apply_rope, (q, k) for apply_rope_qk; out: a tensor or a pair.
# The remembered calls live in the kernels' one plan cache (posenc.kernels.cpu_rope.PLANS), keyed ("apply", ...).
_NEW, _INPLACE, _OUT = 0, 1, 2          # fresh outputs, inplace=True, out=
_PLANS = PLANS
_Tensor = torch.Tensor
_num_threads = torch.get_num_threads
_dynamo_compiling = torch.compiler.is_dynamo_compiling    # False in eager; torch.compile folds it to True


def _call_mode(inplace, out, n: int) -> int | None:
    if out is None:
        return _NEW if inplace is False else _INPLACE if inplace is True else None
    if inplace is not False:
        return None
    if n == 1:
        return _OUT if type(out) is _Tensor else None
    if type(out) is tuple and len(out) == 2 and type(out[0]) is _Tensor and type(out[1]) is _Tensor:
        return _OUT
    return None


def _known_call(mode, xs, p, layout, base, rotary_dim, attention_scaling, out):
    """(key, what _remember recorded for it or None); (None, None) for an unhashable argument (the general path
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


def _run_known(known, mode, xs, p, out):
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


def _remember(key, xs, p, out, base, rotary_dim, attention_scaling, layout) -> None:
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
    table_key = _default_table_key(base, rotary_dim, attention_scaling, q.shape[-1], q.device, dtype)
    entry = TABLES.peek(table_key)
    table = None if entry is None else entry.cos_sin
    if table is None:
        return
    plan = cpu_rope.qk_plan(q, k, table[0], table[1], p, layout, entry.rotary_dim, inplace=mode == _INPLACE)
    if plan is None:
        return
    _PLANS.remember(key, plan, table_key)


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
