"""Multi-axis RoPE: positions with several coordinates per token, each rotary pair following one of them.

Multimodal RoPE (M-RoPE; Qwen2-VL, Wang et al. 2024) gives every token three position ids (temporal, height,
width): text tokens have three equal ids, image / video patches their grid coordinates. The rotary pairs are
split between the three axes by ``mrope_section`` (pair counts per axis):

    chunked (Qwen2-VL, Qwen2.5-VL, GLM-4V): pairs [0, s0) follow t, [s0, s0 + s1) follow h, the rest w
    interleaved (Qwen3-VL, "mrope_interleaved": true): pair j follows h if j % 3 == 1 and j < 3 s1,
                                                      w if j % 3 == 2 and j < 3 s2, else t

2-D ("axial") vision RoPE does the same with two axes (patch row, patch column): the first half of the pairs
follow the row, the second half the column (``posenc.rope.scaling.axial_axes``).

Either way the rotation is ordinary RoPE with a per-pair position: cos/sin[..., j] = cos/sin(pos[axis_j] * inv_j).
This module builds those tables; ``posenc.rope.apply.apply_rope_table`` rotates with them. When all axes hold the
same position (text), the table equals plain RoPE's.

    >>> positions = torch.arange(8).expand(3, 1, 8)                 # [3, batch, seq]: text only
    >>> q = apply_mrope(q, positions, mrope_section=[16, 24, 24], layout="half")     # == plain RoPE here
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc._internal.validate import check_bool, check_int
from posenc._internal.errors import ConfigError, PosencError
from posenc.rope.apply import apply_rope_table, as_positions, default_inv_freq, math_dtype, rope_cos_sin
from posenc.rope.config import RopeConfig, load_rope_config
from posenc.rope.registry import rope_type_function

MROPE_AXES = 3   # temporal, height, width
AXIAL_AXES = 2   # row, column


def mrope_axes(mrope_section: Sequence[int], pairs: int | None = None, *, interleaved: bool = False) -> torch.Tensor:
    """Axis (0 = t, 1 = h, 2 = w) of each rotary pair for M-RoPE, as int64 [pairs].

    mrope_section: pair counts per axis ([16, 24, 24] for Qwen2-VL-7B, [24, 20, 20] Qwen3-VL); they must add up to
    the number of pairs (rotary_dim // 2). Chunked: section i covers the next mrope_section[i] pairs and follows
    axis i % 3 (transformers' rule). interleaved (Qwen3-VL): axes cycle t, h, w over the pairs until the h and w
    sections are used up, the remaining pairs follow t.
    """
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence) or not mrope_section:
        raise ConfigError(f"mrope_section must be a list of pair counts per position axis, got {mrope_section!r}")
    sections = [check_int(s, "mrope_section entries", min=0, error=ConfigError) for s in mrope_section]
    total = sum(sections)
    if pairs is not None and total != pairs:
        raise ConfigError(f"mrope_section {sections} must add up to the number of rotary pairs (rotary_dim // 2 = "
                          f"{pairs}), got {total}")
    check_bool(interleaved, "mrope_interleaved", error=ConfigError)
    if not interleaved:
        return torch.cat([torch.full((n,), i % MROPE_AXES, dtype=torch.long) for i, n in enumerate(sections)])
    if len(sections) != MROPE_AXES:
        raise ConfigError(f"interleaved M-RoPE needs 3 sections (t, h, w), got mrope_section {sections}")
    axes = torch.zeros(total, dtype=torch.long)
    for axis in (1, 2):
        axes[axis: MROPE_AXES * sections[axis]: MROPE_AXES] = axis
    return axes


def position_axes(config) -> torch.Tensor | None:
    """Per-pair position axis (int64 [pairs]) for a multi-axis config, None for ordinary 1-D RoPE.

    ``config``: any form ``load_rope_config`` accepts. Axial vision types give 2 axes (row, column); configs with
    ``mrope_section`` give 3 (t, h, w), with ``mrope_interleaved`` choosing the Qwen3-VL order.
    """
    cfg = load_rope_config(config)
    fn = rope_type_function(cfg.rope_type)
    if fn.axes is not None:
        return torch.as_tensor(fn.axes(cfg), dtype=torch.long)
    section = cfg.params.get("mrope_section")
    if section is None:
        return None
    return mrope_axes(section, cfg.rotary_dim // 2, interleaved=cfg.params.get("mrope_interleaved", False) or False)


def axis_count(config) -> int:
    """How many coordinates each position has: 1 (plain RoPE), 3 (M-RoPE: t, h, w) or 2 (axial: row, column)."""
    cfg = load_rope_config(config)
    if rope_type_function(cfg.rope_type).axes is not None:
        return AXIAL_AXES
    return MROPE_AXES if cfg.params.get("mrope_section") is not None else 1


def as_axis_positions(positions, n_axes: int) -> torch.Tensor:
    """Positions with the axis dim first: [n_axes, ...].

    M-RoPE (n_axes 3) follows transformers: a 3-D tensor is [3, batch, seq]; 1-D / 2-D tensors are text positions
    ([seq] / [batch, seq]), the same on every axis. Axial (n_axes 2) positions must carry the axis dim: [2, seq]
    or [2, batch, seq] (``vision_position_ids`` builds them).
    """
    positions = as_positions(positions)
    if n_axes == MROPE_AXES and positions.dim() < 3:
        return positions.unsqueeze(0).expand(MROPE_AXES, *positions.shape)
    if positions.dim() < 2 or positions.shape[0] != n_axes:
        form = "[3, batch, seq] (or text positions [seq] / [batch, seq])" if n_axes == MROPE_AXES else \
            "[2, seq] or [2, batch, seq] (row and column of each patch)"
        raise PosencError(f"positions must have shape {form}, got {list(positions.shape)}")
    return positions


def select_axes(table: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """From a per-axis table [A, ..., pairs], pair j of axis axes[j]: [..., pairs]."""
    index = axes.to(table.device).view((1,) * (table.dim() - 1) + (-1,)).expand(1, *table.shape[1:])
    return table.gather(0, index).squeeze(0)


def multi_axis_cos_sin(positions, inv_freq: torch.Tensor, axes: torch.Tensor, attention_scaling: float = 1.0,
                       dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos[axes_j] * inv_freq_j: [..., pairs] for positions [A, ...] (axis dim first).

    Angles are formed as in ``rope_cos_sin`` (float64, then ``dtype``), scaled by ``attention_scaling``.
    """
    positions = torch.as_tensor(positions)
    axes = torch.as_tensor(axes, dtype=torch.long)
    inv_freq = torch.as_tensor(inv_freq)
    if axes.shape != inv_freq.shape:
        raise PosencError(f"axes must have one entry per frequency, got {list(axes.shape)} for inv_freq "
                          f"{list(inv_freq.shape)}")
    if positions.dim() < 1 or int(axes.max()) >= positions.shape[0]:
        raise PosencError(f"positions must have the axis dim first with at least {int(axes.max()) + 1} rows, got "
                          f"{list(positions.shape)}")
    cos, sin = rope_cos_sin(positions, inv_freq, attention_scaling, dtype)
    return select_axes(cos, axes), select_axes(sin, axes)


def _head_broadcast(cos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-row tables [batch, seq, pairs] keep the batch on x's first dim: [batch, 1, ..., 1, seq, pairs] for x
    [batch, ..., seq, dim] (heads, or groups and heads); shared tables [seq, pairs] broadcast as they are."""
    if cos.dim() == 3 and x.dim() > 3:
        return cos.view(cos.shape[0], *([1] * (x.dim() - 3)), *cos.shape[1:])
    return cos


def _apply(xs, positions, inv_freq, axes, n_axes, layout, rotary_dim, attention_scaling):
    positions = as_axis_positions(torch.as_tensor(positions, device=xs[0].device), n_axes)
    cos, sin = multi_axis_cos_sin(positions, inv_freq.to(xs[0].device), axes, attention_scaling,
                                  math_dtype(xs[0].dtype))
    return tuple(apply_rope_table(x, _head_broadcast(cos, x), _head_broadcast(sin, x), layout=layout,
                                  rotary_dim=rotary_dim) for x in xs)


def _frequencies(base, inv_freq, pairs: int) -> torch.Tensor:
    if inv_freq is None:
        return default_inv_freq(2 * pairs, base)
    inv_freq = torch.as_tensor(inv_freq, dtype=torch.float32)
    if inv_freq.shape != (pairs,):
        raise PosencError(f"inv_freq must have one entry per pair ({pairs}), got shape {list(inv_freq.shape)}")
    return inv_freq


def apply_mrope(x: torch.Tensor, positions, *, mrope_section: Sequence[int], layout: str,
                interleaved: bool = False, base: float = 10000.0, inv_freq=None, attention_scaling: float = 1.0
                ) -> torch.Tensor:
    """M-RoPE on x [batch, heads, seq, dim] (or [..., seq, dim]) at positions [3, batch, seq] (t, h, w).

    mrope_section: pair counts per axis, summing to the rotated pairs (the rotary dim is 2 * sum; the dims past it
    pass through). layout: "half" (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: transformers' rotate_half) or "interleaved"
    (GLM-4V); required, since the two differ. interleaved: Qwen3-VL's axis order. inv_freq: [pairs] frequencies
    (a scaled type's, from ``posenc.rope_parameters``), else default ones with ``base``. Text positions ([seq] or
    [batch, seq]) give plain RoPE. Returns a tensor like x.
    """
    axes = mrope_axes(mrope_section, interleaved=interleaved)
    inv = _frequencies(base, inv_freq, axes.numel())
    return _apply((x,), positions, inv, axes, MROPE_AXES, layout, 2 * axes.numel(), attention_scaling)[0]


def apply_mrope_qk(q: torch.Tensor, k: torch.Tensor, positions, *, mrope_section: Sequence[int], layout: str,
                   interleaved: bool = False, base: float = 10000.0, inv_freq=None, attention_scaling: float = 1.0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_mrope`` on queries and keys with one table (q [B, Hq, T, D], k [B, Hk, T, D])."""
    axes = mrope_axes(mrope_section, interleaved=interleaved)
    inv = _frequencies(base, inv_freq, axes.numel())
    return _apply((q, k), positions, inv, axes, MROPE_AXES, layout, 2 * axes.numel(), attention_scaling)


def apply_axial_rope(x: torch.Tensor, positions, *, layout: str = "half", base: float = 10000.0,
                     rope_type: str = "axial") -> torch.Tensor:
    """2-D RoPE on patch features x [..., patches, head_dim] at positions [2, patches] (row, column) or
    [2, batch, patches]; the whole head rotates.

    rope_type: "axial" (Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V vision: d/4 frequencies, row pairs then column
    pairs) or "axial_pixtral" (Pixtral: default frequencies split by parity). layout: "half", as all of those
    models use transformers' rotate_half. ``vision_position_ids`` builds the positions of a patch grid.
    """
    if rope_type not in ("axial", "axial_pixtral"):
        raise PosencError(f"rope_type must be 'axial' or 'axial_pixtral', got {rope_type!r}")
    cfg = RopeConfig(rope_type=rope_type, theta=base, head_dim=x.shape[-1])
    inv, _ = rope_type_function(rope_type)(cfg, None)
    axes = torch.as_tensor(rope_type_function(rope_type).axes(cfg), dtype=torch.long)
    return _apply((x,), positions, inv, axes, AXIAL_AXES, layout, cfg.rotary_dim, 1.0)[0]
