"""Oracles and helpers shared by test files: the lesson's per-vector loops (posenc.reference) over every row, a
float64 ALiBi attention, and the profiler's peak memory.

It lives in tests/_support, which pyproject.toml's [tool.pytest.ini_options] pythonpath puts on sys.path, and is
imported by its own unique top-level name: the test folders are not packages, so no import mode of any pytest
version decides what they are called (a test package called `kernels` once shadowed the `kernels` distribution).
"""

from __future__ import annotations

import itertools
import math

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


def alibi_oracle(q, k, v, slopes=None, causal=True, offset=None, scale=None):
    """softmax(q k^T * scale + ALiBi bias) v in float64 from the full [H, Tq, Tk] bias (GQA by repetition)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    offset = Tk - Tq if offset is None else offset
    m = torch.tensor(reference.alibi_slopes(H) if slopes is None else slopes, dtype=torch.float64)
    i = torch.arange(Tq, dtype=torch.float64).unsqueeze(1) + offset
    j = torch.arange(Tk, dtype=torch.float64).unsqueeze(0)
    bias = -m.view(H, 1, 1) * (i - j).abs()
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    kk = k.double().repeat_interleave(H // Hkv, dim=1)
    vv = v.double().repeat_interleave(H // Hkv, dim=1)
    scores = q.double() @ kk.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(D)) + bias
    return torch.softmax(scores, dim=-1) @ vv


def qkv(B, H, Hkv, Tq, Tk, D=16, dtype=torch.float32, seed=0):
    """Seeded normal q [B, H, Tq, D], k and v [B, Hkv, Tk, D] in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, D, generator=g).to(dtype), torch.randn(B, Hkv, Tk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Tk, D, generator=g).to(dtype))


def peak_bytes(prof) -> int:
    """Most bytes held at once during a profiled call: its allocations and frees, in time order."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    return max(itertools.accumulate((e.nbytes() for e in events), initial=0))
