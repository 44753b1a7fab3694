"""``posenc plot KIND --out FILE.png``: pictures of what positional encodings do.

Kinds:
    sinusoidal  the lesson's exercise 1: the PE matrix as a heatmap (max_len=512, d=128), with the stripe period
                MEASURED per dimension pair from the matrix (zero crossings) next to 2*pi*base^(2i/d).
    rope        wavelength 2*pi/inv_freq per pair (log scale) for a config file or flags, the original context
                drawn, each pair marked kept / blended / interpolated (the registry's bands).
    scaling     PI, static NTK, dynamic NTK (at the target length), YaRN, Llama 3 and LongRoPE side by side.
    alibi       per-head bias heatmaps and the slopes for a head count.
    decay       RoPE's long-term decay: expected q.k vs relative distance, for one or several bases / a config.

Each ``plot_*`` function writes a PNG atomically and returns a dict of the numbers it drew (so tests and users can
check them). Frequencies always come from the scaling registry; matplotlib (Agg, no pyplot state) is imported
only when a plot is drawn.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from posenc._internal.validate import even_int, positive_float
from posenc._internal.errors import PosencError
from posenc.rope.contexts import MAX_CONTEXT, claimed_context
# the plumbing and the RoPE-frequency plots live in their own modules; their public names are re-exported here
from posenc.tools.plot_common import MAX_ALIBI_HEADS, MAX_ALIBI_SEQ, MAX_DIM, MAX_POINTS, MAX_TABLE  # noqa: F401
from posenc.tools.plot_common import check_size, figure, save_png
from posenc.tools.plot_frequencies import (BAND_COLOURS, DEFAULT_FACTOR, DEFAULT_HEAD_DIM,  # noqa: F401 (re-exported)
                                           DEFAULT_ORIGINAL, DEFAULT_THETA, plot_rope, plot_scaling, rope_mapping,
                                           scaling_methods)

HELP = "Draw positional-encoding plots: sinusoidal, rope, scaling, alibi, decay."

KINDS = ("sinusoidal", "rope", "scaling", "alibi", "decay")


# ---------------------------------------------------------------------------------------------- sinusoidal

def measure_periods(pe: torch.Tensor) -> list[float | None]:
    """Measure each pair's period (in positions) from a sinusoidal table pe [max_len, d] by its sign changes.

    Column 2i is sin(pos * w_i): consecutive sign changes are half a period apart, so the period is
    2 * (last crossing - first crossing) / (number of crossings - 1), with crossings located by linear
    interpolation. None when the column changes sign fewer than twice (period longer than ~the table).
    """
    periods: list[float | None] = []
    table = pe.double()
    for col in range(0, table.shape[1], 2):
        c = table[:, col]
        i = torch.nonzero(c[:-1] * c[1:] < 0).flatten()
        if len(i) < 2:
            periods.append(None)
            continue
        crossings = i.double() + c[i] / (c[i] - c[i + 1])
        periods.append(float(2 * (crossings[-1] - crossings[0]) / (len(crossings) - 1)))
    return periods


def plot_sinusoidal(out, *, max_len: int = 512, dim: int = 128, base: float = 10000.0) -> dict[str, Any]:
    """Exercise 1: heatmap of the sinusoidal table [max_len, dim] plus the measured stripe period per pair.

    Returns {"path", "measured_period" [dim/2, None = longer than the table], "expected_period",
    "stripe_width" (half period), "grows_with_dim" (measured periods non-decreasing)}.
    """
    from posenc.absolute import sinusoidal

    check_size(max_len, "max_len", MAX_CONTEXT)
    check_size(dim, "dim", MAX_DIM)
    if max_len * dim > MAX_TABLE:
        raise PosencError(f"max_len x dim must be at most {MAX_TABLE:,} table cells, got {max_len} x {dim}")
    base = positive_float(base, "base")
    even_int(dim, "dim")
    pe = sinusoidal(max_len, dim, base)                       # [max_len, dim]
    measured = measure_periods(pe)
    expected = [2 * math.pi * base ** (2 * i / dim) for i in range(dim // 2)]
    finite = [p for p in measured if p is not None]
    grows = all(a <= b * 1.001 for a, b in zip(finite, finite[1:])) and \
        all(p is None for p in measured[len(finite):])        # unmeasurable ones are all at the end

    fig = figure(14, 6)
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.4, 1])
    im = ax.imshow(pe.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_title(f"Sinusoidal PE matrix (max_len={max_len}, d={dim}, base={base:g})")
    ax.set_xlabel("embedding dimension (2i = sin, 2i+1 = cos)")
    ax.set_ylabel("position")
    fig.colorbar(im, ax=ax, label="PE value")
    for pair in (0, dim // 8, dim // 4, 3 * dim // 8):
        p = measured[pair]
        label = f"period ~{p:.0f}" if p is not None else f"period > {max_len}"
        ax.annotate(label, xy=(2 * pair, max_len * 0.04), color="black", fontsize=8,
                    rotation=90, va="top", bbox={"facecolor": "white", "alpha": 0.7, "lw": 0})
    pairs = list(range(dim // 2))
    ax2.semilogy(pairs, expected, "-", color="tab:blue", label=r"formula $2\pi \cdot base^{2i/d}$")
    ax2.semilogy([i for i, p in enumerate(measured) if p is not None], finite, "o", ms=4, color="tab:red",
                 label="measured from the matrix (zero crossings)")
    ax2.axhline(max_len, color="gray", ls="--", lw=1, label=f"table length {max_len}")
    ax2.set_title("Stripe period per pair: grows with the dimension index"
                  + ("" if grows else " (NOT monotonic!)"))
    ax2.set_xlabel("pair index i (dims 2i, 2i+1)")
    ax2.set_ylabel("period (positions); stripe width = half")
    ax2.legend(loc="upper left", fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    path = save_png(fig, out)
    return {"path": str(path), "measured_period": measured, "expected_period": expected,
            "stripe_width": [None if p is None else p / 2 for p in measured], "grows_with_dim": grows}


# --------------------------------------------------------------------------------------------------- alibi

def plot_alibi(out, *, n_heads: int = 8, seq_len: int = 16, max_panels: int = 8) -> dict[str, Any]:
    """Per-head ALiBi bias heatmaps (-m_h|i-j|, seq_len x seq_len) for up to max_panels heads, plus all slopes.

    Returns {"path", "slopes", "heads_shown"}.
    """
    from posenc.alibi import alibi_bias, alibi_slopes

    check_size(n_heads, "n_heads", MAX_ALIBI_HEADS)
    check_size(seq_len, "seq_len", MAX_ALIBI_SEQ)
    check_size(max_panels, "max_panels")
    slopes = alibi_slopes(n_heads)
    bias = alibi_bias(n_heads, seq_len)                        # [H, T, T]
    shown = sorted({round(k * (n_heads - 1) / max(min(n_heads, max_panels) - 1, 1))
                    for k in range(min(n_heads, max_panels))})
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols) + 1
    fig = figure(3.4 * cols + 1, 3.1 * rows)
    grid = fig.add_gridspec(rows, cols)
    vmin = float(bias.min())
    for k, h in enumerate(shown):
        ax = fig.add_subplot(grid[k // cols, k % cols])
        im = ax.imshow(bias[h].numpy(), cmap="viridis", vmin=vmin, vmax=0)
        ax.set_title(f"head {h}: m = 2^{math.log2(float(slopes[h])):.3g}", fontsize=10)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    fig.colorbar(im, ax=fig.axes, label=r"bias $-m_h |i-j|$", shrink=0.8)
    ax = fig.add_subplot(grid[rows - 1, :])
    ax.bar(range(n_heads), slopes.tolist(), color="tab:blue")
    ax.set_yscale("log", base=2)
    ax.set_title(f"ALiBi slopes for {n_heads} heads (geometric; the paper's rule for any head count)")
    ax.set_xlabel("head h")
    ax.set_ylabel("slope m_h (log2 scale)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"ALiBi: score[h, i, j] += -m_h |i - j|   ({seq_len} x {seq_len}; causal models use the lower "
                 "triangle)", fontsize=12)
    path = save_png(fig, out)
    return {"path": str(path), "slopes": slopes.tolist(), "heads_shown": shown}


# --------------------------------------------------------------------------------------------------- decay

def rope_decay(inv_freq: torch.Tensor, distances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Long-term decay curves for frequencies inv_freq [P] at relative distances [N], in float64.

    expected[n] = mean_j cos(m_n * inv_j): E[q . R(m) k] / E[q . k] when q = k is a random (isotropic) vector,
    i.e. the score a token gives an identical token m positions away, relative to distance 0.
    bound[n] = (1/P) sum_j |S_j|, S_j = sum_{k<=j} exp(i m_n inv_k): RoFormer's (Su et al., section 3.4.3)
    upper bound on |q . R(m) k| for slowly varying content, divided by its value (P+1)/2 at distance 0.
    """
    angles = distances.double()[:, None] * inv_freq.double()[None, :]           # [N, P]
    expected = torch.cos(angles).mean(dim=1)
    partial = torch.cumsum(torch.polar(torch.ones_like(angles), angles), dim=1)  # S_j, complex [N, P]
    bound = partial.abs().mean(dim=1) / ((len(inv_freq) + 1) / 2)
    return expected, bound


