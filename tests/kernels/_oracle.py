"""Shared oracle for the kernel tests: the lesson's per-vector loops (posenc.reference) over every row."""

from __future__ import annotations

import torch

from posenc import reference

LAYOUT_REF = {"interleaved": reference.apply_rope, "half": reference.apply_rope_half}


def reference_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: list[float], layout: str, rotary_dim: int,
                   attention_scaling: float = 1.0, inverse: bool = False) -> torch.Tensor:
    """RoPE of x [..., dim] at positions (broadcastable to x.shape[:-1]) by the plain-Python loops, float64.

    ``inverse`` rotates by minus the angle (what a backward pass applies).
    """
    pos = torch.as_tensor(positions).double().expand(x.shape[:-1]).reshape(-1).tolist()
    rows = x.double().reshape(-1, x.shape[-1]).tolist()
    sign = -1.0 if inverse else 1.0
    out = [LAYOUT_REF[layout](r[:rotary_dim], sign * p, inv_freq=inv_freq, attention_scaling=attention_scaling)
           + r[rotary_dim:] for r, p in zip(rows, pos)]
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for a kernel output against the float64 oracle: one rounding of the output dtype plus
    fp32 math error (fp32 tables/angles carry ~1e-7 relative error)."""
    return {torch.float64: (1e-12, 1e-12), torch.float32: (5e-6, 5e-6),
            torch.bfloat16: (1e-5, 2 ** -8), torch.float16: (1e-5, 2 ** -11)}[dtype]


def assert_close_to_oracle(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = tolerance(dtype)
    err = (out.double() - ref).abs()
    bound = atol + rtol * ref.abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g} (dtype {dtype})"
