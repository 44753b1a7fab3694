"""The built-in extension methods, each a rope scaling config for ``posenc.rope_parameters``.

Notation: s = factor, L0 = original context, d = rotary dim. Formulas live in ``posenc.rope.scaling`` (one per
rope type); a method here only says which type and keys it writes. The notes cite docs/lesson.md, the method's paper
(author, year, table) and posenc's own lab measurements (docs/lab.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from posenc._internal.validate import check_float
from posenc._internal.errors import ConfigError
from posenc.extensions.registry import METHODS, ExtensionSpec, register_method
from posenc.rope.apply import default_inv_freq
from posenc.rope.scaling import ntk_theta, rope_parameters


@register_method("linear", label="PI", expects_finetune=True,
                 note="PI needs a fine-tune at the new length: Chen et al. 2023 (Table 3) report 16.10 ppl at 8k "
                      "untuned, 7.12 after 200 steps, 6.95 after 1000. Expect ~hundreds of steps / ~1B tokens "
                      "(docs/lesson.md).")
def linear(spec: ExtensionSpec) -> dict:
    """Position interpolation (Chen et al. 2023): every frequency divided by s."""
    return {"rope_type": "linear", "factor": spec.factor}


def _ntk_for_transformers(scaling: dict, spec: ExtensionSpec) -> tuple[dict, list]:
    theta = ntk_theta(spec.theta, scaling["factor"], spec.rotary_dim)
    note = (f"transformers has no 'ntk' rope_type: static NTK is written as rope_type 'default' with rope_theta "
            f"{spec.theta:g} -> {theta:g} (theta * s^(d/(d-2)), d = {spec.rotary_dim})")
    return {"rope_type": "default", "rope_theta": theta}, [note]


@register_method("ntk", label="NTK-aware", transformers_form=_ntk_for_transformers,
                 # the lab's numbers: fields filled from the packaged results (posenc.tools.lab_evidence)
                 note="static NTK-aware works zero-shot (docs/lesson.md; posenc's lab, default preset in "
                      "docs/lab.md: {default[rope/ntk@512]:.2f} ppl at 4x vs ~{default[rope/linear@512]:.1f} for PI "
                      "and {default[rope@512]:.2f} unscaled); a short fine-tune helps further. It changes every "
                      "frequency at every length, short inputs included.")
def ntk(spec: ExtensionSpec) -> dict:
    """Static NTK-aware scaling (bloc97): base theta * s^(d/(d-2)); posenc's own rope_type 'ntk'."""
    return {"rope_type": "ntk", "factor": spec.factor}


@register_method("dynamic", label="dynamic NTK", keeps_original_length=True, lab_factor=1.0,
                 note="zero-shot: no fine-tuning expected (Ding et al. 2024, LongRoPE Table 1: 10.21 ppl at 2x, "
                      "23.29 at 4x from 4k). Frequencies change with the sequence length; under a KV cache it is exact "
                      "only if keys are cached before rotation.")
def dynamic(spec: ExtensionSpec) -> dict:
    """Dynamic NTK (transformers' rule): the base grows with the length past max_position_embeddings = L0.

    The lab evaluates it with s = 1 (``lab_factor``): at every length L the base is then the static NTK base for
    exactly L / L0.
    """
    return {"rope_type": "dynamic", "factor": spec.factor}


@register_method("yarn", label="YaRN", expects_finetune=True,
                 note="YaRN is meant for a short fine-tune: zero-shot it can be poor (32.64 ppl at 8k, Ding et al. "
                      "2024, LongRoPE Table 1); fine-tuned at s=32 it reaches 3.56 at 8k, 2.37 at 128k and 99.4% "
                      "passkey (Peng et al. 2023, YaRN Table 2 and its passkey test). Fine-tune on documents near "
                      "the target length.")
def yarn(spec: ExtensionSpec) -> dict:
    """YaRN (Peng et al. 2023): per-pair ramp between kept and interpolated pairs, plus a temperature."""
    return {"rope_type": "yarn", "factor": spec.factor, "original_max_position_embeddings": spec.original}


