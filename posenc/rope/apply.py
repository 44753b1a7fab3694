"""Rotary position embedding (RoPE): the math, in one place.

Each pair of dimensions of a query/key at position p is rotated by the angle p * inv_freq[j]:

    [x'_a]   [cos  -sin] [x_a]
    [x'_b] = [sin   cos] [x_b]          inv_freq[j] = base^(-2j/d)   (j = 0 .. d/2 - 1)

Layouts (same math up to a permutation of the head dimension, see ``interleaved_to_half_permutation``):
    "interleaved": pair j = (2j, 2j+1)       the lesson, GPT-J, Meta's original Llama, torchtune
    "half":        pair j = (j, j + d/2)     GPT-NeoX, Hugging Face ``rotate_half``, vLLM neox

Angles are computed in float64 and cos/sin tables kept in float32 whatever the activation dtype: bf16 cannot
even hold position 257, and fp32 angles drift by ~pos * 6e-8 rad.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc._validate import even_int, positive_float
from posenc.errors import PosencError

LAYOUTS = ("interleaved", "half")


def default_inv_freq(dim: int, base: float = 10000.0, device: torch.device | str | None = None) -> torch.Tensor:
    """inv_freq[j] = base^(-2j/dim) for j < dim/2, as float32 [dim // 2].

    Computed exactly as Hugging Face transformers does (float32 exponent and power), so scaled variants built
    on it match transformers bit for bit.
    """
    even_int(dim, "dim")
    base = positive_float(base, "base")
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    return 1.0 / (base ** exponent)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions * inv_freq, each of shape [*positions.shape, len(inv_freq)] in ``dtype``.

    ``dtype`` is float32 (the table every activation dtype uses) or float64 (for float64 inputs).
    Both are multiplied by ``attention_scaling`` (transformers' convention: logits then scale by its square).
    The angle is formed in float64 so that large positions (1e5 and beyond) keep full precision.
    """
    positions = check_position_dtype(torch.as_tensor(positions))
    if not math.isfinite(attention_scaling):
        raise PosencError(f"attention_scaling must be a finite number, got {attention_scaling!r}")
    inv_freq = torch.as_tensor(inv_freq, device=positions.device)
    if inv_freq.dim() != 1:
        raise PosencError(f"inv_freq must be 1-D [rotary_dim // 2], got shape {tuple(inv_freq.shape)}")
    angle = positions.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)   # [..., R/2]
    cos, sin = angle.cos(), angle.sin()
    if attention_scaling != 1.0:
        cos, sin = cos * attention_scaling, sin * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def check_position_dtype(positions: torch.Tensor) -> torch.Tensor:
    """Reject position dtypes that cannot hold positions exactly (bf16 rounds 257 to 256; fp16 stops at 65504)."""
    if positions.is_complex() or positions.dtype == torch.bool:
        raise PosencError(f"positions must be integers or real numbers, got dtype {positions.dtype}")
    if positions.dtype in (torch.float16, torch.bfloat16):
        raise PosencError(f"positions must be integers, float32 or float64, got {positions.dtype}: half precision "
                          "cannot represent positions exactly (bf16 rounds 257 to 256)")
    return positions


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE's arithmetic runs in: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise PosencError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _resolve_rotary(dim: int, rotary_dim: int | None, base: float,
                    inv_freq: torch.Tensor | Sequence[float] | None, device) -> tuple[int, torch.Tensor]:
    """Validate rotary_dim / inv_freq against the head dim; return (rotary_dim, inv_freq float32 [R/2])."""
    if rotary_dim is None:
        rotary_dim = dim if inv_freq is None else 2 * len(inv_freq)
    even_int(rotary_dim, "rotary_dim")
    if rotary_dim > dim:
        raise PosencError(f"rotary_dim must be <= the head dim {dim}, got {rotary_dim}")
    if inv_freq is None:
        inv_freq = default_inv_freq(rotary_dim, base, device=device)
    else:
        inv_freq = torch.as_tensor(inv_freq, device=device)
        if inv_freq.shape != (rotary_dim // 2,):
            raise PosencError(f"inv_freq must have shape [rotary_dim // 2] = [{rotary_dim // 2}], "
                              f"got {tuple(inv_freq.shape)}")
    return rotary_dim, inv_freq


def _check_positions(positions, x: torch.Tensor) -> torch.Tensor:
    """positions as a tensor broadcastable to x.shape[:-1] ([seq], [batch, 1, seq], ...)."""
    if x.dim() < 2:
        raise PosencError(f"x must have shape [..., seq, dim], got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise PosencError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    positions = check_position_dtype(torch.as_tensor(positions, device=x.device))
    if positions.dim() == 0:
        positions = positions.reshape(1)
    lead = x.shape[:-1]
    # positions broadcast to lead iff, aligned from the right, each of its dims is 1 or equal (plain Python:
    # torch.broadcast_shapes costs ~50 us, more than rotating a decode step)
    ok = positions.dim() <= len(lead) and all(
        p in (1, n) for p, n in zip(reversed(positions.shape), reversed(lead)))
    if not ok:
        raise PosencError(
            f"positions must have shape [seq] = [{x.shape[-2]}] or be broadcastable to x.shape[:-1] = "
            f"{list(lead)} (e.g. [batch, 1, seq] for x [batch, heads, seq, dim]); got {list(positions.shape)}")
    return positions


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


def _check_out(out, xs: Sequence[torch.Tensor], inplace: bool, name: str) -> list[torch.Tensor] | None:
    """Validate ``out`` (one tensor per rotated input) against the inputs; return it as a list or None."""
    if out is None:
        return None
    if inplace:
        raise PosencError("give either inplace=True or out=, not both")
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if len(outs) != len(xs) or not all(isinstance(o, torch.Tensor) for o in outs):
        raise PosencError(f"{name} must be {'a tensor' if len(xs) == 1 else f'a tuple of {len(xs)} tensors'} "
                          f"like the input(s), got {type(out).__name__}")
    for o, x in zip(outs, xs):
        if o.shape != x.shape or o.dtype != x.dtype or o.device != x.device:
            raise PosencError(f"{name} must match the input's shape, dtype and device {list(x.shape)} {x.dtype} "
                              f"{x.device}; got {list(o.shape)} {o.dtype} {o.device}")
    return outs


def _rotate_fast(xs: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, layout: str, rotary_dim: int,
                 inplace: bool, outs: list[torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
    """Rotate each of xs with one table through posenc.kernels (C on CPU, Triton on CUDA, autograd included).

    Differentiable frequencies (cos/sin requiring grad, e.g. a learned inv_freq) take the readable ``_rotate``,
    which autograd differentiates through the table too.
    """
    if not (cos.requires_grad or sin.requires_grad):
        from posenc.kernels.rope_dispatch import rope
        return rope(xs, cos, sin, layout=layout, rotary_dim=rotary_dim, inplace=inplace, out=outs)
    if inplace or outs is not None:
        raise PosencError("inplace=True and out= cannot be used while autograd tracks the frequencies "
                          "(inv_freq requires grad); call without them or under torch.no_grad()")
    return tuple(_rotate(x, cos, sin, layout, rotary_dim) for x in xs)


def apply_rope(x: torch.Tensor, positions, *, base: float = 10000.0,
               inv_freq: torch.Tensor | Sequence[float] | None = None, layout: str = "interleaved",
               rotary_dim: int | None = None, attention_scaling: float = 1.0, inplace: bool = False,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x by RoPE at the given positions.

    Args:
        x: [..., seq, dim] queries or keys (any float dtype; math runs in float32, output in x.dtype).
        positions: [seq] or broadcastable to x.shape[:-1] (e.g. [batch, 1, seq] for x [batch, heads, seq, dim]);
            integers or floats, any offset (KV-cache continuation, packed sequences).
        base: RoPE theta, used when ``inv_freq`` is not given.
        inv_freq: [rotary_dim // 2] frequencies overriding base (scaled variants: see ``posenc.rope_parameters``).
        layout: "interleaved" (pairs 2j, 2j+1) or "half" (pairs j, j + rotary_dim/2).
        rotary_dim: rotate only the first rotary_dim dims (partial rotary); the rest pass through.
        attention_scaling: multiplies cos and sin (transformers' YaRN/LongRoPE convention).
        inplace: overwrite x (no output allocation; not allowed when x requires grad).
        out: a preallocated tensor like x to write into.
    Returns:
        Tensor with x's shape and dtype (x itself if inplace, ``out`` if given).

    Runs the fused kernel for the device (posenc.kernels: C on CPU, Triton on CUDA): one pass over x, no
    temporaries the size of x, fp32 math for half-precision inputs; ``_rotate`` is the readable equivalent.
    """
    _check_layout(layout)
    positions = _check_positions(positions, x)
    outs = _check_out(out, (x,), inplace, "out")
    rotary_dim, inv_freq = _resolve_rotary(x.shape[-1], rotary_dim, base, inv_freq, x.device)
    cos, sin = rope_cos_sin(positions, inv_freq, attention_scaling, math_dtype(x.dtype))
    return _rotate_fast((x,), cos, sin, layout, rotary_dim, inplace, outs)[0]


def apply_rope_qk(q: torch.Tensor, k: torch.Tensor, positions, *, base: float = 10000.0,
                  inv_freq: torch.Tensor | Sequence[float] | None = None, layout: str = "interleaved",
                  rotary_dim: int | None = None, attention_scaling: float = 1.0, inplace: bool = False,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on queries and keys at the same positions, sharing one cos/sin table (one launch on CUDA).

    q: [..., Hq, seq, dim], k: [..., Hk, seq, dim] (Hk may differ from Hq: grouped-query attention).
    inplace: overwrite q and k; out: (q_out, k_out) preallocated like q and k.
    Returns (q_rotated, k_rotated) in their input dtypes.
    """
    _check_layout(layout)
    if q.shape[-1] != k.shape[-1] or q.shape[-2] != k.shape[-2]:
        raise PosencError(f"q and k must share seq and dim (the last two dims); got q {list(q.shape)}, "
                          f"k {list(k.shape)}")
    positions_q = _check_positions(positions, q)
    _check_positions(positions, k)
    rotary_dim, inv_freq = _resolve_rotary(q.shape[-1], rotary_dim, base, inv_freq, q.device)
    if q.dtype != k.dtype:
        raise PosencError(f"q and k must share a dtype, got q {q.dtype}, k {k.dtype}")
    outs = _check_out(out, (q, k), inplace, "out")
    cos, sin = rope_cos_sin(positions_q, inv_freq, attention_scaling, math_dtype(q.dtype))
    q_rot, k_rot = _rotate_fast((q, k), cos, sin, layout, rotary_dim, inplace, outs)
    return q_rot, k_rot


def apply_rope_table(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "interleaved",
                     rotary_dim: int | None = None, inplace: bool = False,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x with a precomputed cos/sin table (from ``rope_cos_sin`` or a multimodal/axial builder).

    x: [..., seq, dim]; cos, sin: [..., seq, rotary_dim // 2], broadcastable against x.shape[:-1] (e.g. [seq, R/2]
    or [batch, 1, seq, R/2]), float32 (float64 for float64 x): the table's dtype is the math dtype.
    rotary_dim defaults to 2 * cos.shape[-1]; the dims past it pass through. Same kernels as ``apply_rope``.
    """
    _check_layout(layout)
    if x.dim() < 2 or not x.is_floating_point():
        raise PosencError(f"x must be a floating-point tensor [..., seq, dim], got {x.dtype} {tuple(x.shape)}")
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor) or cos.shape != sin.shape:
        raise PosencError("cos and sin must be tensors of one shape [..., seq, rotary_dim // 2]")
    if cos.dtype != math_dtype(x.dtype) or sin.dtype != cos.dtype:
        raise PosencError(f"cos/sin must be {math_dtype(x.dtype)} for x of dtype {x.dtype}, got {cos.dtype}")
    if rotary_dim is None:
        rotary_dim = 2 * cos.shape[-1]
    even_int(rotary_dim, "rotary_dim")
    if rotary_dim > x.shape[-1] or cos.shape[-1] != rotary_dim // 2:
        raise PosencError(f"cos/sin last dim must be rotary_dim // 2 = {rotary_dim // 2} with rotary_dim <= "
                          f"{x.shape[-1]}, got {cos.shape[-1]}")
    lead = x.shape[:-1]
    if cos.dim() - 1 > len(lead) or not all(c in (1, n) for c, n in zip(reversed(cos.shape[:-1]), reversed(lead))):
        raise PosencError(f"cos/sin leading dims {list(cos.shape[:-1])} must broadcast to x.shape[:-1] {list(lead)}")
    outs = _check_out(out, (x,), inplace, "out")
    return _rotate_fast((x,), cos, sin, layout, rotary_dim, inplace, outs)[0]


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
