"""posenc: positional encodings for transformers, exact and fast.

Public names are loaded lazily so that ``import posenc`` stays cheap (no matplotlib, no transformers).

    >>> import posenc, torch
    >>> pe = posenc.sinusoidal(512, 128)                                # [512, 128]
    >>> q = posenc.apply_rope(torch.randn(2, 8, 16, 64), torch.arange(16))
    >>> bias = posenc.alibi_bias(8, 16)                                 # [8, 16, 16]
"""

from __future__ import annotations

from posenc._lazy import lazy_exports

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
    "apply_rope_table": "posenc.rope.apply",
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
    # the lab's model pieces
    "make_scheme": "posenc.schemes",
    "SCHEME_NAMES": "posenc.schemes",
    "CausalSelfAttention": "posenc.attention",
    "KVCache": "posenc.attention",
    "ModelConfig": "posenc.model",
    "TinyLM": "posenc.model",
    # Hugging Face models: patch, export, evaluate
    "patch": "posenc.hf.patch",
    "unpatch": "posenc.hf.patch",
    "is_patched": "posenc.hf.patch",
    "export_lab_model": "posenc.hf.export",
    "evaluate_model": "posenc.hf.evaluate",
    "EvalSettings": "posenc.hf.evaluate",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
