"""RoPE context-extension methods behind one registry (PI, NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE,
LongRoPE searched on the model, PoSE fine-tuning).

    registry.py         METHODS, register_method, method_config, ExtensionSpec, MethodConfig, FitContext
    builtin.py          the built-in methods (each writes a rope scaling config for posenc.rope_parameters)
    longrope_search.py  longrope-search: LongRoPE's evolutionary search on the trained model (a ``fit`` hook)
    pose.py             pose-linear, pose-yarn: fine-tuning at the original length with PoSE positions
    attention/          kind "attention": self-extend, rerope, leaky-rerope, dca, sinks (rules, kernel, oracle)

A new method is one module here (registered with ``@register_method``) plus one import line below.
"""

from __future__ import annotations

from posenc.extensions.registry import (KINDS, METHODS, attention_rule, ExtensionMethod, ExtensionSpec, FitContext, MethodConfig,
                                        get_method, method_config, method_label, method_names, register_method,
                                        transformers_config)
from posenc.extensions import builtin  # noqa: F401  (registers the built-ins)
from posenc.extensions import longrope_search, pose  # noqa: F401  (register longrope-search, pose-*)
from posenc.extensions.attention import methods as _attention_methods  # noqa: F401  (self-extend, rerope, ...)
from posenc.extensions.builtin import longrope_initial_factors

__all__ = ["KINDS", "METHODS", "attention_rule", "ExtensionMethod", "ExtensionSpec", "FitContext", "MethodConfig", "get_method",
           "method_config", "method_label", "method_names", "register_method", "transformers_config",
           "longrope_initial_factors"]
