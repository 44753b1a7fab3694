"""posenc: positional encodings for transformers, exact and fast.

Public names are loaded lazily so that ``import posenc`` stays cheap (no matplotlib, no transformers).

    >>> import posenc, torch
    >>> pe = posenc.sinusoidal(512, 128)                                # [512, 128]
    >>> q = posenc.apply_rope(torch.randn(2, 8, 16, 64), torch.arange(16))
    >>> bias = posenc.alibi_bias(8, 16)                                 # [8, 16, 16]
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # absolute encodings
    "sinusoidal": "posenc.absolute",
    "SinusoidalPositionalEncoding": "posenc.absolute",
    "LearnedPositionalEmbedding": "posenc.absolute",
    "NoPE": "posenc.absolute",
    # RoPE core
    "apply_rope": "posenc.rope.apply",
    "apply_rope_qk": "posenc.rope.apply",
    "default_inv_freq": "posenc.rope.apply",
    "rope_cos_sin": "posenc.rope.apply",
    "interleaved_to_half_permutation": "posenc.rope.apply",
    "half_to_interleaved_permutation": "posenc.rope.apply",
    "permute_qk_weight": "posenc.rope.apply",
    # RoPE scaling / config / module
    "rope_parameters": "posenc.rope.scaling",
    "ROPE_SCALING_FUNCTIONS": "posenc.rope.scaling",
    "register_rope_type": "posenc.rope.scaling",
    "frequency_bands": "posenc.rope.scaling",
    "ntk_theta": "posenc.rope.scaling",
    "dynamic_ntk_theta": "posenc.rope.scaling",
    "RopeConfig": "posenc.rope.config",
    "load_rope_config": "posenc.rope.config",
    "Rotary": "posenc.rope.module",
    # ALiBi
    "alibi_slopes": "posenc.alibi",
    "alibi_bias": "posenc.alibi",
    "alibi_attention": "posenc.kernels.alibi_attention",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next access skips __getattr__
    return value


def __dir__():
    return __all__
