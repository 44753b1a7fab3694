"""cos/sin tables for posenc.rope.apply: built once per frequency set in float64, stored in the math dtype, indexed
by position.

``TABLES`` is the one cache ``apply_rope`` / ``apply_rope_qk`` (and their decode fast path, posenc.rope.fast_path)
read; ``table_for`` finds or makes the entry for one call's frequencies, validating them when the entry is first made.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch

from posenc._internal.validate import check_float, even_int
from posenc.angles import angles_cos_sin, pack_frequencies
from posenc._internal.errors import PosencError
from posenc.positions import FLOAT_POSITIONS
from posenc.rope.frequencies import checked_inv_freq, default_inv_freq


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


def default_table_key(base, rotary_dim, attention_scaling, dim: int, device: torch.device, dtype: torch.dtype):
    """TABLES' key for the frequencies of ``base`` (no inv_freq given). Types are part of it: 16.0 == 16 as keys,
    but only the integer is a valid rotary_dim (the entry's first build validates the arguments)."""
    return (type(base), base, dim if rotary_dim is None else rotary_dim, type(rotary_dim), type(attention_scaling),
            attention_scaling, device, dtype)


def table_for(base, inv_freq, rotary_dim, attention_scaling, dim: int, device: torch.device,
               dtype: torch.dtype) -> _Table:
    """The cached entry for these frequencies; arguments are validated when the entry is first made."""
    if inv_freq is None:
        key = default_table_key(base, rotary_dim, attention_scaling, dim, device, dtype)
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
        inv64 = checked_inv_freq(inv, device)
        if rotary_dim is not None and inv_freq is not None:
            even_int(rotary_dim, "rotary_dim")
            if inv64.shape != (rotary_dim // 2,):
                raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rotary_dim // 2}], "
                                  f"got {tuple(inv64.shape)}")
        ref = weakref.ref(inv_freq) if isinstance(inv_freq, torch.Tensor) and inv_freq.device.type != "cpu" else None
        return _Table(inv64, scaling, dtype, ref)

    return TABLES.get(key, build)       # (an id is only reused after its tensor died: get() sees the dead ref)
