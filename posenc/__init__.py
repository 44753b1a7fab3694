"""posenc: positional encodings for transformers, exact and fast.

Public names are loaded lazily so that ``import posenc`` stays cheap (no matplotlib, no transformers).

    >>> import posenc, torch
    >>> pe = posenc.sinusoidal(512, 128)                                # [512, 128]
    >>> q = posenc.apply_rope(torch.randn(2, 8, 16, 64), torch.arange(16))
    >>> bias = posenc.alibi_bias(8, 16)                                 # [8, 16, 16]
"""

from __future__ import annotations

import sys

from posenc._internal import errors as _errors
from posenc._internal.lazy import lazy_exports

# the error classes users and plug-ins catch keep their documented path, `from posenc.errors import PosencError`
# (the module lives with the rest of the plumbing in posenc._internal; errors.py imports nothing)
sys.modules.setdefault("posenc.errors", _errors)

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
    # relative attention biases (posenc.bias)
    "t5_relative_bucket": "posenc.bias.t5",
    "t5_bias": "posenc.bias.t5",
    "T5RelativeBias": "posenc.bias.t5",
    "kerple_bias": "posenc.bias.kerple",
    "KerpleBias": "posenc.bias.kerple",
    "fire_inputs": "posenc.bias.fire",
    "fire_bias": "posenc.bias.fire",
    "fire_bias_contiguous": "posenc.bias.fire",
    "FIREBias": "posenc.bias.fire",
    "cope_bias": "posenc.bias.cope",
    "cope_attention": "posenc.bias.cope",
    "CoPE": "posenc.bias.cope",
    "end_aligned_positions": "posenc.bias.positions",
    "relative_positions": "posenc.bias.positions",
    # RoPE variants: xPos, p-RoPE
    "apply_xpos": "posenc.rope.xpos",
    "apply_xpos_qk": "posenc.rope.xpos",
    "xpos_scale": "posenc.rope.xpos",
    "xpos_max_position": "posenc.rope.xpos",
    "XPos": "posenc.rope.xpos",
    "p_rope_inv_freq": "posenc.rope.partial",
    "PRoPE": "posenc.rope.partial",
    # iRoPE (Llama 4): NoPE-layer schedule and attention temperature
    "irope_rope_layers": "posenc.irope",
    "attention_temperature": "posenc.temperature",
    "apply_attention_temperature": "posenc.irope",
    "AttentionTemperature": "posenc.irope",
    # randomized positions (Ruoss et al. 2023)
    "randomized_positions": "posenc.randomized",
    # context extension that trains: LongRoPE's search, its fitness, PoSE
    "longrope_search": "posenc.search.longrope",
    "short_factor_search": "posenc.search.longrope",
    "LongRopeSettings": "posenc.search.longrope",
    "LongRopeResult": "posenc.search.longrope",
    "longrope_scaling": "posenc.search.longrope_space",
    "longrope_cos_sin": "posenc.search.longrope_space",
    "lm_perplexity": "posenc.perplexity",
    "window_losses": "posenc.perplexity",
    "perplexity_fitness": "posenc.search.fitness",
    "pose_position_ids": "posenc.pose",
    "pose_chunks": "posenc.pose",
    # registries: schemes, extension methods, lab tasks (docs/architecture.md)
    "register_scheme": "posenc.schemes",
    "make_scheme": "posenc.schemes",
    "scheme_names": "posenc.schemes",
    "register_method": "posenc.extensions",
    "method_names": "posenc.extensions",
    "register_attention_method": "posenc.attention.registry",
    "attention_method_names": "posenc.attention.registry",
    # attention methods as typed rules: posenc.patch(model, posenc.SelfExtend(group_size=4, window=1024))
    "AttentionRule": "posenc.attention.rules",
    "SelfExtend": "posenc.attention.methods",
    "ReRoPE": "posenc.attention.methods",
    "LeakyReRoPE": "posenc.attention.methods",
    "DualChunk": "posenc.attention.methods",
    "Sinks": "posenc.attention.methods",
    "STRING": "posenc.attention.methods",
    "LMInfinite": "posenc.attention.methods",
    "register_task": "posenc.lab.tasks",
    # the lab's model pieces
    "CausalSelfAttention": "posenc.nn.attention",
    "KVCache": "posenc.nn.attention",
    "ModelConfig": "posenc.nn.model",
    "TinyLM": "posenc.nn.model",
    # errors: every bad input raises a PosencError (a ValueError); a bad setting a ConfigError
    "PosencError": "posenc._internal.errors",
    "ConfigError": "posenc._internal.errors",
    "load_plugin": "posenc._internal.plugins",
    "Setting": "posenc._internal.settings",   # a task's or scheme's declared setting (plug-ins declare theirs)
    # Hugging Face models: patch, export, evaluate, search
    "patch": "posenc.hf.patch",
    "unpatch": "posenc.hf.patch",
    "is_patched": "posenc.hf.patch",
    "export_lab_model": "posenc.hf.export",
    "evaluate_model": "posenc.hf.eval.loop",
    "EvalSettings": "posenc.hf.eval.settings",
    "search_model": "posenc.hf.search",
}

__all__ = sorted(_EXPORTS) + ["SCHEME_NAMES", "__version__"]

_lazy_getattr, __dir__ = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str):
    if name == "SCHEME_NAMES":  # derived from the registry on every read (plug-ins add names), never cached
        from posenc.schemes import scheme_names

        return scheme_names()
    return _lazy_getattr(name)
