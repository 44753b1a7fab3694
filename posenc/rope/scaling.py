"""RoPE context extension: one registry, rope_type -> fn(cfg, seq_len) -> (inv_freq, attention_scaling).

Every scaled frequency in posenc comes from here (the Rotary module, the lab, inspect, plot, extend), so each
formula exists once. Notation: d = rotary dim, theta = rope base, s = factor, L0 = original (pre-extension)
context, Lmax = max_position_embeddings, default_j = theta^(-2j/d) for j = 0 .. d/2 - 1.

Types following transformers 5.x exactly (the parity suite checks thousands of random configs against
``transformers.modeling_rope_utils``): default, linear, dynamic, yarn, longrope, llama3, proportional.
Types transformers computes inside model files (checked against those models): ntk_alpha (Hunyuan), axial
(Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V vision towers) and axial_pixtral (Pixtral's vision tower).
Types transformers lacks: ntk (static NTK-aware, the lesson's formula), and vLLM's variants whose numbers differ
from transformers' types of the same name: vllm_dynamic, vllm_dynamic_alpha, vllm_ntk, vllm_longrope.
See docs/scaling.md for every formula and the semantics it follows. The NTK family (ntk, dynamic, ntk_alpha,
vllm_dynamic, vllm_dynamic_alpha) all change the base through ``ntk_theta(theta, factor, rotary_dim)`` =
theta * s^(d/(d-2)). Multimodal RoPE (mrope_section) keeps its type's frequencies and splits the pairs between
position axes: ``posenc.rope.multiaxis``.

    >>> inv_freq, attention_scaling = rope_parameters("path/to/config.json")
    >>> inv_freq, attention_scaling = rope_parameters({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 4}})

Add a type:

    >>> @register_rope_type("half_linear", required=("factor",))
    ... def half_linear(cfg, seq_len=None):
    ...     inv = default_inv_freq(cfg.rotary_dim, cfg.theta)
    ...     return inv / cfg.params["factor"] ** 0.5, 1.0
"""

from __future__ import annotations

import math

import torch

from posenc._internal.validate import check_float, check_int, even_int, is_number
from posenc._internal.errors import ConfigError
from posenc.rope.apply import base_powers, default_inv_freq
from posenc.rope.config import MAX_THETA, RopeConfig, load_rope_config
from posenc.rope.registry import (  # noqa: F401  (re-exported: the registry's public names live here too)
    MULTI_AXIS_KEYS,
    ROPE_SCALING_FUNCTIONS,
    SEQ_LEN_RULES,
    ScalingFn,
    register_rope_type,
    rope_type_function,
)

BAND_NAMES = ("kept", "blended", "interpolated", "removed")
# scaling factors (factor, alpha, low/high_freq_factor) outside [1 / MAX_FACTOR, MAX_FACTOR] are refused: a
# context-extension ratio of ten million already covers any context, and 1e300 divides every frequency to 0
MAX_FACTOR = 1e7