@register_method("llama3", label="Llama 3", expects_finetune=True,
                 defaults={"low_freq_factor": 1.0, "high_freq_factor": 4.0},  # Llama 3.1's published values
                 note="Meta paired llama3 scaling with long-context continued pretraining (Llama 3.1: 8k -> 128k); "
                      "expect to train at the target length before relying on it.")
def llama3(spec: ExtensionSpec) -> dict:
    """Llama 3.1's wavelength bands: keep short wavelengths, interpolate long ones by s, blend between."""
    return {"rope_type": "llama3", "factor": spec.factor, **METHODS["llama3"].defaults,
            "original_max_position_embeddings": spec.original}


def longrope_initial_factors(spec: ExtensionSpec) -> list[float]:
    """Unsearched LongRoPE long factors: per pair default / YaRN frequency (1 kept ... s interpolated)."""
    yarn_inv, _ = rope_parameters({**spec.geometry(), "rope_parameters": {**yarn(spec), "rope_theta": spec.theta}})
    ratio = default_inv_freq(spec.rotary_dim, spec.theta).double() / yarn_inv.double()
    return [float(f"{r:.6g}") for r in ratio.tolist()]


def load_factor_list(value, name: str, n_pairs: int) -> list[float]:
    """A factor list given as a list or a path to a JSON file holding one; must have n_pairs positive numbers."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if not path.exists():
            raise FileNotFoundError(f"{name} file not found: {path}")
        from posenc._internal.json_io import loads

        value = loads(path.read_text(encoding="utf-8"), f"{name} file {path}")
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} must be a JSON list of positive numbers, got {str(value)[:80]}")
    if len(value) != n_pairs:
        raise ConfigError(f"{name} must have rotary_dim // 2 = {n_pairs} numbers, got {len(value)}")
    for i, x in enumerate(value):
        check_float(x, f"{name}[{i}]", positive=True, error=ConfigError)
    return [float(x) for x in value]


@register_method("longrope", label="LongRoPE",
                 note="LongRoPE's factors come from an evolutionary search, then a fine-tune; with searched factors "
                      "it is the best zero-shot method in its Table 1 (9.37/11.34 at 8k/16k; Ding et al. 2024).")
def longrope(spec: ExtensionSpec, *, short_factor=None, long_factor=None) -> tuple[dict, list]:
    """LongRoPE (Ding et al. 2024): per-pair factors, short inside L0 and long past it.

    short_factor / long_factor: lists (or JSON files) of rotary_dim / 2 factors; without them an UNSEARCHED
    initialisation: short = 1 (unchanged inside L0), long = ``longrope_initial_factors`` (YaRN's per-pair ratio).
    """
    n_pairs = spec.rotary_dim // 2
    notes = []
    if (short_factor is None) != (long_factor is None):
        raise ConfigError("longrope needs both short_factor and long_factor (or neither, for the derived "
                          "initialisation)")
    if short_factor is None:
        short, long = [1.0] * n_pairs, longrope_initial_factors(spec)
        notes.append("longrope factors were NOT searched: short_factor = 1 (behaviour inside the original context "
                     "unchanged) and long_factor = YaRN's per-pair interpolation (1 for kept pairs ... "
                     f"{spec.factor:g} for interpolated ones). Run LongRoPE's search, or pass "
                     "--short-factor/--long-factor, for the paper's results")
    else:
        short = load_factor_list(short_factor, "short_factor", n_pairs)
        long = load_factor_list(long_factor, "long_factor", n_pairs)
    return ({"rope_type": "longrope", "factor": spec.factor, "short_factor": short, "long_factor": long,
             "original_max_position_embeddings": spec.original}, notes)


@register_method("drope", label="DroPE", expects_finetune=True, recalibrates=True,
                 note="DroPE drops RoPE from a trained model and recalibrates it at the trained length (0.5-2% of the "
                      "pretraining tokens), then runs zero-shot at any length; Gelberg et al. 2025 (arXiv "
                      "2512.12167) report it ahead of PI, NTK-aware and YaRN on needle retrieval at 2-8x. Without "
                      "the recalibration the model has lost its position signal.")
def drope(spec: ExtensionSpec) -> dict:
    """DroPE (Gelberg et al. 2025): rope_type 'drope', every frequency 0 (``posenc.rope.lessons``); the factor plays
    no part: the dropped model has no length limit from RoPE."""
    return {"rope_type": "drope"}
