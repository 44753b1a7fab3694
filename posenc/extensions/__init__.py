"""RoPE context-extension methods behind one registry (PI, NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE).

    registry.py  METHODS, register_method, method_config, ExtensionSpec, MethodConfig, FitContext
    builtin.py   the built-in methods (each writes a rope scaling config for posenc.rope_parameters)

A new method is one module here (registered with ``@register_method``) plus one import line below.
"""

from __future__ import annotations

from posenc.extensions.registry import (METHODS, ExtensionMethod, ExtensionSpec, FitContext, MethodConfig,
                                        get_method, method_config, method_label, method_names, register_method,
                                        transformers_config)
from posenc.extensions import builtin  # noqa: F401  (registers the built-ins)
from posenc.extensions.builtin import longrope_initial_factors

__all__ = ["METHODS", "ExtensionMethod", "ExtensionSpec", "FitContext", "MethodConfig", "get_method",
           "method_config", "method_label", "method_names", "register_method", "transformers_config",
           "longrope_initial_factors"]
