"""Extension methods on a trained model, for the lab: the method's config with original length = the training
length (from the extension-method registry), applying it to an ``extendable`` scheme, and its band counts.

The tasks' own scoring (perplexity, copy, passkey) lives with each task in posenc/lab/tasks/.
"""

from __future__ import annotations

from posenc._internal.errors import ConfigError
from posenc.attention import AttentionRule, attention_rule, is_attention_method
from posenc.attention.scheme import RuleScheme
from posenc.extensions import ExtensionSpec, FitContext, MethodConfig, check_method, get_method, method_config
from posenc.rope.config import load_rope_config
from posenc.rope.scaling import frequency_bands


def lab_spec(method: str, scheme, factor: float, train_len: int) -> ExtensionSpec:
    """What ``method`` is told in the lab: L0 = the training length, factor = the lab's extension factor (or the
    method's ``lab_factor``), and the scheme's own rotary dim and base."""
    if not getattr(scheme, "extendable", False):
        raise ConfigError(f"extensions: the {scheme.name} scheme has no RoPE that an extension method can rescale")
    rc = load_rope_config(scheme.rope_config)
    lab_factor = None if is_attention_method(check_method(method, "extensions")) else get_method(method).lab_factor
    return ExtensionSpec(original=train_len, factor=lab_factor or factor, rotary_dim=rc.rotary_dim,
                         theta=rc.theta, head_dim=rc.head_dim)


def extension_config(method: str, model, factor: float, train_len: int, fit: FitContext | None = None,
                     options: dict | None = None) -> MethodConfig | AttentionRule:
    """The config ``method`` gives ``model`` (a method with ``fit`` computes it from the model and ``fit``'s data;
    what it reports besides the scaling goes into the config's ``details``); for an attention method, its
    AttentionRule. ``options``: the method's own (--extension-options)."""
    spec = lab_spec(method, plain_scheme(model.scheme), factor, train_len)
    if is_attention_method(method):
        return attention_rule(method, spec, **(options or {}))
    m = get_method(method, "extensions")
    if m.fit is not None:
        if fit is None:
            raise ConfigError(f"extension method {method!r} computes its config from the trained model and data; "
                              "give it a FitContext")
        out = m.fit(spec, fit)
        scaling, details = out if isinstance(out, tuple) else (out, None)
        return method_config(method, spec, scaling=scaling, details=details)
    return method_config(method, spec, **(options or {}))


def plain_scheme(scheme):
    """The RoPE scheme itself, under whatever attention rule wraps it."""
    return scheme.base if isinstance(scheme, RuleScheme) else scheme


def apply_extension(model, config: MethodConfig | AttentionRule | None) -> None:
    """Switch the model's RoPE to ``config`` (None: back to plain RoPE); an AttentionRule keeps the plain
    frequencies and wraps the scheme so that attention runs the rule."""
    model.scheme = plain_scheme(model.scheme)
    if isinstance(config, AttentionRule):
        model.scheme.set_rope_scaling(None)
        model.scheme = RuleScheme(model.scheme, config)
    elif config is None:
        model.scheme.set_rope_scaling(None)
    else:
        model.scheme.set_rope_scaling(config.scaling, max_position_embeddings=config.max_position_embeddings)


def band_counts(scheme, seq_len: int | None = None) -> dict | None:
    """Pairs kept / blended / interpolated for the scheme's current scaling (YaRN, Llama 3, ...), if known; for an
    attention rule, what it keeps ({"keeps": "exact within 32, grouped by 4 beyond"})."""
    if isinstance(scheme, RuleScheme):
        return {"keeps": scheme.rule.keeps}
    try:
        bands = frequency_bands(scheme.rope_config, seq_len=seq_len)
    except (ValueError, KeyError, TypeError, NotImplementedError):
        return None
    return {k: int(v) for k, v in bands.items() if isinstance(v, (int, float))}  # counts only, not labels
