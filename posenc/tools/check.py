"""``posenc check``: the lesson's properties, measured and printed.

Each check returns a ``CheckResult`` with the measured number and the threshold it is held to; the command
prints them as a table and exits non-zero if any fails. Tests call the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc import reference
from posenc.absolute import sinusoidal
from posenc.alibi import alibi_bias, alibi_slopes
from posenc.rope.apply import apply_rope, default_inv_freq

HELP = "measure the lesson's properties: RoPE shift invariance and norms, ALiBi slopes, sinusoidal stripes"


@dataclass(frozen=True)
class CheckResult:
    name: str
    measured: float
    threshold: float
    passed: bool
    detail: str


def rope_shift_invariance(draws: int = 2000, dim: int = 64, max_pos: int = 10_000, seed: int = 0) -> CheckResult:
    """Rotate a, b at (pa, pb) and at (pa + k, pb + k): the dot products must agree (float32, relative to |a||b|)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(draws, 1, dim, generator=g), torch.randn(draws, 1, dim, generator=g)
    pa, pb, k = (torch.randint(0, max_pos, (draws, 1), generator=g) for _ in range(3))
    worst = 0.0
    for layout in ("interleaved", "half"):
        d0 = (apply_rope(a, pa, layout=layout) * apply_rope(b, pb, layout=layout)).sum(-1)
        d1 = (apply_rope(a, pa + k, layout=layout) * apply_rope(b, pb + k, layout=layout)).sum(-1)
        scale = a.norm(dim=-1) * b.norm(dim=-1)
        worst = max(worst, float(((d0 - d1).abs() / scale).max()))
    threshold = 1e-6
    return CheckResult("rope shift invariance", worst, threshold, worst <= threshold,
                       f"max |a(pa).b(pb) - a(pa+k).b(pb+k)| / (|a||b|) over {draws} draws x 2 layouts, "
                       f"dim {dim}, positions < {2 * max_pos}, float32")


def rope_norm_preservation(draws: int = 2000, dim: int = 64, seed: int = 1) -> CheckResult:
    """A rotation keeps every vector's norm."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(draws, 1, dim, generator=g)
    pos = torch.randint(0, 100_000, (draws, 1), generator=g)
    worst = max(float(((apply_rope(x, pos, layout=lay).norm(dim=-1) / x.norm(dim=-1)) - 1).abs().max())
                for lay in ("interleaved", "half"))
    threshold = 1e-6
    return CheckResult("rope norm preservation", worst, threshold, worst <= threshold,
                       f"max | |rope(x)| / |x| - 1 | over {draws} draws, positions < 100000, float32")


def rope_matches_reference(draws: int = 200, dim: int = 32, seed: int = 2) -> CheckResult:
    """The fast apply_rope against the lesson's loop, both layouts.

    The loop gets the same float32 frequencies (whose own error vs base^(-2j/d) in float64 is a separate,
    ulp-sized check): an ulp of inv_freq times a position of 5000 is ~1e-4 rad, which would swamp the comparison.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(draws, dim, dtype=torch.float64, generator=g)
    pos = torch.randint(0, 5000, (draws,), generator=g)
    fast_i = apply_rope(x, pos, layout="interleaved")
    fast_h = apply_rope(x, pos, layout="half")
    inv = default_inv_freq(dim).tolist()
    exact = [1.0 / (10000.0 ** (2 * j / dim)) for j in range(dim // 2)]
    freq_err = max(abs(a - b) / b for a, b in zip(inv, exact))
    worst = 0.0
    for n in range(draws):
        ref_i = torch.tensor(reference.apply_rope(x[n].tolist(), int(pos[n]), inv_freq=inv), dtype=torch.float64)
        ref_h = torch.tensor(reference.apply_rope_half(x[n].tolist(), int(pos[n]), inv_freq=inv),
                             dtype=torch.float64)
        worst = max(worst, float((fast_i[n] - ref_i).abs().max()), float((fast_h[n] - ref_h).abs().max()))
    threshold = 1e-6  # float32 cos/sin tables against float64 loops
    passed = worst <= threshold and freq_err <= 5e-7  # inv_freq within a few float32 ulps of the exact value
    return CheckResult("rope == lesson loop", worst, threshold, passed,
                       f"max abs difference, {draws} vectors, dim {dim}, both layouts; "
                       f"inv_freq relative error vs float64 formula {freq_err:.1e} (limit 5e-7)")


def alibi_slopes_geometric(max_heads: int = 64) -> CheckResult:
    """Within each power-of-two group the slopes are geometric, and they equal the paper's reference code."""
    worst = 0.0
    for n in range(1, max_heads + 1):
        s = alibi_slopes(n).double()
        worst = max(worst, float((s - torch.tensor(reference.alibi_slopes(n), dtype=torch.float64)).abs().max()))
        c = 2 ** int(math.floor(math.log2(n)))
        for group in (s[:c], s[c:]):
            if len(group) >= 3:
                ratios = group[1:] / group[:-1]
                worst = max(worst, float((ratios - ratios[0]).abs().max()))
    bias_ok = torch.allclose(alibi_bias(5, 7), torch.tensor(reference.alibi_bias(5, 7)), atol=1e-6)
    threshold = 1e-6
    passed = worst <= threshold and bias_ok
    return CheckResult("alibi slopes geometric", worst, threshold, passed,
                       f"max deviation from a constant ratio per group / from the reference, heads 1..{max_heads}; "
                       f"bias == reference: {bias_ok}")


def sign_changes_per_column(pe: torch.Tensor) -> torch.Tensor:
    """Number of sign changes down each column of a [n_positions, dim] table."""
    signs = torch.sign(pe)
    return (signs[1:] * signs[:-1] < 0).sum(dim=0)


def sinusoidal_stripes_widen(max_len: int = 512, dim: int = 128) -> CheckResult:
    """Sign changes down each sin column fall (weakly) as the frequency index grows: stripes get wider."""
    pe = sinusoidal(max_len, dim)
    changes = sign_changes_per_column(pe)[0::2]           # sin columns, one per frequency index
    increases = int((changes[1:] > changes[:-1]).sum())
    ref = torch.tensor(reference.sinusoidal(max_len // 8, dim))
    ref_diff = float((sinusoidal(max_len // 8, dim) - ref).abs().max())
    passed = increases == 0 and ref_diff <= 1e-6
    return CheckResult("sinusoidal stripes widen", float(increases), 0.0, passed,
                       f"columns where sign changes increase with frequency index (sin columns, {max_len}x{dim}): "
                       f"{increases}; sign changes: first {int(changes[0])}, i=8 {int(changes[8])}, "
                       f"last {int(changes[-1])}; table vs lesson loop max diff {ref_diff:.1e}")


CHECKS = (rope_shift_invariance, rope_norm_preservation, rope_matches_reference, alibi_slopes_geometric,
          sinusoidal_stripes_widen)


def run_checks() -> list[CheckResult]:
    return [check() for check in CHECKS]


def add_arguments(parser) -> None:
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")


def run(args) -> int:
    results = run_checks()
    width = max(len(r.name) for r in results)
    for r in results:
        if args.quiet and r.passed:
            continue
        status = "PASS" if r.passed else "FAIL"
        print(f"{status}  {r.name:<{width}}  measured {r.measured:.3g} (limit {r.threshold:.3g})  {r.detail}")
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0
