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

Multi-axis positions (``posenc.rope.multiaxis``): configs with ``mrope_section`` (Qwen2-VL, Qwen2.5-VL; Qwen3-VL's
interleaved order with ``mrope_interleaved``) take positions [3, batch, seq] (t, h, w), or text positions [seq] /
[batch, seq] that equal plain RoPE; 2-D vision types ("axial", "axial_pixtral") take [2, seq] / [2, batch, seq]
(patch row, column).

    >>> rot = Rotary.from_config("Qwen2-VL-7B-Instruct/config.json")
    >>> q, k = rot(q, k, positions)       # positions [3, B, T] from posenc.rope.mm_positions.mrope_position_ids
"""

from __future__ import annotations

import weakref

import torch

from posenc._internal.fp32 import Float32Buffers
from posenc._internal.validate import check_int
from posenc._internal.errors import PosencError
from posenc.angles import Angles, angles_cos_sin, pack_frequencies
from posenc.kernels.cpu_rope import PLANS, plain_cpu, qk_plan, run_fresh_qk
from posenc.kernels.ops import rope_traced
from posenc.kernels.rope_checks import TableIndexError
from posenc.kernels.rope_dispatch import rope as rotate_kernel
from posenc.positions import as_positions, check_position_dtype
from posenc.rope.apply import LAYOUTS, apply_rope_table_qk, math_dtype, rope_cos_sin
from posenc.rope.config import RopeConfig, load_rope_config
from posenc.rope.layers import rope_layout, softmax_scale_multiplier
from posenc.rope.multiaxis import (
    MROPE_AXES,
    as_axis_positions,
    position_axes,
    select_axes,
)
from posenc.rope.registry import rope_type_function
from posenc.rope.scaling import rope_frequencies

# cos/sin tables grow (doubling) up to this many positions; beyond it each call computes its own rows
_MAX_CACHED_POSITIONS = 1 << 20

# The decode fast path of Rotary (``Rotary._decode``): calls that ``_rotate`` has checked and sent to the C kernel
# with the module's own table are remembered in the kernels' one plan cache (posenc.kernels.cpu_rope.PLANS) under
# (the module's token, call geometry: shapes, dtypes, thread count) -> (kernel plan, a weak reference to the cos
# table it was checked with). The token is an object kept in the module's __dict__ under this name; setting any
# attribute of the module (layout, rotary_dim, config, the tables, ...) drops it, and with it every call remembered
# under it; copies and pickles leave it behind. What depends on the call (devices, strides, autograd) or on the
# table's contents (inv_freq edited in place) is re-checked on every call.
_PLANS_TOKEN = "_plans_token"
_recall = PLANS.recall
_Tensor = torch.Tensor
_num_threads = torch.get_num_threads
_is_compiling = torch.compiler.is_compiling     # torch.compile / export: route through the custom ops


class _Token:
    """A Rotary's key prefix in the plan cache: compared by identity, alive as long as a key or the module holds it
    (so a new module can never be handed a dead one's calls)."""
    __slots__ = ()


def _value_probe(inv: torch.Tensor):
    """(address, a NumPy view of inv's memory, its bytes now) for a contiguous CPU inv_freq, else None: comparing
    the view's bytes with the snapshot is the cheapest way to see a write through ``.data`` (which keeps the version
    counter), about 0.1 us against torch.equal's 0.5 us on a decode step. The address guards the view: a tensor
    given new memory (``.data = ...``), or a copied module (whose view is a copy), falls back to torch.equal."""
    if not (inv.is_cpu and inv.is_contiguous() and inv.layout is torch.strided) or inv.is_neg() or inv.is_conj():
        return None
    view = inv.detach().numpy()
    return inv.data_ptr(), view, view.tobytes()


class Rotary(Float32Buffers):
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
        **scaling: the type's keys (factor, beta_fast, low_freq_factor, short_factor, mrope_section, ...).

    Attributes beyond the frequencies: ``axes`` (per-pair position axis, None for 1-D positions), ``n_axes``
    (1, 3 for M-RoPE, 2 for axial), ``softmax_scale_multiplier`` (DeepSeek's g(factor, mscale_all_dim)^2, 1
    elsewhere; ``softmax_scale(qk_head_dim)`` applies it).
    Frequencies and cos/sin tables stay float32 through ``.half()`` / ``.to(dtype)``.
    """

    float32_buffers = ("inv_freq", "original_inv_freq", "cos_cached", "sin_cached")

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
        self._fn = rope_type_function(config.rope_type)
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
        self._kernel_freqs: tuple | None = None    # (inv_freq it was made from, its version, scaling, inv64, packed)
        self.register_buffer("cos_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0, self.rotary_dim // 2), persistent=False)
        # (inv_freq the table was made from, its version, scaling, a copy of its values)
        self._table_source: tuple = (None, -1, None, None, None)
        axes = position_axes(config)
        if axes is not None and axes.numel() != len(inv_freq):
            raise PosencError(f"the position axes cover {axes.numel()} pairs but rope_type {config.rope_type!r} "
                              f"gives {len(inv_freq)} frequencies")
        self.register_buffer("axes", axes, persistent=False)
        self.n_axes = 1 if axes is None else (MROPE_AXES if "mrope_section" in config.params else 2)
        self.softmax_scale_multiplier = softmax_scale_multiplier(config)

    @classmethod
    def from_config(cls, config, layer_type: str | None = None, *, layout: str | None = None,
                    cache: bool = True) -> Rotary:
        """Build from a config.json mapping / path / transformers config / RopeConfig.

        layout: None picks the pairing the model family's attention uses (``posenc.rope.layers.rope_layout``:
        "interleaved" for Llama 4, GPT-J, Cohere, GLM, DeepSeek; "half", transformers' rotate_half, otherwise and
        for a bare RopeConfig). The softmax-scale multiplier follows the family too (Hunyuan ignores mscale).
        """
        rope = load_rope_config(config, layer_type)
        rot = cls(config=rope, cache=cache, layout=rope_layout(config) if layout is None else layout)
        rot.softmax_scale_multiplier = softmax_scale_multiplier(config, rope=rope)
        return rot

    def softmax_scale(self, qk_head_dim: int) -> float:
        """The scale for q.k logits: qk_head_dim^-0.5 x ``softmax_scale_multiplier`` (cos/sin carry
        ``attention_scaling`` on top). qk_head_dim: the full q/k width (DeepSeek MLA: nope + rope dims)."""
        return check_int(qk_head_dim, "qk_head_dim", min=1) ** -0.5 * self.softmax_scale_multiplier

    def _frequencies(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        # a length rule re-evaluates the type as transformers does during a forward (runtime=True)
        return rope_frequencies(self.config, seq_len, runtime=seq_len is not None)

    def _set(self, inv_freq: torch.Tensor, scaling: float) -> None:
        """Switch frequencies; the cos/sin table is dropped only if they really changed."""
        inv_freq = inv_freq.to(self.inv_freq.device)
        if scaling != self.attention_scaling or not torch.equal(inv_freq, self.inv_freq):
            self.inv_freq = inv_freq
            self.attention_scaling = scaling
            self.clear_cache()

    def kernel_angles(self, positions: torch.Tensor) -> Angles:
        """cos/sin at ``positions`` as the GPU kernel takes them (float64 frequencies and the scaling, no table).

        The float64 copy of ``inv_freq`` is made once per frequency tensor (and its in-place version) and scaling.
        """
        inv, scaling, cached = self.inv_freq, self.attention_scaling, self._kernel_freqs
        if cached is None or cached[0] is not inv or cached[1] != inv._version or cached[2] != scaling:
            inv64 = inv.detach().to(torch.float64)
            cached = (inv, inv._version, scaling, inv64, pack_frequencies(inv64, scaling))
            self._kernel_freqs = cached
        return Angles(positions, cached[3], scaling, cached[4])

    def clear_cache(self) -> None:
        """Drop the cos/sin table and the kernel's frequencies (rebuilt on the next call). Needed after writing
        ``inv_freq`` through ``.data`` on a GPU, which bypasses the version counter (on the CPU the table also
        compares the values)."""
        self.cos_cached = self.cos_cached.new_empty(0, self.rotary_dim // 2)
        self.sin_cached = self.sin_cached.new_empty(0, self.rotary_dim // 2)
        self._table_source = (None, -1, None, None, None)
        self._kernel_freqs = None

    def _table_is_current(self) -> bool:
        """Whether the cos/sin table was made from the current ``inv_freq`` (same tensor, not modified in place
        since, same values: a write through ``.data`` keeps the version counter) and ``attention_scaling``:
        assigning either, or editing inv_freq, invalidates it."""
        inv, source = self._buffers["inv_freq"], self._table_source
        if not (source[0] is inv and source[1] == inv._version and source[2] == self.attention_scaling):
            return False
        probe = source[4]
        if probe is not None and inv.data_ptr() == probe[0]:     # CPU: the live bytes against the snapshot's
            return probe[1].tobytes() == probe[2]
        return torch.equal(source[3], inv)

    def update(self, seq_len: int) -> None:
        """Apply the type's length rule for a call whose largest position is seq_len - 1 (transformers' rule)."""
        seq_len = check_int(seq_len, "seq_len", min=1)
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
        """cos and sin (times attention_scaling) of positions * inv_freq: float32 [..., rotary_dim/2].

        positions: [*shape] for 1-D RoPE -> tables [*shape, R/2]; multi-axis types take the axis dim first
        ([3, *shape] M-RoPE, text positions [*shape] too; [2, *shape] axial) -> tables [*shape, R/2], pair j at
        the position of its axis. Applies the length rule first (seq_len = max(positions) + 1 over every axis),
        then reads the cache (integer positions).
        """
        if _is_compiling() and self.seq_len_rule is None and self.n_axes == 1:     # torch.compile / export
            p = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
            return self._traced_cos_sin(check_position_dtype(p).to(self.inv_freq.device))
        positions = as_positions(positions, self.inv_freq.device)     # numbers only: no NaN/inf, no half precision
        if self.axes is not None:
            positions = as_axis_positions(positions, self.n_axes)
        return self._cos_sin(positions)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos_sin`` for positions already checked (and in axis-first form for multi-axis types)."""
        if positions.numel() == 0:
            raise PosencError("positions must not be empty")
        if positions.min() < 0:
            raise PosencError(f"positions must be >= 0, got min {positions.min().item()}")
        seq_len = int(positions.max().ceil()) + 1 if positions.is_floating_point() else int(positions.max()) + 1
        self.update(seq_len)
        # fractional positions, or a table past _MAX_CACHED_POSITIONS rows (a lone far position must not allocate
        # gigabytes): compute exactly what is asked, uncached
        if not self.use_cache or positions.is_floating_point() or seq_len > _MAX_CACHED_POSITIONS:
            cos, sin = rope_cos_sin(positions, self.inv_freq, self.attention_scaling)
        else:
            rows = self.cos_cached.shape[0] if self._table_is_current() else 0
            if seq_len > rows:
                n = min(max(seq_len, 2 * rows), _MAX_CACHED_POSITIONS)      # the cap bounds the table, not only
                inv = self.inv_freq                                          # the position that grows it
                with torch.inference_mode(False):     # kept across calls: never an inference tensor
                    table = torch.arange(n, device=inv.device)
                    self.cos_cached, self.sin_cached = rope_cos_sin(table, inv, self.attention_scaling)
                self._table_source = (inv, inv._version, self.attention_scaling, inv.detach().clone(),
                                      _value_probe(inv))
            positions = positions.long()
            cos, sin = self.cos_cached[positions], self.sin_cached[positions]
        if self.axes is not None:
            cos, sin = select_axes(cos, self.axes), select_axes(sin, self.axes)
        return cos, sin

    def __setattr__(self, name, value):
        self.__dict__.pop(_PLANS_TOKEN, None)      # whatever changed, the remembered calls were checked without it
        super().__setattr__(name, value)

    def __getstate__(self):
        # a copy must not share the original's remembered calls (its table is another): leave the token behind
        state = dict(super().__getstate__())
        state.pop(_PLANS_TOKEN, None)
        return state

    def _decode(self, q, k, positions):
        """The decode fast path: (q, k) rotated if this call's geometry was checked before (see _PLANS_TOKEN) and
        it is still what the C kernel can take as it stands, else None (then ``_rotate``)."""
        token = self.__dict__.get(_PLANS_TOKEN)
        if token is None or type(q) is not _Tensor or type(k) is not _Tensor or type(positions) is not _Tensor:
            return None
        entry = _recall((token, q.shape, k.shape, positions.shape, q.dtype, k.dtype, positions.dtype, _num_threads()))
        if entry is None or not plain_cpu(q, k, positions):
            return None
        buffers = self._buffers
        cos = buffers["cos_cached"]
        if cos is not entry[1]() or not self._table_is_current():      # (module.to() swaps buffers without setattr)
            return None
        # a position past the table makes the kernel refuse (None): _rotate then grows the table
        return run_fresh_qk(entry[0], q, k, cos, buffers["sin_cached"],
                            positions if positions.dim() == 1 else positions.unsqueeze(1))

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [B, Hq, T, D] and k [B, Hk, T, D] at positions [T] or [B, T] (multi-axis types: [A, T] /
        [A, B, T] with the axis dim first, see ``cos_sin``). Any float dtype: math in float32 (float64 inputs: float64
        math over the float32 table).

        Returns (q, k) rotated, in their input dtypes. Only the first rotary_dim dims are rotated. Positions must
        be >= 0 on the CPU (its table has rows 0..n-1); on CUDA, where cos/sin are computed in the kernel without a
        host sync to inspect them, a negative position is rotated by its negative angle (as ``apply_rope`` does).
        Under torch.compile / torch.export: cos/sin computed in the graph, then posenc's custom ops (kernels.ops).
        """
        if _is_compiling():
            rotated = self._rotate_traced(q, k, positions)
            if rotated is not None:
                return rotated
        rotated = self._decode(q, k, positions)
        return rotated if rotated is not None else self._rotate(q, k, positions)

    def _rotate(self, q, k, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's general path: every check, then the kernel; records what ``_decode`` may repeat."""
        given_positions = positions
        if not (q.is_floating_point() and k.is_floating_point()):
            raise PosencError(f"q and k must be floating-point tensors, got {q.dtype} and {k.dtype}")
        if q.layout != torch.strided or k.layout != torch.strided:
            raise PosencError(f"q and k must be dense (strided) tensors, got layouts {q.layout} and {k.layout}: call "
                              ".to_dense() first")
        qs, ks, head_dim = q.shape, k.shape, self.config.head_dim
        if len(qs) != 4 or len(ks) != 4:
            raise PosencError(f"q and k must be [batch, heads, seq, head_dim]; got q {list(qs)}, k {list(ks)}")
        if qs[3] != head_dim or ks[3] != head_dim:
            raise PosencError(f"q and k last dim must be head_dim={head_dim}; got q {list(qs)}, k {list(ks)}")
        batch, seq = qs[0], qs[2]
        if batch != ks[0] or seq != ks[2]:
            raise PosencError(f"q and k must share batch and seq; got q {list(qs)}, k {list(ks)}")
        positions = given = as_positions(positions, q.device)
        multi = self.n_axes != 1             # (= self.axes is not None, without nn.Module's buffer lookup: hot path)
        if multi:
            positions = as_axis_positions(positions, self.n_axes)
        ps = positions.shape
        per_axis = ps[1:] if multi else ps
        if not (per_axis == (seq,) or per_axis == (batch, seq) or per_axis == (1, seq)):
            lead = f"[{self.n_axes}, ...] with ... " if multi else ""
            hint = (f"; a 2-D tensor reads as text positions [batch, seq]: pass {self.n_axes}-axis positions as "
                    f"[{self.n_axes}, batch, seq] (e.g. positions[:, None] for batch 1)"
                    if multi and given.dim() == 2 and given.shape[0] == self.n_axes else "")
            raise PosencError(f"positions must have shape {lead}[seq] = [{seq}] or [batch, seq] = [{batch}, {seq}], "
                              f"got {list(given.shape)}{hint}")
        if (not multi and self.seq_len_rule is None and q.is_cuda and not positions.is_floating_point()
                and q.dtype == k.dtype and k.device == q.device):
            # CUDA: the kernel computes cos/sin of these positions itself (float64 angles): no table, no host sync (so
            # positions are not range-checked here: a negative one rotates by its negative angle, as the formula
            # says, where the CPU path refuses it)
            index = positions if len(ps) == 1 else positions.unsqueeze(1)      # [B, T] -> [B, 1, T]
            return rotate_kernel((q, k), self.kernel_angles(index), None, layout=self.layout,
                                 rotary_dim=self.rotary_dim, names=("q", "k"))
        # fast path (CPU, cached table, integer positions, no length rule): everything above is all the checking
        # the kernel needs (its table is this module's own), so it is called directly: it reads row `position` of
        # the table and range-checks it itself; a position past the table falls through to cos_sin, which grows it.
        # (The buffers are read from _buffers: nn.Module's attribute lookup costs more than the check it guards.)
        buffers = self._buffers
        cos_cached = buffers["cos_cached"]
        if (not multi and self.use_cache and self.seq_len_rule is None and positions.is_cpu and seq
                and cos_cached.shape[0] and cos_cached.is_cpu and not positions.is_floating_point()
                and q.dtype == k.dtype and q.dtype != torch.float64 and k.is_cpu and q.is_cpu
                and self._table_is_current()):
            index = positions if len(ps) == 1 else positions.unsqueeze(1)      # [B, T] -> [B, 1, T]
            if index.dtype != torch.int64 or not index.is_contiguous():
                index = index.to(torch.int64).contiguous()
            sin_cached = buffers["sin_cached"]
            plan = None
            if plain_cpu(q, k, index):
                # decode: fresh outputs through a plan cached by shape (no autograd, nothing to alias-check)
                plan = qk_plan(q, k, cos_cached, sin_cached, index, self.layout, self.rotary_dim)
            if plan is not None:
                if given_positions is positions and type(q) is _Tensor and type(k) is _Tensor \
                        and type(positions) is _Tensor and positions.dtype == torch.int64 \
                        and positions.is_contiguous():
                    self._remember(q, k, positions, plan, cos_cached)
                rotated = run_fresh_qk(plan, q, k, cos_cached, sin_cached, index)
                if rotated is not None:
                    return rotated
            else:
                try:
                    return rotate_kernel((q, k), cos_cached, sin_cached, layout=self.layout,
                                         rotary_dim=self.rotary_dim, index=index, names=("q", "k"))
                except TableIndexError:
                    pass
        cos, sin = self._cos_sin(positions)
        if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]: broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        cos, sin = cos.to(q.device, dtype), sin.to(q.device, dtype)
        return apply_rope_table_qk(q, k, cos, sin, layout=self.layout, rotary_dim=self.rotary_dim)

    def _rotate_traced(self, q, k, positions):
        """``Rotary.forward`` under a trace, or None where the eager route must run (length rules, multi-axis).

        Same checks of shapes as the eager route; cos/sin of the positions from the module's frequencies, in float32
        as its table holds them (then the math dtype)."""
        if self.seq_len_rule is not None or self.n_axes != 1:
            return None
        qs, ks, head_dim = q.shape, k.shape, self.config.head_dim
        if not (q.is_floating_point() and k.is_floating_point()) or q.dtype != k.dtype:
            raise PosencError(f"q and k must be floating-point tensors of one dtype, got {q.dtype} and {k.dtype}")
        if len(qs) != 4 or len(ks) != 4 or qs[3] != head_dim or ks[3] != head_dim or qs[0] != ks[0] or qs[2] != ks[2]:
            raise PosencError(f"q and k must be [batch, heads, seq, head_dim={head_dim}] with one batch and seq; got "
                              f"q {list(qs)}, k {list(ks)}")
        p = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
        p = check_position_dtype(p).to(q.device)
        batch, seq = qs[0], qs[2]
        if not (p.shape == (seq,) or p.shape == (batch, seq) or p.shape == (1, seq)):
            raise PosencError(f"positions must have shape [seq] = [{seq}] or [batch, seq] = [{batch}, {seq}], "
                              f"got {list(p.shape)}")
        cos, sin = self._traced_cos_sin(p)
        if cos.dim() == 3:   # [B, T, R/2] -> [B, 1, T, R/2]: broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        dtype = math_dtype(q.dtype)
        return rope_traced((q, k), cos.to(dtype), sin.to(dtype), layout=self.layout, rotary_dim=self.rotary_dim)

    def _traced_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos_sin's values for 1-D positions without its table (under a trace, where the table's growth, which
        depends on the positions' values, cannot be followed): float32 [*positions.shape, R/2], as the table holds
        them. No length rule and no multi-axis positions (the callers check)."""
        inv64 = self.inv_freq.detach().to(torch.float64)
        return angles_cos_sin(positions, inv64, self.attention_scaling, torch.float32)

    def _remember(self, q, k, positions, plan, cos) -> None:
        """Record a call ``_rotate`` has checked and sent to the kernel with this module's table (see _decode)."""
        token = self.__dict__.get(_PLANS_TOKEN)
        if token is None:
            token = self.__dict__[_PLANS_TOKEN] = _Token()           # (not setattr: that would drop it)
        PLANS.remember((token, q.shape, k.shape, positions.shape, q.dtype, k.dtype, positions.dtype, _num_threads()),
                       plan, weakref.ref(cos))

    def extra_repr(self) -> str:
        c = self.config
        return (f"rope_type={c.rope_type!r}, head_dim={c.head_dim}, rotary_dim={self.rotary_dim}, theta={c.theta:g}, "
                f"layout={self.layout!r}, attention_scaling={self.attention_scaling:g}"
                + (f", position_axes={self.n_axes}" if self.axes is not None else ""))