def rope_parameters(config, seq_len: int | None = None, *, layer_type: str | None = None
                    ) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 [rotary_dim // 2], attention_scaling) for any config form.

    Args:
        config: a mapping in config.json form, a path to a config.json, a transformers config, or a RopeConfig.
        seq_len: the current sequence length (dynamic and longrope depend on it; others ignore it).
        layer_type: selects the entry of a per-layer-type config (Gemma 3, ModernBERT style).
    Note: "proportional" returns head_dim // 2 frequencies (zeros for unrotated pairs), as Gemma 4 rotates the
    whole head with them. Raises ConfigError when the result is not usable: non-finite or negative frequencies,
    or an attention scaling that is not a positive finite number.
    """
    cfg = load_rope_config(config, layer_type)
    runtime = isinstance(seq_len, torch.Tensor)     # a tensor length is how a forward passes it (transformers too)
    if seq_len is not None:
        if runtime:
            seq_len = int(seq_len.max())
        seq_len = check_int(seq_len, "seq_len", min=1, error=ConfigError)
    return rope_frequencies(cfg, seq_len, runtime=runtime)


def rope_frequencies(cfg: RopeConfig, seq_len: int | None = None, *,
                     runtime: bool = False) -> tuple[torch.Tensor, float]:
    """The registered function of ``cfg.rope_type`` evaluated at ``seq_len``, checked: (inv_freq float32 1-D,
    attention_scaling float). ConfigError for non-finite or negative frequencies or an attention scaling that is not
    a positive finite number (the owner of that check: ``rope_parameters`` and ``Rotary`` both come here).

    ``runtime``: evaluate as transformers does during a forward (the type's ``runtime`` function where it has one).
    """
    fn = rope_type_function(cfg.rope_type)
    if runtime and getattr(fn, "runtime", None) is not None:
        fn = fn.runtime
    inv_freq, scaling = fn(cfg, seq_len)
    inv_freq = torch.as_tensor(inv_freq, dtype=torch.float32)
    if inv_freq.dim() != 1:
        raise ConfigError(f"rope_type {cfg.rope_type!r} returned inv_freq of shape {tuple(inv_freq.shape)}, "
                          "expected 1-D [rotary_dim // 2]")
    # extreme values (factor 1e-300, huge thetas) overflow fp32: refuse rather than hand on inf / NaN angles
    if not bool(inv_freq.isfinite().all()) or bool((inv_freq < 0).any()) \
            or not (isinstance(scaling, (int, float)) and math.isfinite(scaling) and scaling > 0):
        raise ConfigError(f"rope_type {cfg.rope_type!r}: these parameters give non-finite or negative frequencies "
                          f"or an attention scaling that is not a positive finite number ({scaling!r}); check "
                          f"factor and rope_theta: {cfg.params!r:.200}")
    return inv_freq, float(scaling)


# ----------------------------------------------------------------------------------------------- helpers

def _number(cfg: RopeConfig, key: str, default=None, *, positive: bool = False, min: float | None = None) -> float:
    """A numeric scaling key (``default`` when absent or null), or a ConfigError naming it."""
    value = cfg.params.get(key)
    if value is None:
        value = default
    return check_float(value, f"rope_type {cfg.rope_type!r}: {key}", positive=positive, min=min, error=ConfigError)


def _factor(cfg: RopeConfig, key: str = "factor", default=None) -> float:
    """A scaling factor: a number in [1 / MAX_FACTOR, MAX_FACTOR] (below 1 only warns, when the config is loaded)."""
    value = _number(cfg, key, default, positive=True)
    return _check_factor_range(cfg, key, value)


def _check_factor_range(cfg: RopeConfig, key: str, value: float) -> float:
    if not 1 / MAX_FACTOR <= value <= MAX_FACTOR:
        raise ConfigError(f"rope_type {cfg.rope_type!r}: {key} must be in [{1 / MAX_FACTOR:g}, {MAX_FACTOR:g}], got "
                          f"{value!r}: a scaling ratio beyond ten million covers no real context and drives the "
                          "frequencies to 0 or infinity")
    return value


def _factor_or_ratio(cfg: RopeConfig) -> float:
    """params["factor"], or Lmax / L0 when it is null (transformers' yarn and longrope fallback)."""
    if cfg.params.get("factor") is not None:
        return _factor(cfg)
    if cfg.max_position_embeddings is None or cfg.original_max_position_embeddings is None:
        raise ConfigError(f"rope_type {cfg.rope_type!r}: factor is null, so max_position_embeddings and "
                          "original_max_position_embeddings are both needed to infer it")
    return _check_factor_range(cfg, "max_position_embeddings / original_max_position_embeddings",
                               cfg.max_position_embeddings / cfg.original_max_position_embeddings)


# rope types that only raise the base, the same at every length (the model trains with theta' = ntk_theta(theta, s)):
# type -> the parameter holding s. Replacing such a scaling must start from theta', the base the model learned.
STATIC_BASE_KEYS = {"ntk": "factor", "ntk_alpha": "alpha", "vllm_dynamic_alpha": "alpha"}


def trained_theta(rope_type: str, theta: float, params, rotary_dim: int) -> float:
    """The base a model with this RoPE scaling was trained with: ntk_theta(theta, s) for the static base-raising
    types (``STATIC_BASE_KEYS``: Hunyuan's NTK-alpha, posenc's ntk), else ``theta`` itself."""
    key = STATIC_BASE_KEYS.get(rope_type)
    value = params.get(key) if key is not None and params else None
    if not is_number(value) or not value > 0:
        return float(theta)
    return ntk_theta(float(theta), float(value), rotary_dim)


def ntk_theta(theta: float, factor: float, rotary_dim: int) -> float:
    """Static NTK-aware base theta' = theta * s^(d/(d-2)) for factor s and rotary dim d (bloc97; the lesson).

    With this base the lowest frequency is exactly default / s and the highest is unchanged.
    From the closed form: theta 1e4, d = 32: s = 4 -> 1e4 * 4^(32/30) ~ 43,873; s = 8 -> 1e4 * 8^(32/30) ~ 91,896.
    """
    check_float(theta, "theta", positive=True, error=ConfigError)
    check_float(factor, "factor", positive=True, error=ConfigError)
    if even_int(rotary_dim, "rotary_dim", error=ConfigError) <= 2:
        raise ConfigError(f"rotary_dim must be an even integer > 2 (the exponent is d/(d-2)), got {rotary_dim!r}")
    try:
        base = float(theta) * float(factor) ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:
        base = math.inf
    if not base <= MAX_THETA:
        raise ConfigError(f"theta * factor^(d/(d-2)) = {theta!r} * {factor!r}^({rotary_dim}/{rotary_dim - 2}) = "
                          f"{base:.4g} overflows float32 (max {MAX_THETA:.4g}), where the frequencies are computed: "
                          "the factor is far too large for this base")
    return base


def dynamic_ntk_theta(theta: float, factor: float, rotary_dim: int, seq_len: int | None,
                      max_position_embeddings: int) -> float:
    """Dynamic NTK's base at ``seq_len`` (transformers' rule): ``ntk_theta`` with the length-dependent factor
    s * L / Lmax - (s - 1), L = max(seq_len, Lmax) (seq_len None: Lmax). Equals theta up to Lmax, then grows.
    """
    check_int(max_position_embeddings, "max_position_embeddings", min=1, error=ConfigError)
    length = max_position_embeddings if seq_len is None else max(seq_len, max_position_embeddings)
    return ntk_theta(theta, factor * length / max_position_embeddings - (factor - 1), rotary_dim)


def _factor_if_number(cfg: RopeConfig) -> float | None:
    """params["factor"] when it is a number (for labelling only; the scaling functions validate it)."""
    factor = cfg.params.get("factor")
    return factor if is_number(factor) else None


def _ratio_labels(cfg: RopeConfig, inv_freq: torch.Tensor, factor: float | None) -> list[str]:
    """Label each pair by scaled / default frequency: 1 kept, 1/factor interpolated, 0 removed, else blended."""
    reference = default_inv_freq(2 * len(inv_freq), cfg.theta).double()
    ratio = inv_freq.double() / reference
    labels = []
    for r in ratio.tolist():
        if r == 0:
            labels.append("removed")
        elif abs(r - 1) <= 1e-5:
            labels.append("kept")
        elif factor is not None and abs(r * factor - 1) <= 1e-5:
            labels.append("interpolated")
        else:
            labels.append("blended")
    return labels


# ------------------------------------------------------------------------------------ transformers types

@register_rope_type("default", optional=("mrope_section", "mrope_interleaved"))
def default_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Plain RoPE: inv_j = theta^(-2j/d); attention scaling 1.

    Multimodal RoPE configs (Qwen2-VL "mrope", mrope_section) have these frequencies; splitting them into
    temporal / height / width sections is the model's business, not posenc's.
    """
    return default_inv_freq(cfg.rotary_dim, cfg.theta), 1.0


@register_rope_type("linear", required=("factor",))
def linear_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Position interpolation (PI, Chen et al. 2023): inv = default / s, i.e. positions squeezed by s."""
    return default_inv_freq(cfg.rotary_dim, cfg.theta) / _factor(cfg), 1.0


def _dynamic_rope_runtime(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """``dynamic_rope`` as transformers' ``dynamic_rope_update`` evaluates it during a forward: the length arrives
    as an int64 tensor, so theta' = theta * (s * L / Lmax - (s - 1))^(d/(d-2)) is formed in float32 tensor
    arithmetic (at init, and in ``rope_parameters`` with an int length, in Python floats). Up to 3e-7 apart in
    inv_freq, which at position 1e5 is 1e-2 rad: matched here so a patched model is bit-identical."""
    s, lmax, d = _factor(cfg), cfg.max_position_embeddings, cfg.rotary_dim
    if seq_len is None or d <= 2:
        return dynamic_rope(cfg, seq_len)
    length = torch.maximum(torch.tensor(int(seq_len)), torch.tensor(lmax))
    base = cfg.theta * ((s * length / lmax) - (s - 1)) ** (d / (d - 2))             # float32, transformers' order
    base = float(base)
    if not base <= MAX_THETA:
        return dynamic_rope(cfg, seq_len)             # (its check raises the ConfigError that names the overflow)
    return default_inv_freq(d, base), 1.0


@register_rope_type("dynamic", required=("factor", "max_position_embeddings"), seq_len_rule="dynamic",
                    runtime=_dynamic_rope_runtime)
def dynamic_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK (transformers semantics): theta' = theta * (s*L/Lmax - (s-1))^(d/(d-2)), L = max(seq_len, Lmax).

    Uses Lmax (max_position_embeddings), not L0; at seq_len <= Lmax it is plain RoPE. ``posenc.Rotary``
    re-evaluates it as sequences grow, exactly as transformers' ``dynamic_rope_update`` does.
    """
    base = dynamic_ntk_theta(cfg.theta, _factor(cfg), cfg.rotary_dim, seq_len, cfg.max_position_embeddings)
    return default_inv_freq(cfg.rotary_dim, base), 1.0


def yarn_mscale(s: float, m: float = 1.0) -> float:
    """YaRN's attention temperature g(s, m) = 0.1 m ln s + 1 (1 when s <= 1) (Peng et al. 2023; DeepSeek-V2's
    mscale form). transformers' yarn uses g(s, mscale) / g(s, mscale_all_dim) on cos and sin, and DeepSeek's
    attention multiplies its softmax scale by g(s, mscale_all_dim)^2 (``posenc.rope.layers``)."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def yarn_betas(cfg: RopeConfig) -> tuple[float, float]:
    """(beta_fast, beta_slow), rotations over L0; transformers treats 0 / null as the defaults 32 and 1."""
    def beta(key: str, default: float) -> float:
        value = cfg.params.get(key)
        if value is None or (is_number(value) and value == 0):
            return default
        return _number(cfg, key, positive=True)

    return beta("beta_fast", 32.0), beta("beta_slow", 1.0)


def _yarn_ramp(cfg: RopeConfig) -> torch.Tensor:
    """Per-pair interpolation weight in [0, 1] (0 = keep the frequency, 1 = divide it by s), float32 [d/2].

    Pair j completes L0 * inv_j / (2 pi) rotations over the original context; pairs with more than beta_fast
    rotations are kept, fewer than beta_slow interpolated, a linear ramp between (in dimension index).
    """
    d = cfg.rotary_dim
    if cfg.theta <= 1:
        raise ConfigError(f"rope_type 'yarn' needs rope_theta > 1, got {cfg.theta}")
    beta_fast, beta_slow = yarn_betas(cfg)
    orig = cfg.original_max_position_embeddings

    def dim_for(rotations):  # dimension index whose wavelength fits `rotations` times into L0
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(cfg.theta))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if cfg.params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # avoid 0/0, as transformers does
    return ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


def _yarn_check(cfg: RopeConfig) -> list[str]:
    reasons = []
    fast, slow = yarn_betas(cfg)
    if fast < slow:
        reasons.append(f"beta_fast ({fast}) should be >= beta_slow ({slow}): the ramp runs backwards")
    factor, lmax, orig = cfg.params.get("factor"), cfg.max_position_embeddings, cfg.original_max_position_embeddings
    if factor is not None and lmax and orig:
        implicit = lmax / orig
        if implicit != factor and implicit != 1:
            reasons.append(f"factor {factor} differs from max_position_embeddings / original_max_position_embeddings"
                           f" = {lmax} / {orig} = {implicit:g}; the explicit factor is used")
    return reasons


def _yarn_bands(cfg: RopeConfig, seq_len: int | None) -> list[str]:
    return ["kept" if w == 0 else "interpolated" if w == 1 else "blended" for w in _yarn_ramp(cfg).tolist()]


@register_rope_type("yarn", required=("factor", "original_max_position_embeddings"),
                    optional=("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
                    check=_yarn_check, bands=_yarn_bands)
def yarn_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): per-pair blend of kept and interpolated frequencies plus an attention temperature.

    inv_j = default_j * (1 - ramp_j) + (default_j / s) * ramp_j (ramp from beta_fast / beta_slow over L0).
    Attention scaling: attention_factor if given; else g(s, mscale) / g(s, mscale_all_dim) when both are set
    (DeepSeek); else g(s, 1) = 0.1 ln s + 1. factor null -> s = Lmax / L0.
    """
    s = _factor_or_ratio(cfg)
    attention = cfg.params.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = _number(cfg, "mscale", 0, min=0), _number(cfg, "mscale_all_dim", 0, min=0)
        if mscale and mscale_all_dim:
            attention = yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)
        else:
            attention = yarn_mscale(s)
    else:
        attention = _number(cfg, "attention_factor", positive=True)
    keep = 1 - _yarn_ramp(cfg)
    powers = base_powers(cfg.rotary_dim, cfg.theta)
    extrapolated, interpolated = 1.0 / powers, 1.0 / (s * powers)      # transformers' operation order
    return interpolated * (1 - keep) + extrapolated * keep, float(attention)


def _longrope_check(cfg: RopeConfig) -> list[str]:
    reasons = []
    for key in ("short_factor", "long_factor"):
        value = cfg.params.get(key)
        if not isinstance(value, (list, tuple)) or len(value) != cfg.rotary_dim // 2:
            length = len(value) if isinstance(value, (list, tuple)) else type(value).__name__
            reasons.append(f"{key} should be a list of rotary_dim // 2 = {cfg.rotary_dim // 2} numbers, got {length}")
    return reasons


def _longrope_ext(cfg: RopeConfig, key: str) -> torch.Tensor:
    value = cfg.params.get(key)
    message = (f"rope_type {cfg.rope_type!r}: {key} must be a list of rotary_dim // 2 = {cfg.rotary_dim // 2} "
               f"positive numbers (frequencies are divided by them), got {value!r:.80}")
    if not isinstance(value, (list, tuple)) or len(value) != cfg.rotary_dim // 2:
        raise ConfigError(message)
    try:
        factors = [check_float(x, key, positive=True, error=ConfigError) for x in value]
    except ConfigError:
        raise ConfigError(message) from None
    return torch.tensor(factors, dtype=torch.float32)


def _longrope_mscale(cfg: RopeConfig, s: float) -> float:
    """LongRoPE's default attention scaling sqrt(1 + ln s / ln L0) for s > 1, else 1."""
    orig = cfg.original_max_position_embeddings
    if s <= 1:
        return 1.0
    if orig < 2:
        raise ConfigError(f"rope_type {cfg.rope_type!r}: original_max_position_embeddings must be >= 2 for the "
                          f"attention scaling sqrt(1 + ln s / ln L0), got {orig}")
    return math.sqrt(1 + math.log(s) / math.log(orig))


def _longrope_bands(cfg: RopeConfig, seq_len: int | None) -> list[str]:
    inv, _ = ROPE_SCALING_FUNCTIONS[cfg.rope_type](cfg, seq_len)
    factor = _factor_if_number(cfg)
    if factor is None and cfg.max_position_embeddings and cfg.original_max_position_embeddings:
        factor = cfg.max_position_embeddings / cfg.original_max_position_embeddings
    return _ratio_labels(cfg, inv, factor)


@register_rope_type("longrope", required=("short_factor", "long_factor", "original_max_position_embeddings"),
                    optional=("factor", "attention_factor"), seq_len_rule="longrope",
                    check=_longrope_check, bands=_longrope_bands)
def longrope_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3, transformers semantics): inv_j = default_j / ext_j with ext = long_factor when
    seq_len > L0 (strictly) else short_factor. Attention scaling: attention_factor if given, else
    sqrt(1 + ln s / ln L0) for s > 1 (s = factor, or Lmax / L0 when factor is absent), else 1.
    """
    orig = cfg.original_max_position_embeddings
    s = _factor_or_ratio(cfg)
    given = cfg.params.get("attention_factor") is not None
    attention = _number(cfg, "attention_factor", positive=True) if given else _longrope_mscale(cfg, s)
    ext = _longrope_ext(cfg, "long_factor" if seq_len and seq_len > orig else "short_factor")
    return 1.0 / (ext * base_powers(cfg.rotary_dim, cfg.theta)), float(attention)


def _llama3_check(cfg: RopeConfig) -> list[str]:
    reasons = []
    low, high = cfg.params.get("low_freq_factor"), cfg.params.get("high_freq_factor")
    # high == low (Llama 4 Scout: both 1) is a hard cut at L0 / low with no blended band: valid, not warned
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and high < low:
        reasons.append(f"high_freq_factor ({high}) should be > low_freq_factor ({low})")
    orig, lmax = cfg.original_max_position_embeddings, cfg.max_position_embeddings
    if orig and lmax and orig >= lmax:
        reasons.append(f"original_max_position_embeddings ({orig}) should be < max_position_embeddings ({lmax})")
    return reasons


def _llama3_wavelengths(cfg: RopeConfig) -> tuple[torch.Tensor, float, float]:
    """(wavelength of each pair, shortest wavelength interpolated fully, longest kept) in positions."""
    orig = cfg.original_max_position_embeddings
    low, high = _factor(cfg, "low_freq_factor"), _factor(cfg, "high_freq_factor")
    wavelen = 2 * math.pi / default_inv_freq(cfg.rotary_dim, cfg.theta)
    return wavelen, orig / low, orig / high


def _llama3_bands(cfg: RopeConfig, seq_len: int | None) -> list[str]:
    wavelen, long_wl, short_wl = _llama3_wavelengths(cfg)
    return ["kept" if w < short_wl else "interpolated" if w > long_wl else "blended" for w in wavelen.tolist()]


@register_rope_type("llama3", required=("factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings"),
                    check=_llama3_check, bands=_llama3_bands)
def llama3_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Llama 3.1 scaling: by wavelength lambda_j = 2 pi / default_j,
    lambda < L0/high kept; lambda > L0/low divided by s; between, sigma = (L0/lambda - low)/(high - low) and
    inv = (1 - sigma) * default / s + sigma * default. Attention scaling 1.
    """
    s = _factor(cfg)
    low, high = _factor(cfg, "low_freq_factor"), _factor(cfg, "high_freq_factor")
    orig = cfg.original_max_position_embeddings
    inv = default_inv_freq(cfg.rotary_dim, cfg.theta)
    wavelen, long_wl, short_wl = _llama3_wavelengths(cfg)
    out = torch.where(wavelen > long_wl, inv / s, inv)
    if high == low:  # no band between the thresholds: only a pair exactly at L0 / low would be "blended" (0/0)
        return out, 1.0
    sigma = (orig / wavelen - low) / (high - low)
    blended = (1 - sigma) * inv / s + sigma * inv
    middle = (wavelen >= short_wl) & (wavelen <= long_wl)
    return torch.where(middle, blended, out), 1.0


def proportional_pairs(head_dim: int, partial_rotary_factor: float) -> int:
    """Pairs proportional RoPE rotates: int(partial_rotary_factor * head_dim // 2), as transformers counts them."""
    return int(partial_rotary_factor * head_dim // 2)


@register_rope_type("proportional", optional=("factor",), whole_head=True)
def proportional_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Proportional RoPE (Gemma 4): the first n = int(partial_rotary_factor * head_dim // 2) pairs get
    theta^(-2j/head_dim) (note: head_dim, not the rotary dim), the rest zero (not rotated); all / factor (default 1).

    Returns head_dim // 2 frequencies, not rotary_dim // 2: the whole head is rotated with them.
    """
    head_dim = cfg.head_dim
    rotated = proportional_pairs(head_dim, cfg.partial_rotary_factor)
    inv = torch.zeros(head_dim // 2, dtype=torch.float32)
    inv[:rotated] = 1.0 / base_powers(head_dim, cfg.theta, pairs=rotated)     # transformers' length (see there)
    return inv / _factor(cfg, default=1.0), 1.0


# ------------------------------------------------------------------------------------ methods transformers lacks

@register_rope_type("ntk", required=("factor",))
def ntk_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling (bloc97; the lesson's formula): theta' = theta * s^(d/(d-2)), fixed for all lengths.

    The lowest pair is then divided by exactly s while the highest frequency is kept. transformers has this only
    inside some model files; its "dynamic" type is the length-dependent version.
    """
    return default_inv_freq(cfg.rotary_dim, ntk_theta(cfg.theta, _factor(cfg), cfg.rotary_dim)), 1.0


@register_rope_type("vllm_dynamic", required=("factor",))
def vllm_dynamic_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """vLLM's "dynamic" type as shipped from 2023 until vLLM PR #41277 (2026): NOT dynamic. vLLM evaluated the
    dynamic-NTK formula once at L = s * Lmax, so theta' = theta * (s^2 - s + 1)^(d/(d-2)) at every length.

    (After that PR vLLM evaluates transformers' formula once at the served length: that is
    ``rope_parameters(cfg with rope_type "dynamic", seq_len=served_length)``.)
    """
    s = _factor(cfg)
    base = ntk_theta(cfg.theta, s * s - (s - 1), cfg.rotary_dim)
    return default_inv_freq(cfg.rotary_dim, base), 1.0


# Hunyuan's published rope_scaling carries YaRN-style keys next to alpha; transformers' HunYuan models ignore them
_HUNYUAN_IGNORED = ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


@register_rope_type("vllm_dynamic_alpha", required=("alpha",), optional=_HUNYUAN_IGNORED)
@register_rope_type("ntk_alpha", required=("alpha",), optional=_HUNYUAN_IGNORED)
def ntk_alpha_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Hunyuan's NTK-alpha: theta' = theta * alpha^(d/(d-2)), fixed for every length (numerically "ntk" with
    s = alpha). Hunyuan configs label it {"type": "dynamic", "alpha": ...}; transformers' HunYuan models read it as
    this static type (their "ntk_alpha"), and so does posenc's config reader. vLLM's "dynamic" with alpha
    ("vllm_dynamic_alpha") is the same formula.
    """
    base = ntk_theta(cfg.theta, _factor(cfg, "alpha"), cfg.rotary_dim)
    return default_inv_freq(cfg.rotary_dim, base), 1.0


@register_rope_type("vllm_ntk", required=("factor",), optional=("mixed_b",))
def vllm_ntk_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """vLLM's "ntk" type (fixed and mixed NTK, Su 2023, kexue.fm/archives/9706) — a different formula from "ntk":

    fixed (no mixed_b): inv_j = (theta*s)^(-2j/d) / s^(2/d) = default_j * s^(-(2j+2)/d): every pair is scaled,
    the lowest by exactly 1/s.  mixed: inv_j = default_j / exp(a (j+1)^b), a = ln s / (d/2)^b, b = mixed_b.
    """
    s, d = _factor(cfg), cfg.rotary_dim
    mixed_b = cfg.params.get("mixed_b")
    if mixed_b is None:
        return default_inv_freq(d, cfg.theta * s) / s ** (2 / d), 1.0
    b = _number(cfg, "mixed_b", positive=True)
    j = torch.arange(1, d // 2 + 1, dtype=torch.float64)
    # a (j+1)^b with a = ln s / (d/2)^b, written as ln s * ((j+1) / (d/2))^b so large b cannot overflow
    return default_inv_freq(d, cfg.theta) / torch.exp(math.log(s) * (j / (d / 2)) ** b).float(), 1.0


@register_rope_type("vllm_longrope", required=("short_factor", "long_factor", "original_max_position_embeddings",
                                               "max_position_embeddings"),
                    optional=("short_mscale", "long_mscale", "factor", "attention_factor"),
                    check=_longrope_check, bands=_longrope_bands)
def vllm_longrope_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """vLLM's LongRoPE: the long factors are chosen ONCE, when the serving length (``seq_len``, vLLM's
    max_model_len; default Lmax) exceeds L0 — every request then uses them, even short ones (transformers
    switches per forward instead). Attention scaling: short_mscale / long_mscale if given, else
    sqrt(1 + ln(Lmax/L0) / ln L0) for Lmax > L0 (vLLM ignores "factor" and "attention_factor").
    """
    orig, lmax = cfg.original_max_position_embeddings, cfg.max_position_embeddings
    served = lmax if seq_len is None else seq_len
    use_long = served > orig
    key = "long_mscale" if use_long else "short_mscale"
    mscale = _longrope_mscale(cfg, lmax / orig) if cfg.params.get(key) is None else _number(cfg, key, positive=True)
    ext = _longrope_ext(cfg, "long_factor" if use_long else "short_factor")
    return 1.0 / (ext * base_powers(cfg.rotary_dim, cfg.theta)), float(mscale)     # vLLM's order too


# ------------------------------------------------------------------------------------ 2-D vision RoPE

def axial_axes(cfg: RopeConfig) -> list[int]:
    """Position axis of each pair for 2-D RoPE: the first half of the pairs follow the patch row (axis 0), the
    second half the column (axis 1), as transformers' vision rotaries concatenate [h angles, w angles]."""
    pairs = cfg.rotary_dim // 2
    return [0] * (pairs // 2) + [1] * (pairs - pairs // 2)


def _axial_dim(cfg: RopeConfig) -> int:
    if cfg.rotary_dim % 4:
        raise ConfigError(f"rope_type {cfg.rope_type!r} splits the pairs between two axes, so the rotary dim must be "
                          f"divisible by 4, got {cfg.rotary_dim}")
    return cfg.rotary_dim


def _axial_bands(cfg: RopeConfig, seq_len: int | None) -> list[str]:
    return ["kept"] * (cfg.rotary_dim // 2)   # 2-D RoPE is never rescaled


@register_rope_type("axial", axes=axial_axes, bands=_axial_bands)
def axial_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """2-D RoPE of vision towers (transformers' "axial": Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V vision): d/4
    frequencies theta^(-2j/(d/2)), used once with the patch row (pairs 0 .. d/4-1) and once with the column
    (pairs d/4 .. d/2-1); the whole head rotates (Su 2021's 2-D extension; Qwen2-VL, Wang et al. 2024)."""
    inv = default_inv_freq(_axial_dim(cfg) // 2, cfg.theta)
    return torch.cat([inv, inv]), 1.0


@register_rope_type("axial_pixtral", axes=axial_axes, bands=_axial_bands)
def axial_pixtral_rope(cfg: RopeConfig, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Pixtral's 2-D RoPE: the d/2 default frequencies theta^(-2j/d) split by parity, even j with the patch row,
    odd j with the column (transformers' PixtralVisionRotaryEmbedding)."""
    inv = default_inv_freq(_axial_dim(cfg), cfg.theta)
    return torch.cat([inv[0::2], inv[1::2]]), 1.0


# --------------------------------------------------------------------------------------------- bands

def frequency_bands(config, seq_len: int | None = None, *, layer_type: str | None = None) -> dict:
    """Classify each rotary pair as kept, blended, interpolated (divided by the factor) or removed (zeroed).

    yarn and llama3 use their own definitions (YaRN's ramp, Llama 3's wavelength thresholds); other types
    compare scaled / default frequency per pair: 1 kept, 1/factor interpolated, 0 removed, else blended.

    Returns:
        {"kept": int, "blended": int, "interpolated": int, "removed": int, "labels": [str per pair]}.
        Llama 3.1 (s=8, low 1, high 4, L0 8192, theta 5e5, head_dim 128): 29 kept, 6 blended, 29 interpolated.
    """
    cfg = load_rope_config(config, layer_type)
    fn = rope_type_function(cfg.rope_type)
    if fn.bands is not None:
        labels = fn.bands(cfg, seq_len)
    else:
        inv, _ = rope_parameters(cfg, seq_len)
        labels = _ratio_labels(cfg, inv, _factor_if_number(cfg))
    counts = {name: labels.count(name) for name in BAND_NAMES}
    return {**counts, "labels": labels}
