"""RoPE's frequencies and their cos/sin: inv_freq[j] = base^(-2j/d), computed as transformers computes it.

The one owner of the default frequencies (``default_inv_freq``, ``base_powers``: every scaled type in
posenc.rope.scaling builds on them), of the cos/sin of positions x frequencies (``rope_cos_sin``), of the dtype RoPE's
arithmetic runs in (``math_dtype``) and of the check that a given inv_freq is usable (``checked_inv_freq``).
posenc.rope.apply rotates with them and re-exports the public names.
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_float, even_int
from posenc.angles import angles_cos_sin
from posenc._internal.errors import PosencError
from posenc.positions import INT_DTYPES, as_positions, check_position_dtype


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
    inv64 = checked_inv_freq(inv_freq, positions.device)
    return angles_cos_sin(positions, inv64, attention_scaling, dtype)


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE's arithmetic runs in: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def checked_inv_freq(inv_freq, device) -> torch.Tensor:
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
