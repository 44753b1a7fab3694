"""The RoPE-frequency pictures of ``posenc plot``: ``rope`` (wavelength per pair of one config, its bands marked) and
``scaling`` (every registered extension method side by side for one geometry).

Frequencies always come from the scaling registry (posenc.rope.scaling); a config, or flags describing one, is read
by ``rope_mapping`` (also used by ``posenc plot decay``), where each flag given overrides the config's value.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from posenc._internal.validate import check_float, positive_float
from posenc._internal.errors import ConfigError, PosencError
from posenc.extensions import METHODS
from posenc.rope.contexts import MAX_CONTEXT, claimed_context, trained_length
from posenc.tools.plot_common import MAX_DIM, check_size, figure, save_png

BAND_COLOURS = {"kept": "tab:green", "blended": "tab:orange", "interpolated": "tab:red", "removed": "tab:gray"}

# ---------------------------------------------------------------------------------------------------- rope

# what plot rope / plot scaling draw when neither a flag nor a config says otherwise
DEFAULT_HEAD_DIM, DEFAULT_THETA, DEFAULT_ORIGINAL, DEFAULT_FACTOR = 128, 10000.0, 4096, 8.0


def rope_mapping(config, *, head_dim: int | None = None, theta: float | None = None, rope_type: str | None = None,
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
    params: dict[str, Any] = {"rope_type": rope_type, "rope_theta": positive_float(theta, "theta")}
    if factor is not None:
        _check_takes_factor(rope_type)
        params["factor"] = positive_float(factor, "factor")
    if original is not None:
        params["original_max_position_embeddings"] = check_size(original, "original", MAX_CONTEXT)
    if rope_type in METHODS:  # a method's fixed parameters (Llama 3's low/high freq factors), from the registry
        for key, value in METHODS[rope_type].defaults.items():
            params.setdefault(key, value)
    lmax = max_position_embeddings
    if lmax is None and original is not None:
        lmax = int(original * (factor or 1)) if rope_type != "dynamic" else original
    _check_required_lengths(rope_type, original, lmax)
    mapping = {"head_dim": check_size(head_dim, "head_dim", MAX_DIM), "rope_parameters": params}
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
        params["factor"] = positive_float(flags["factor"], "factor")
    theta = positive_float(flags["theta"], "theta") if "theta" in flags else rc.theta
    original = (check_size(flags["original"], "original", MAX_CONTEXT) if "original" in flags
                else rc.original_max_position_embeddings)
    lmax = (check_size(flags["max_position_embeddings"], "max_position_embeddings", MAX_CONTEXT)
            if "max_position_embeddings" in flags else rc.max_position_embeddings)
    head_dim = check_size(flags["head_dim"], "head_dim", MAX_DIM) if "head_dim" in flags else rc.head_dim
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
    mapping = rope_mapping(config, head_dim=head_dim, theta=theta, rope_type=rope_type, factor=factor,
                           original=original, max_position_embeddings=max_position_embeddings)
    rc = load_rope_config(mapping)
    claimed, _ = claimed_context(rc)
    l0 = trained_length(rc)
    if seq_len is not None:
        check_size(seq_len, "seq_len", MAX_CONTEXT)
    at = seq_len or claimed or (2 * l0 if l0 else None)
    inv, attention = rope_parameters(rc, at)  # malformed values raise ConfigError naming the key
    labels = frequency_bands(rc, at)["labels"]
    base = default_inv_freq(rc.rotary_dim, rc.theta).double()
    wl = (2 * math.pi / inv.double()).tolist()                # inf for removed pairs (inv 0)
    wl0 = (2 * math.pi / base).tolist()

    fig = figure(11, 6)
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
    path = save_png(fig, out)
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
    for name in method_names():  # attention methods keep the frequencies: nothing to plot here
        method = METHODS[name]
        if method.fit is not None or method.train_positions is not None or method.recalibrates:
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
    theta = positive_float(theta, "theta")
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

    head_dim, theta, original, factor, partial, longrope, own = _scaling_geometry(config, head_dim, theta, original,
                                                                                  factor)
    methods = scaling_methods(head_dim=head_dim, theta=theta, original=original, factor=factor,
                              partial_rotary_factor=partial, longrope=longrope, own=own)
    target = int(round(original * factor))
    dim = 2 * len(next(iter(methods.values()))[0])
    base = default_inv_freq(dim, theta).double()
    fig, summary, off_scale = _draw_scaling(methods, base, original, target, factor, theta, dim)
    path = save_png(fig, out)
    return {"path": str(path), "methods": summary, "original": original, "target": target, "factor": factor,
            "off_scale": off_scale}


def _scaling_geometry(config, head_dim, theta, original, factor) -> tuple:
    """(head_dim, theta, original, factor, partial_rotary_factor, longrope, own) for ``plot_scaling``: the arguments
    given, else the config's values, else the defaults, each checked (see ``plot_scaling``)."""
    partial = 1.0
    longrope = own = None
    if head_dim is not None:                  # the arguments given, checked before the config's values meet them
        check_size(head_dim, "head_dim", MAX_DIM)
    if original is not None:
        check_size(original, "original", MAX_CONTEXT)
    if config is not None:
        from posenc.rope.config import load_rope_config

        rc = load_rope_config(rope_mapping(config))
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
    check_size(head_dim, "head_dim", MAX_DIM)
    check_size(original, "original", MAX_CONTEXT)
    factor = check_float(factor, "factor", positive=True, max=float(MAX_CONTEXT) / original)
    if factor <= 1:
        raise PosencError(f"factor must be > 1 to compare extension methods, got {factor:g}")
    return head_dim, theta, original, factor, partial, longrope, own


def _draw_scaling(methods: dict, base: torch.Tensor, original: int, target: int, factor: float, theta: float,
                  dim: int) -> tuple[Any, dict[str, Any], dict[str, float]]:
    """The two panels of ``plot_scaling`` (wavelength and interpolation per pair): (figure, summary per method,
    the methods drawn off scale)."""
    fig = figure(15, 6.5)
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
                 f"d={dim}, theta={theta:g}")
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
    return fig, summary, off_scale
