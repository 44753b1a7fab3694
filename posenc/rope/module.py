"""``Rotary``: apply any registered RoPE type to queries and keys, with a cos/sin cache and dynamic updates.

    >>> rot = Rotary.from_config("config.json")                   # any HF config form, layout "half"
    >>> q, k = rot(q, k, positions)       # q [B, Hq, T, D], k [B, Hk, T, D], positions [T] or [B, T]
    >>> rot = Rotary(64, rope_type="yarn", factor=4.0, original_max_position_embeddings=256)   # plain constructor

Length-dependent types follow transformers' ``dynamic_rope_update`` exactly:
- "dynamic": when max(position) + 1 exceeds the cached length, recompute the frequencies at that length;
  when a sequence shorter than max_position_embeddings follows a longer one, restore the original frequencies
  (lengths in between keep the larger scale).
- "longrope": long factors when max(position) + 1 > original_max_position_embeddings, else short factors.
As in transformers, this is decided per call from the positions given: under a KV cache the earlier keys keep
the rotation they were given (dynamic NTK is then only exact if keys are cached before rotation).
"""

from __future__ import annotations

import torch
from torch import nn

from posenc.errors import PosencError
from posenc.kernels.rope_checks import TableIndexError
from posenc.kernels.rope_dispatch import rope as rotate_kernel
from posenc.rope.apply import LAYOUTS, apply_rope_table_qk, as_positions, rope_cos_sin
from posenc.rope.config import RopeConfig, load_rope_config
from posenc.rope.scaling import _lookup

# cos/sin tables grow (doubling) up to this many positions; beyond it each call computes its own rows
_MAX_CACHED_POSITIONS = 1 << 20


