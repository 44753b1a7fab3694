"""An extension method at a factor, written into a transformers config by ``posenc extend``'s function.

The factor means what it means in the lab: the target context is ``factor`` x the original context, and the scaling
written is the lab's for that method (``posenc.lab.evaluate.extension_scaling``: dynamic NTK with factor 1, i.e. the
NTK base for exactly L / original at every length L). ``posenc.tools.extend.extend_config`` owns how a method is
written (transformers 5 ``rope_parameters`` form; static NTK as a rescaled rope_theta, which transformers lacks).
"""

from __future__ import annotations

from typing import Any, Mapping

from posenc._internal.validate import check_float
from posenc._internal.errors import ConfigError

# a target longer than any real context: used once to ask extend_config for the config's original context
_PROBE_TARGET = 1 << 30


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def extend_for_factor(config: Mapping[str, Any], method: str, factor: float, *, replace: bool = False,
                      as_given: bool = False):
    """-> ``posenc.tools.extend.ExtendResult`` for ``method`` at ``factor`` x the config's original context.

    ``config``: a config mapping (``PretrainedConfig.to_dict()``). ``replace``: allow replacing a scaling the
    config already has (as ``posenc extend --replace``). Raises ConfigError for a factor <= 1, an unknown method or
    a config extend refuses (not RoPE, already scaled without ``replace``). ``as_given``: write ``factor`` itself
    as the scaling's factor, as ``posenc extend --factor`` does (``posenc export``), instead of the lab's choice
    for the method (dynamic NTK: 1.0).
    """
    from posenc.hf.lab_bridge import lab_config_factor
    from posenc.attention import is_attention_method
    from posenc.extensions import method_names
    from posenc.tools.extend import extend_config

    if method not in method_names():
        raise ConfigError(f"method must be one of {', '.join(method_names())}, got {method!r}"
                          + (" (it changes attention: posenc.patch(model, method=...))"
                             if is_attention_method(method) else ""))
    if check_float(factor, "factor (target / original context)", min=1.0, error=ConfigError) == 1.0:
        raise ConfigError(f"factor (target / original context) must be > 1, got {factor!r}")
    version = 5 if transformers_major() >= 5 else 4
    # the original context is extend's to determine (its rule for rope_scaling configs): ask it once
    original = extend_config(config, _PROBE_TARGET, method, transformers_version=version, factor=float(factor),
                             replace=replace).original_context
    target = int(round(factor * original))
    return extend_config(config, target, method, transformers_version=version,
                         factor=float(factor) if as_given else lab_config_factor(method, float(factor), original),
                         replace=replace)
