"""RoPE context-extension methods behind one registry (PI, NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE,
LongRoPE searched on the model, PoSE fine-tuning).

    registry.py         METHODS, register_method, method_config, ExtensionSpec, MethodConfig, FitContext
    builtin.py          the built-in methods (each writes a rope scaling config for posenc.rope_parameters)
    longrope_search.py  longrope-search: LongRoPE's evolutionary search on the trained model (a ``fit`` hook)
    pose.py             pose-linear, pose-yarn: fine-tuning at the original length with PoSE positions
    catalogue.py        every method of both kinds by name: these and posenc.attention's (labels, options, checks)

The methods that change attention instead (self-extend, rerope, leaky-rerope, dca, sinks) are posenc.attention's,
with a registry of their own. A new method is one module here (registered with ``@register_method``) plus one
import line below.
"""

from __future__ import annotations

from posenc.extensions.registry import (METHODS, ExtensionMethod, ExtensionSpec, FitContext, MethodConfig, get_method,
                                        method_config, method_names, register_method, transformers_config)
from posenc.extensions import builtin  # noqa: F401  (registers the built-ins)
from posenc.extensions import longrope_search, pose  # noqa: F401  (register longrope-search, pose-*)
from posenc.extensions.builtin import longrope_initial_factors
from posenc.extensions.catalogue import all_method_names, check_method, method_label
from posenc.attention.registry import attention_rule  # its old import path (the attention registry owns it)

__all__ = ["METHODS", "ExtensionMethod", "ExtensionSpec", "FitContext", "MethodConfig", "all_method_names",
           "attention_rule", "check_method", "get_method", "method_config", "method_label", "method_names",
           "register_method", "transformers_config", "longrope_initial_factors"]