class Rotary(nn.Module):
    """Rotary position embedding for q and k, configured by any rope type of ``posenc.ROPE_SCALING_FUNCTIONS``.

    Args:
        head_dim: per-head dimension D (plain constructor).
        theta: RoPE base.
        rope_type: a registered type ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "ntk", ...).
        partial_rotary_factor: rotate the first int(head_dim * factor) dims only.
        max_position_embeddings, original_max_position_embeddings: Lmax and L0 where the type needs them.
        layout: "interleaved" (pairs 2j, 2j+1; the default here) or "half" (Hugging Face's rotate_half).
        cache: keep a float32 cos/sin table of positions 0..n-1 (grown on demand, doubling); False recomputes.
        config: a ready ``RopeConfig`` instead of the fields above.
        **scaling: the type's keys (factor, beta_fast, low_freq_factor, short_factor, ...).
    """

    def __init__(self, head_dim: int | None = None, theta: float = 10000.0, *, rope_type: str = "default",
                 partial_rotary_factor: float = 1.0, max_position_embeddings: int | None = None,
                 original_max_position_embeddings: int | None = None, layout: str = "interleaved",
                 cache: bool = True, config: RopeConfig | None = None, **scaling):
        super().__init__()
        if config is None:
            if head_dim is None:
                raise PosencError("Rotary needs head_dim (or config=RopeConfig; see Rotary.from_config)")
            config = RopeConfig(rope_type=rope_type, theta=theta, head_dim=head_dim,
                                partial_rotary_factor=partial_rotary_factor,
                                max_position_embeddings=max_position_embeddings,
                                original_max_position_embeddings=original_max_position_embeddings, params=scaling)
        elif head_dim is not None or scaling:
            raise PosencError("give either config= or head_dim and scaling keys, not both")
        if not isinstance(config, RopeConfig):
            raise PosencError(f"config must be a RopeConfig (use Rotary.from_config for mappings and paths), "
                              f"got {type(config).__name__}")
        if layout not in LAYOUTS:
            raise PosencError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.config = config
        self.layout = layout
        self.use_cache = bool(cache)
        self._fn = _lookup(config.rope_type)
        self.seq_len_rule = self._fn.seq_len_rule
        if self.seq_len_rule == "dynamic" and config.max_position_embeddings is None:
            raise PosencError(f"rope_type {config.rope_type!r} needs max_position_embeddings")

        inv_freq, scaling = self._frequencies(None)
        self.rotary_dim = 2 * len(inv_freq)
        if self.rotary_dim > config.head_dim:
            raise PosencError(f"rope_type {config.rope_type!r} gave {len(inv_freq)} frequencies, more than "
                              f"head_dim // 2 = {config.head_dim // 2}")
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        self.attention_scaling = self.original_attention_scaling = scaling
        self._long = None                                             # longrope: (inv_freq, scaling) for long input
        self.original_max_seq_len = config.max_position_embeddings   # dynamic: Lmax
        self.max_seq_len_cached = config.max_position_embeddings     # dynamic: length the frequencies are for
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)

    @classmethod
    def from_config(cls, config, layer_type: str | None = None, *, layout: str = "half",
                    cache: bool = True) -> Rotary:
        """Build from a config.json mapping / path / transformers config / RopeConfig; layout "half" (HF's)."""
        return cls(config=load_rope_config(config, layer_type), layout=layout, cache=cache)

    def _apply(self, fn, recurse=True):
        """Follow device moves but keep frequencies and cos/sin tables in float32 through .half() / .to(dtype)."""
        names = ("inv_freq", "original_inv_freq", "cos_cached", "sin_cached")
        saved = {name: getattr(self, name) for name in names}
        super()._apply(fn, recurse)
        for name, old in saved.items():
            setattr(self, name, old.to(getattr(self, name).device))
        return self

    def _frequencies(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        inv_freq, scaling = self._fn(self.config, seq_len)
        return torch.as_tensor(inv_freq, dtype=torch.float32).reshape(-1), float(scaling)

    def _set(self, inv_freq: torch.Tensor, scaling: float) -> None:
        """Switch frequencies; the cos/sin table is dropped only if they really changed."""
        inv_freq = inv_freq.to(self.inv_freq.device)
        if scaling != self.attention_scaling or not torch.equal(inv_freq, self.inv_freq):
            self.inv_freq = inv_freq
            self.attention_scaling = scaling
            self.clear_cache()

    def clear_cache(self) -> None:
        """Drop the cos/sin table (it is rebuilt on the next call)."""
        self.cos_cached = self.cos_cached.new_empty(0, self.rotary_dim // 2)
        self.sin_cached = self.sin_cached.new_empty(0, self.rotary_dim // 2)

    def update(self, seq_len: int) -> None:
        """Apply the type's length rule for a call whose largest position is seq_len - 1 (transformers' rule)."""
        if self.seq_len_rule == "dynamic":
            cached = self.max_seq_len_cached
            if seq_len > cached:  # growth: rescale for the longer sequence
                self._set(*self._frequencies(seq_len))
                self.max_seq_len_cached = seq_len
            if seq_len < self.original_max_seq_len < cached:  # back within Lmax: restore the originals
                self._set(self.original_inv_freq, self.original_attention_scaling)
                self.max_seq_len_cached = self.original_max_seq_len
        elif self.seq_len_rule == "longrope":
            if seq_len > self.config.original_max_position_embeddings:
                if self._long is None:
                    self._long = self._frequencies(self.config.original_max_position_embeddings + 1)
                self._set(*self._long)
            else:
                self._set(self.original_inv_freq, self.original_attention_scaling)

    def cos_sin(self, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (times attention_scaling) of positions * inv_freq: float32 [*positions.shape, rotary_dim/2].

        Applies the length rule first (seq_len = max(positions) + 1), then reads the cache (integer positions).
        """
        positions = as_positions(positions, self.inv_freq.device)     # numbers only: no NaN/inf, no half precision
        if positions.numel() == 0:
            raise PosencError("positions must not be empty")
        if positions.min() < 0:
            raise PosencError(f"positions must be >= 0, got min {positions.min().item()}")
        seq_len = int(positions.max().ceil()) + 1 if positions.is_floating_point() else int(positions.max()) + 1
        self.update(seq_len)
        # fractional positions, or a table past _MAX_CACHED_POSITIONS rows (a lone far position must not allocate
        # gigabytes): compute exactly what is asked, uncached
        if not self.use_cache or positions.is_floating_point() or seq_len > _MAX_CACHED_POSITIONS:
            return rope_cos_sin(positions, self.inv_freq, self.attention_scaling)
        if seq_len > self.cos_cached.shape[0]:
            n = max(seq_len, 2 * self.cos_cached.shape[0])
            table = torch.arange(n, device=self.inv_freq.device)
            self.cos_cached, self.sin_cached = rope_cos_sin(table, self.inv_freq, self.attention_scaling)
        positions = positions.long()
        return self.cos_cached[positions], self.sin_cached[positions]

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [B, Hq, T, D] and k [B, Hk, T, D] (any float dtype; math in float32) at positions [T] or [B, T].

        Returns (q, k) rotated, in their input dtypes. Only the first rotary_dim dims are rotated.
        """
        if not (q.is_floating_point() and k.is_floating_point()):
            raise PosencError(f"q and k must be floating-point tensors, got {q.dtype} and {k.dtype}")
        qs, ks, head_dim = q.shape, k.shape, self.config.head_dim
        if len(qs) != 4 or len(ks) != 4:
            raise PosencError(f"q and k must be [batch, heads, seq, head_dim]; got q {list(qs)}, k {list(ks)}")
        if qs[3] != head_dim or ks[3] != head_dim:
            raise PosencError(f"q and k last dim must be head_dim={head_dim}; got q {list(qs)}, k {list(ks)}")
        batch, seq = qs[0], qs[2]
        if batch != ks[0] or seq != ks[2]:
            raise PosencError(f"q and k must share batch and seq; got q {list(qs)}, k {list(ks)}")
        positions = as_positions(positions, q.device)
        ps = positions.shape
        if not (ps == (seq,) or ps == (batch, seq) or ps == (1, seq)):
            raise PosencError(f"positions must have shape [seq] = [{seq}] or [batch, seq] = [{batch}, {seq}], "
                              f"got {list(ps)}")
        # fast path (CPU, cached table, integer positions, no length rule): everything above is all the checking
        # the kernel needs (its table is this module's own), so it is called directly: it reads row `position` of
        # the table and range-checks it itself; a position past the table falls through to cos_sin, which grows it.
        # (The buffers are read from _buffers: nn.Module's attribute lookup costs more than the check it guards.)
        buffers = self._buffers
        cos_cached = buffers["cos_cached"]
        if (self.use_cache and self.seq_len_rule is None and positions.is_cpu and seq and cos_cached.shape[0]
                and not positions.is_floating_point() and q.dtype == k.dtype and q.dtype != torch.float64
                and k.is_cpu and q.is_cpu):
            index = positions if len(ps) == 1 else positions.unsqueeze(1)      # [B, T] -> [B, 1, T]
            if index.dtype != torch.int64 or not index.is_contiguous():
                index = index.to(torch.int64).contiguous()
            try:
                return rotate_kernel((q, k), cos_cached, buffers["sin_cached"], layout=self.layout,
                                     rotary_dim=self.rotary_dim, index=index, names=("q", "k"))
            except TableIndexError:
                pass
        cos, sin = self.cos_sin(positions)
        if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]: broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        cos, sin = cos.to(q.device, dtype), sin.to(q.device, dtype)
        return apply_rope_table_qk(q, k, cos, sin, layout=self.layout, rotary_dim=self.rotary_dim)

    def extra_repr(self) -> str:
        c = self.config
        return (f"rope_type={c.rope_type!r}, head_dim={c.head_dim}, rotary_dim={self.rotary_dim}, theta={c.theta:g}, "
                f"layout={self.layout!r}, attention_scaling={self.attention_scaling:g}")