def plot_decay(out, *, bases: Sequence[float] = (10000.0,), head_dim: int = 128, max_distance: int = 65536,
               configs: Sequence = (), points: int = 1500) -> dict[str, Any]:
    """RoPE's expected q.k (and RoFormer's bound) vs relative distance, log distance axis, per base / config.

    Returns {"path", "distances", "curves": {label: {"expected", "bound"}}}.
    """
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import rope_parameters

    check_size(head_dim, "head_dim", MAX_DIM)
    check_size(max_distance, "max_distance", MAX_CONTEXT)
    check_size(points, "points", MAX_POINTS)
    even_int(head_dim, "head_dim")
    freqs: dict[str, torch.Tensor] = {}
    for b in bases:
        freqs[f"base {positive_float(b, 'base'):g} (d={head_dim})"] = default_inv_freq(head_dim, float(b))
    for c in configs:
        from posenc.rope.config import load_rope_config

        rc = load_rope_config(rope_mapping(c))   # --head-dim sizes the --base curves only
        claimed, _ = claimed_context(rc)
        inv, _ = rope_parameters(rc, claimed)
        name = Path(os.fspath(c)).stem if isinstance(c, (str, os.PathLike)) else "config"
        freqs[f"{name} ({rc.rope_type})"] = inv[inv > 0]
    if not freqs:
        raise PosencError("give at least one base or config")
    distances = torch.unique(torch.cat([torch.arange(1, min(64, max_distance + 1)),
                                        torch.logspace(0, math.log10(max_distance), points).round().long()]))
    fig = figure(14, 5.8)
    ax, ax2 = fig.subplots(1, 2)
    curves = {}
    x = distances.tolist()
    for label, inv in freqs.items():
        expected, bound = rope_decay(inv, distances)
        ax.semilogx(x, expected.tolist(), lw=1.2, label=label)
        ax2.semilogx(x, bound.tolist(), lw=1.2, label=label)
        curves[label] = {"expected": expected.tolist(), "bound": bound.tolist()}
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_title("Expected q.k for identical content vs distance\n"
                 r"$\mathrm{mean}_j \cos(m\,\theta_j)$ (1 at distance 0)")
    ax.set_xlabel("relative distance m (tokens, log scale)")
    ax.set_ylabel("relative expected score")
    ax.legend(fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax2.set_title("Long-term decay: RoFormer's bound on |q.k|\n"
                  r"$\frac{1}{d/2}\sum_j |S_j|,\ S_j = \sum_{k \leq j} e^{i m \theta_k}$")
    ax2.set_xlabel("relative distance m (tokens, log scale)")
    ax2.set_ylabel("relative upper bound (1 at distance 0)")
    ax2.legend(fontsize=9)
    ax2.grid(True, which="both", alpha=0.3)
    path = save_png(fig, out)
    return {"path": str(path), "distances": distances.tolist(), "curves": curves}


# ------------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser) -> None:
    from posenc._internal.flags import add_shared

    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser("sinusoidal", help="exercise 1: the sinusoidal PE heatmap + measured stripe widths")
    p.add_argument("--max-len", type=int, default=512, help="positions (rows), default 512")
    p.add_argument("--dim", type=int, default=128, help="model dimension (columns), default 128")
    p.add_argument("--base", type=float, default=10000.0, help="sinusoid base, default 10000")

    p = kinds.add_parser("rope", help="wavelength per pair for a config or flags, bands marked")
    p.add_argument("--config", help="a Hugging Face config.json (else the flags below); the flags below that are "
                                    "given override the config's values")
    p.add_argument("--head-dim", type=int, default=None, help=f"head dimension (default {DEFAULT_HEAD_DIM})")
    p.add_argument("--theta", type=float, default=None, help=f"rope_theta (default {DEFAULT_THETA:g})")
    p.add_argument("--rope-type", default=None,
                   help="a registered rope_type: default, linear, ntk, dynamic, yarn, llama3, longrope, ... "
                        "(default: default)")
    add_shared(p, "factor", default=None, help="scaling factor s")
    p.add_argument("--original", type=int, help="original (pre-extension) context length")
    p.add_argument("--max-position-embeddings", type=int, help="the context the config claims")
    p.add_argument("--seq-len", type=int, help="length for length-dependent types (dynamic, longrope)")

    p = kinds.add_parser("scaling", help="every registered extension method side by side (PI, NTK, YaRN, ...)")
    p.add_argument("--config", help="take geometry, original context, factor (claimed / original) and searched "
                                    "LongRoPE factors from this config; the flags below that are given override it")
    p.add_argument("--head-dim", type=int, default=None, help=f"head dimension (default {DEFAULT_HEAD_DIM})")
    p.add_argument("--theta", type=float, default=None, help=f"rope_theta (default {DEFAULT_THETA:g})")
    p.add_argument("--original", type=int, default=None, help=f"original context L0 (default {DEFAULT_ORIGINAL})")
    add_shared(p, "factor", default=None, help=f"extension factor s (default {DEFAULT_FACTOR:g})")

    p = kinds.add_parser("alibi", help="per-head ALiBi bias heatmaps and slopes")
    p.add_argument("--heads", type=int, default=8, help="number of heads (default 8)")
    p.add_argument("--seq-len", type=int, default=16, help="heatmap size (default 16)")

    p = kinds.add_parser("decay", help="RoPE long-term decay vs relative distance")
    p.add_argument("--base", type=float, action="append", help="RoPE base (repeatable; default 10000)")
    p.add_argument("--config", action="append", default=[], help="a config.json (repeatable)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension for --base curves (default 128)")
    p.add_argument("--max-distance", type=int, default=65536, help="largest distance drawn (default 65536)")

    for sub in kinds.choices.values():
        add_shared(sub, "out", required=True, help="PNG file to write")


def _print_sinusoidal(result: dict[str, Any]) -> None:
    measured, expected = result["measured_period"], result["expected_period"]
    print("pair  dims      measured period  stripe width  formula 2*pi*base^(2i/d)")
    step = max(1, len(measured) // 16)
    for i in range(0, len(measured), step):
        m = measured[i]
        text = f"{m:15.2f}  {m / 2:12.2f}" if m is not None else f"{'> table':>15}  {'> table':>12}"
        print(f"{i:4d}  {2 * i:3d},{2 * i + 1:<4d} {text}  {expected[i]:14.2f}")
    print("stripe width grows with the dimension index: " + ("yes" if result["grows_with_dim"] else "NO"))


def run(args) -> int:
    kind = args.kind
    if kind == "sinusoidal":
        result = plot_sinusoidal(args.out, max_len=args.max_len, dim=args.dim, base=args.base)
        _print_sinusoidal(result)
    elif kind == "rope":
        result = plot_rope(args.out, args.config, head_dim=args.head_dim, theta=args.theta,
                           rope_type=args.rope_type, factor=args.factor, original=args.original,
                           max_position_embeddings=args.max_position_embeddings, seq_len=args.seq_len)
        counts = {b: result["labels"].count(b) for b in BAND_COLOURS if b in result["labels"]}
        print("pairs: " + ", ".join(f"{n} {b}" for b, n in counts.items()))
    elif kind == "scaling":
        result = plot_scaling(args.out, args.config, head_dim=args.head_dim, theta=args.theta,
                              original=args.original, factor=args.factor)
        for name, m in result["methods"].items():
            counts = {b: m["labels"].count(b) for b in BAND_COLOURS if b in m["labels"]}
            print(f"{name:30s} attention x{m['attention_scaling']:.4g}; "
                  + ", ".join(f"{n} {b}" for b, n in counts.items()))
    elif kind == "alibi":
        result = plot_alibi(args.out, n_heads=args.heads, seq_len=args.seq_len)
        print("slopes: " + ", ".join(f"2^{math.log2(s):.3g}" for s in result["slopes"]))
    else:
        result = plot_decay(args.out, bases=args.base or ([] if args.config else [10000.0]),
                            head_dim=args.head_dim, max_distance=args.max_distance, configs=args.config)
    print(f"wrote {result['path']}")
    return 0
