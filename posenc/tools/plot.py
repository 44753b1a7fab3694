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
from typing import Any, Mapping, Sequence

import torch

from posenc._atomic import atomic_path
from posenc._outputs import check_output
from posenc._validate import check_float, check_int, even_int, positive_float
from posenc.errors import ConfigError, PosencError
from posenc.extensions import METHODS
from posenc.rope.contexts import MAX_CONTEXT, claimed_context, trained_length

HELP = "Draw positional-encoding plots: sinusoidal, rope, scaling, alibi, decay."

KINDS = ("sinusoidal", "rope", "scaling", "alibi", "decay")
BAND_COLOURS = {"kept": "tab:green", "blended": "tab:orange", "interpolated": "tab:red", "removed": "tab:gray"}


# ------------------------------------------------------------------------------------------------ plumbing

def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without touching pyplot's global backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out: str | os.PathLike) -> Path:
    """Write fig as PNG to out atomically (temp file in the same folder, then os.replace)."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise PosencError(f"out must be a .png file name, got {str(out)!r}")
    check_output(out, f"out {out}")
    if not out.parent.exists():
        raise FileNotFoundError(f"output folder does not exist: {out.parent}")
    with atomic_path(out, make_parents=False) as tmp:
        fig.savefig(tmp, format="png")
    return out


def _positive_int(value, name: str, max: int | None = None) -> int:
    """A positive int, at most ``max`` (the sizes that keep a plot's memory bounded)."""
    return check_int(value, name, min=1, max=max)


# size limits: a plot never needs more, and past them the tables would not fit in memory
MAX_DIM = 8192          # head or model dimension
MAX_TABLE = 2**24       # cells of the sinusoidal table (positions x dim)
MAX_ALIBI_HEADS = 1024
MAX_ALIBI_SEQ = 256     # heatmap side
MAX_POINTS = 100_000


def _positive_float(value, name: str) -> float:
    return positive_float(value, name)


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

    _positive_int(max_len, "max_len", MAX_CONTEXT)
    _positive_int(dim, "dim", MAX_DIM)
    if max_len * dim > MAX_TABLE:
        raise PosencError(f"max_len x dim must be at most {MAX_TABLE:,} table cells, got {max_len} x {dim}")
    base = _positive_float(base, "base")
    even_int(dim, "dim")
    pe = sinusoidal(max_len, dim, base)                       # [max_len, dim]
    measured = measure_periods(pe)
    expected = [2 * math.pi * base ** (2 * i / dim) for i in range(dim // 2)]
    finite = [p for p in measured if p is not None]
    grows = all(a <= b * 1.001 for a, b in zip(finite, finite[1:])) and \
        all(p is None for p in measured[len(finite):])        # unmeasurable ones are all at the end

    fig = _figure(14, 6)
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
    path = _save(fig, out)
    return {"path": str(path), "measured_period": measured, "expected_period": expected,
            "stripe_width": [None if p is None else p / 2 for p in measured], "grows_with_dim": grows}


# ---------------------------------------------------------------------------------------------------- rope

# what plot rope / plot scaling draw when neither a flag nor a config says otherwise
DEFAULT_HEAD_DIM, DEFAULT_THETA, DEFAULT_ORIGINAL, DEFAULT_FACTOR = 128, 10000.0, 4096, 8.0


def _rope_mapping(config, *, head_dim: int | None = None, theta: float | None = None, rope_type: str | None = None,
                  factor: float | None = None, original: int | None = None,
                  max_position_embeddings: int | None = None) -> dict[str, Any]:
    """A config mapping from a file / mapping, or from flags. With both, the flags given (not None) override the
    config's values (the usual CLI rule: what is typed wins over what a file says)."""
    from posenc.tools._io import read_config
    from posenc.tools.inspect import detect_scheme

    if config is not None:
        cfg = read_config(config)
        scheme, why = detect_scheme(cfg)
        if scheme != "rope":
            raise PosencError(f"config does not use RoPE ({scheme}: {why}); nothing to plot")
        overrides = {k: v for k, v in (("head_dim", head_dim), ("theta", theta), ("rope_type", rope_type),
                                       ("factor", factor), ("original", original),
                                       ("max_position_embeddings", max_position_embeddings)) if v is not None}
        return _override(cfg, **overrides) if overrides else cfg
    head_dim = DEFAULT_HEAD_DIM if head_dim is None else head_dim
    theta = DEFAULT_THETA if theta is None else theta
    rope_type = "default" if rope_type is None else rope_type
    params: dict[str, Any] = {"rope_type": rope_type, "rope_theta": _positive_float(theta, "theta")}
    if factor is not None:
        _check_takes_factor(rope_type)
        params["factor"] = _positive_float(factor, "factor")
    if original is not None:
        params["original_max_position_embeddings"] = _positive_int(original, "original", MAX_CONTEXT)
    if rope_type in METHODS:  # a method's fixed parameters (Llama 3's low/high freq factors), from the registry
        for key, value in METHODS[rope_type].defaults.items():
            params.setdefault(key, value)
    lmax = max_position_embeddings
    if lmax is None and original is not None:
        lmax = int(original * (factor or 1)) if rope_type != "dynamic" else original
    _check_required_lengths(rope_type, original, lmax)
    mapping = {"head_dim": _positive_int(head_dim, "head_dim", MAX_DIM), "rope_parameters": params}
    if lmax is not None:
        mapping["max_position_embeddings"] = lmax
    return mapping


def _check_required_lengths(rope_type: str, original, lmax) -> None:
    """The lengths a rope type needs, named by the flags that give them (not by the config keys they fill)."""
    from posenc.rope.registry import rope_type_function

    required = rope_type_function(rope_type).required_keys
    if "original_max_position_embeddings" in required and original is None:
        raise ConfigError(f"--original: rope type {rope_type} needs the original (trained) context, e.g. --original "
                          "4096")
    if "max_position_embeddings" in required and lmax is None:
        raise ConfigError(f"--original or --max-position-embeddings: rope type {rope_type} needs the context its "
                          "length rule starts from")


def _takes_factor(rope_type: str) -> bool:
    from posenc.rope.registry import rope_type_function

    fn = rope_type_function(rope_type)        # ConfigError naming an unknown rope_type
    return "factor" in fn.required_keys or "factor" in fn.optional_keys


def _check_takes_factor(rope_type: str) -> None:
    if not _takes_factor(rope_type):
        raise PosencError(f"--factor does not apply to rope_type {rope_type!r} (it has no factor); give a --rope-type "
                          "that scales, e.g. linear or yarn")


def _override(cfg: Mapping[str, Any], **flags) -> dict[str, Any]:
    """A flat RoPE mapping holding what ``cfg`` says (as posenc.rope.config reads it), with the given flags in place
    of the config's values. A new rope_type keeps the config's factor and original context (unless those flags are
    given too) and takes the registry's fixed parameters for that method, not the old type's other keys."""
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import MULTI_AXIS_KEYS

    rc = load_rope_config(cfg)
    rope_type = flags.get("rope_type", rc.rope_type)
    if rope_type == rc.rope_type:
        params = dict(rc.params)
    else:   # the old type's own keys (low_freq_factor, short_factor...) do not belong to the new one
        params = {k: v for k, v in rc.params.items()
                  if k in MULTI_AXIS_KEYS or (k == "factor" and _takes_factor(rope_type))}
        for key, value in (METHODS[rope_type].defaults.items() if rope_type in METHODS else ()):
            params.setdefault(key, value)
    if "factor" in flags:
        _check_takes_factor(rope_type)
        params["factor"] = _positive_float(flags["factor"], "factor")
    theta = _positive_float(flags["theta"], "theta") if "theta" in flags else rc.theta
    original = (_positive_int(flags["original"], "original", MAX_CONTEXT) if "original" in flags
                else rc.original_max_position_embeddings)
    lmax = (_positive_int(flags["max_position_embeddings"], "max_position_embeddings", MAX_CONTEXT)
            if "max_position_embeddings" in flags else rc.max_position_embeddings)
    head_dim = _positive_int(flags["head_dim"], "head_dim", MAX_DIM) if "head_dim" in flags else rc.head_dim
    params.update(rope_type=rope_type, rope_theta=theta)
    if original is not None:
        params["original_max_position_embeddings"] = original
    mapping = {"head_dim": head_dim, "partial_rotary_factor": rc.partial_rotary_factor, "rope_parameters": params}
    if lmax is not None:
        mapping["max_position_embeddings"] = lmax
    return mapping


def plot_rope(out, config=None, *, head_dim: int | None = None, theta: float | None = None,
              rope_type: str | None = None, factor: float | None = None, original: int | None = None,
              max_position_embeddings: int | None = None, seq_len: int | None = None,
              title: str | None = None) -> dict[str, Any]:
    """Wavelength 2*pi/inv_freq per pair for a RoPE config (path / mapping) or flags, bands coloured.

    Without a config the flags describe the RoPE (None: head_dim 128, theta 10000, rope_type "default"); with one,
    each flag given overrides the config's value.

    seq_len: length at which length-dependent types (dynamic, longrope) are evaluated (default the claimed
    context). Returns {"path", "wavelength", "wavelength_unscaled", "labels", "original_context", "claimed_context"}.
    """
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import frequency_bands, rope_parameters
    from posenc.rope.config import load_rope_config
    mapping = _rope_mapping(config, head_dim=head_dim, theta=theta, rope_type=rope_type, factor=factor,
                            original=original, max_position_embeddings=max_position_embeddings)
    rc = load_rope_config(mapping)
    claimed, _ = claimed_context(rc)
    l0 = trained_length(rc)
    if seq_len is not None:
        _positive_int(seq_len, "seq_len", MAX_CONTEXT)
    at = seq_len or claimed or (2 * l0 if l0 else None)
    inv, attention = rope_parameters(rc, at)  # malformed values raise ConfigError naming the key
    labels = frequency_bands(rc, at)["labels"]
    base = default_inv_freq(rc.rotary_dim, rc.theta).double()
    wl = (2 * math.pi / inv.double()).tolist()                # inf for removed pairs (inv 0)
    wl0 = (2 * math.pi / base).tolist()

    fig = _figure(11, 6)
    ax = fig.subplots()
    pairs = range(len(wl))
    ax.semilogy(list(range(len(wl0))), wl0, "--", color="gray", lw=1.2, label=f"unscaled (theta={rc.theta:g})")
    for band, colour in BAND_COLOURS.items():
        idx = [j for j in pairs if labels[j] == band and math.isfinite(wl[j])]
        if idx:
            ax.semilogy(idx, [wl[j] for j in idx], "o", ms=5, color=colour, label=f"{band} ({len(idx)})")
    if l0:
        ax.axhline(l0, color="black", lw=1.2, ls=":", label=f"original context {l0:,}")
    if claimed and claimed != l0:
        ax.axhline(claimed, color="tab:purple", lw=1.2, ls="-.", label=f"claimed context {claimed:,}")
    name = title or (str(config) if isinstance(config, (str, os.PathLike)) else "RoPE")
    extra = f", factor {rc.params['factor']:g}" if isinstance(rc.params.get("factor"), (int, float)) else ""
    ax.set_title(f"{Path(name).name if isinstance(config, (str, os.PathLike)) else name}: rope_type "
                 f"{rc.rope_type}{extra}, rotary dim {rc.rotary_dim}, attention scaling {attention:.4g}"
                 + (f"\n(evaluated at {at:,} tokens)" if at else ""))
    ax.set_xlabel("frequency pair j (low j = high frequency)")
    ax.set_ylabel(r"wavelength $2\pi / \mathrm{inv\_freq}_j$ (tokens, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    path = _save(fig, out)
    return {"path": str(path), "wavelength": wl, "wavelength_unscaled": wl0, "labels": labels,
            "original_context": l0, "claimed_context": claimed, "attention_scaling": attention}


# ------------------------------------------------------------------------------------------------- scaling

def scaling_methods(*, head_dim: int = 128, theta: float = 10000.0, original: int = 4096, factor: float = 8.0,
                    partial_rotary_factor: float = 1.0, longrope: Mapping[str, Any] | None = None,
                    own: tuple[str, Mapping[str, Any], int | None] | None = None
                    ) -> dict[str, tuple[torch.Tensor, float, list[str]]]:
    """Display name -> (inv_freq, attention_scaling, band labels) for plain RoPE and every registered extension
    method (``posenc.extensions``), all from the rope-type registry, for one geometry.

    Methods that keep max_position_embeddings at the original length (dynamic NTK) are evaluated at the target
    length factor * original. LongRoPE uses ``longrope`` ({"short_factor", "long_factor"}) if given, else its
    unsearched initialisation (YaRN's per-pair ratio), labelled as such. Methods that compute their config from a
    trained model (``fit``) are skipped: there is no model here; so are fine-tuning modes (``train_positions``,
    PoSE), whose frequencies are their base method's. ``own`` = (rope_type, params, max_position_embeddings) of a
    config that already uses one of the methods: that method is drawn with the config's own parameters (Llama 3.1:
    llama3 at its factor 8, although its context claims 16x), labelled so.
    """
    from posenc.extensions import ExtensionSpec, method_config, method_names
    from posenc.rope.config import load_rope_config
    from posenc.rope.scaling import frequency_bands, rope_parameters

    target = int(round(original * factor))
    geometry = {"head_dim": head_dim, "partial_rotary_factor": partial_rotary_factor}

    def cfg(params, lmax):
        return {**geometry, "max_position_embeddings": lmax, "rope_parameters": {"rope_theta": theta, **params}}

    rc = load_rope_config(cfg({"rope_type": "default"}, original))
    spec = ExtensionSpec(original=original, factor=factor, rotary_dim=rc.rotary_dim, theta=theta, target=target,
                         head_dim=rc.head_dim)
    configs = {"default (no scaling)": cfg({"rope_type": "default"}, original)}
    for name in method_names("frequency"):  # attention methods keep the frequencies: nothing to plot here
        method = METHODS[name]
        if method.fit is not None or method.train_positions is not None:
            continue
        label = method.label
        options = {}
        if "short_factor" in method.options:
            if longrope is not None:
                options = {"short_factor": list(longrope["short_factor"]), "long_factor": list(longrope["long_factor"])}
                label += " (searched)"
            else:
                label += " (unsearched init)"
        if own is not None and own[0] == name and not options:
            own_factor = own[1].get("factor")
            label += " (this config" + (f", factor {own_factor:g})" if own_factor else ")")
            configs[label] = cfg({"rope_type": name, **own[1]}, own[2] or original)
            continue
        written = method_config(name, spec, **options)
        if method.keeps_original_length:
            label += f" (factor {factor:g}) @ {target:,}"
        configs[label] = cfg(written.scaling, written.max_position_embeddings)
    out = {}
    for name, c in configs.items():
        inv, attention = rope_parameters(c, target)
        out[name] = (inv, attention, frequency_bands(c, target)["labels"])
    return out


def _scaling_theta(theta) -> float:
    """The base plot scaling compares methods at: > 1, checked before any method is built, so a base that YaRN's
    ramp cannot use is one error (the base's own warning about theta <= 1 would come first otherwise)."""
    theta = _positive_float(theta, "theta")
    if theta <= 1:
        raise PosencError(f"theta must be > 1 to compare extension methods (YaRN's ramp needs frequencies that "
                          f"decrease with the pair index), got {theta:g}")
    return theta


def plot_scaling(out, config=None, *, head_dim: int | None = None, theta: float | None = None,
                 original: int | None = None, factor: float | None = None) -> dict[str, Any]:
    """PI, NTK, dynamic, YaRN, Llama 3 and LongRoPE side by side for one geometry.

    Without a config: head_dim 128, theta 10000, original 4096, factor 8 unless given. config: head_dim / theta /
    original context from a RoPE config, factor = claimed / original context when it claims more (else 8), plus its
    searched LongRoPE factors when it has them (e.g. Phi-3); each argument given overrides the config's value.
    Returns {"path", "methods": {name: {"wavelength", "interpolation", "attention_scaling", "labels"}}, "original",
    "target"}.
    """
    from posenc.rope.apply import default_inv_freq

    partial = 1.0
    longrope = own = None
    if head_dim is not None:                  # the arguments given, checked before the config's values meet them
        _positive_int(head_dim, "head_dim", MAX_DIM)
    if original is not None:
        _positive_int(original, "original", MAX_CONTEXT)
    if config is not None:
        from posenc.rope.config import load_rope_config

        rc = load_rope_config(_rope_mapping(config))
        partial = rc.partial_rotary_factor
        if head_dim is None:
            head_dim = rc.head_dim
        elif rc.rope_type == "longrope" and int(head_dim * partial) // 2 != rc.rotary_dim // 2:
            raise PosencError(f"--head-dim {head_dim} gives {int(head_dim * partial) // 2} frequency pairs, but the "
                              f"config's LongRoPE factors are for {rc.rotary_dim // 2}: drop --head-dim or --config")
        theta = rc.theta if theta is None else theta
        original = (trained_length(rc) or DEFAULT_ORIGINAL) if original is None else original
        claimed, _ = claimed_context(rc)
        if factor is None and claimed and claimed > original:
            factor = claimed / original
        if rc.rope_type == "longrope":
            longrope = rc.params
        elif rc.rope_type != "default":
            l0 = rc.original_max_position_embeddings
            own = (rc.rope_type, {**rc.params, **({"original_max_position_embeddings": l0} if l0 else {})},
                   rc.max_position_embeddings)
    head_dim = DEFAULT_HEAD_DIM if head_dim is None else head_dim
    theta = DEFAULT_THETA if theta is None else _scaling_theta(theta)
    original = DEFAULT_ORIGINAL if original is None else original
    factor = DEFAULT_FACTOR if factor is None else factor
    _positive_int(head_dim, "head_dim", MAX_DIM)
    _positive_int(original, "original", MAX_CONTEXT)
    factor = check_float(factor, "factor", positive=True, max=float(MAX_CONTEXT) / original)
    if factor <= 1:
        raise PosencError(f"factor must be > 1 to compare extension methods, got {factor:g}")
    methods = scaling_methods(head_dim=head_dim, theta=theta, original=original, factor=factor,
                              partial_rotary_factor=partial, longrope=longrope, own=own)
    target = int(round(original * factor))
    first = next(iter(methods.values()))[0]
    base = default_inv_freq(2 * len(first), theta).double()

    fig = _figure(15, 6.5)
    ax, ax2 = fig.subplots(1, 2)
    styles = ["-", "--", "-.", ":"]
    summary = {}
    for i, (name, (inv, attention, labels)) in enumerate(methods.items()):
        ls = styles[i % len(styles)]
        wl = (2 * math.pi / inv.double()).tolist()
        ratio = (base / inv.double()).tolist()
        lw = 2.4 if name.startswith("default") else 1.6
        label = name + (f"  (attn x{attention:.3g})" if attention != 1 else "")
        ax.semilogy(wl, ls, lw=lw, label=label)
        ax2.semilogy(ratio, ls, lw=lw, label=name)
        summary[name] = {"wavelength": wl, "interpolation": ratio, "attention_scaling": attention, "labels": labels}
    ax.axhline(original, color="black", ls=":", lw=1.2, label=f"original context {original:,}")
    ax.axhline(target, color="tab:purple", ls=":", lw=1.2, label=f"target {target:,}")
    ax.set_title(f"Wavelength per pair: x{factor:g} extension ({original:,} -> {target:,}), "
                 f"d={len(first) * 2}, theta={theta:g}")
    ax.set_xlabel("frequency pair j (low j = high frequency)")
    ax.set_ylabel("wavelength (tokens, log scale)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    # the divisor panel's scale is the extension factor; a method that goes far past it (dynamic NTK under
    # transformers' rule at the target: base x (s*L/L0 - s + 1)^(d/(d-2)), ~s^2) is clipped and named, not
    # allowed to squash every other curve into the bottom of the panel
    top = 3.0 * factor
    off_scale = {name: max(v["interpolation"]) for name, v in summary.items() if max(v["interpolation"]) > top}
    if off_scale:
        ax2.set_ylim(top=top)
        ax2.text(0.98, 0.02, "off scale (clipped): " + "; ".join(
            f"{name} reaches x{peak:,.0f}" for name, peak in off_scale.items())
            + ".\nDynamic NTK under transformers' rule raises the base by (s*L/L0 - s + 1)^(d/(d-2)) at length L,"
            "\n~s^2 at the target; the lab's reading (factor 1) reaches ~s there.",
            transform=ax2.transAxes, ha="right", va="bottom", fontsize=7, color="0.25",
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"})
    ax2.axhline(factor, color="gray", ls=":", lw=1)
    ax2.set_title("Interpolation per pair: default / scaled frequency\n(1 = kept, "
                  f"{factor:g} = fully interpolated)")
    ax2.set_xlabel("frequency pair j")
    ax2.set_ylabel("frequency divisor (log scale)")
    ax2.legend(fontsize=8, loc="upper left")
    ax2.grid(True, which="both", alpha=0.3)
    path = _save(fig, out)
    return {"path": str(path), "methods": summary, "original": original, "target": target, "factor": factor,
            "off_scale": off_scale}


# --------------------------------------------------------------------------------------------------- alibi

def plot_alibi(out, *, n_heads: int = 8, seq_len: int = 16, max_panels: int = 8) -> dict[str, Any]:
    """Per-head ALiBi bias heatmaps (-m_h|i-j|, seq_len x seq_len) for up to max_panels heads, plus all slopes.

    Returns {"path", "slopes", "heads_shown"}.
    """
    from posenc.alibi import alibi_bias, alibi_slopes

    _positive_int(n_heads, "n_heads", MAX_ALIBI_HEADS)
    _positive_int(seq_len, "seq_len", MAX_ALIBI_SEQ)
    _positive_int(max_panels, "max_panels")
    slopes = alibi_slopes(n_heads)
    bias = alibi_bias(n_heads, seq_len)                        # [H, T, T]
    shown = sorted({round(k * (n_heads - 1) / max(min(n_heads, max_panels) - 1, 1))
                    for k in range(min(n_heads, max_panels))})
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols) + 1
    fig = _figure(3.4 * cols + 1, 3.1 * rows)
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
    path = _save(fig, out)
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

    _positive_int(head_dim, "head_dim", MAX_DIM)
    _positive_int(max_distance, "max_distance", MAX_CONTEXT)
    _positive_int(points, "points", MAX_POINTS)
    even_int(head_dim, "head_dim")
    freqs: dict[str, torch.Tensor] = {}
    for b in bases:
        freqs[f"base {_positive_float(b, 'base'):g} (d={head_dim})"] = default_inv_freq(head_dim, float(b))
    for c in configs:
        from posenc.rope.config import load_rope_config

        rc = load_rope_config(_rope_mapping(c))   # --head-dim sizes the --base curves only
        claimed, _ = claimed_context(rc)
        inv, _ = rope_parameters(rc, claimed)
        name = Path(os.fspath(c)).stem if isinstance(c, (str, os.PathLike)) else "config"
        freqs[f"{name} ({rc.rope_type})"] = inv[inv > 0]
    if not freqs:
        raise PosencError("give at least one base or config")
    distances = torch.unique(torch.cat([torch.arange(1, min(64, max_distance + 1)),
                                        torch.logspace(0, math.log10(max_distance), points).round().long()]))
    fig = _figure(14, 5.8)
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
    path = _save(fig, out)
    return {"path": str(path), "distances": distances.tolist(), "curves": curves}


# ------------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser) -> None:
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
    p.add_argument("--factor", type=float, help="scaling factor s")
    p.add_argument("--original", type=int, help="original (pre-extension) context length")
    p.add_argument("--max-position-embeddings", type=int, help="the context the config claims")
    p.add_argument("--seq-len", type=int, help="length for length-dependent types (dynamic, longrope)")

    p = kinds.add_parser("scaling", help="every registered extension method side by side (PI, NTK, YaRN, ...)")
    p.add_argument("--config", help="take geometry, original context, factor (claimed / original) and searched "
                                    "LongRoPE factors from this config; the flags below that are given override it")
    p.add_argument("--head-dim", type=int, default=None, help=f"head dimension (default {DEFAULT_HEAD_DIM})")
    p.add_argument("--theta", type=float, default=None, help=f"rope_theta (default {DEFAULT_THETA:g})")
    p.add_argument("--original", type=int, default=None, help=f"original context L0 (default {DEFAULT_ORIGINAL})")
    p.add_argument("--factor", type=float, default=None, help=f"extension factor s (default {DEFAULT_FACTOR:g})")

    p = kinds.add_parser("alibi", help="per-head ALiBi bias heatmaps and slopes")
    p.add_argument("--heads", type=int, default=8, help="number of heads (default 8)")
    p.add_argument("--seq-len", type=int, default=16, help="heatmap size (default 16)")

    p = kinds.add_parser("decay", help="RoPE long-term decay vs relative distance")
    p.add_argument("--base", type=float, action="append", help="RoPE base (repeatable; default 10000)")
    p.add_argument("--config", action="append", default=[], help="a config.json (repeatable)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension for --base curves (default 128)")
    p.add_argument("--max-distance", type=int, default=65536, help="largest distance drawn (default 65536)")

    for sub in kinds.choices.values():
        sub.add_argument("--out", required=True, help="PNG file to write")


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
