"""Context-extension methods that change attention instead of RoPE's frequencies (Self-Extend, ReRoPE, Leaky
ReRoPE, Dual Chunk Attention, attention sinks, STRING, LM-Infinite), with a registry of their own.

    rules.py      AttentionRule (a rule is a frozen dataclass: its fields are the method's options) and its modes
    registry.py   ATTENTION_METHODS, register_attention_method, attention_rule (name or typed rule -> resolved rule)
    methods.py    the built-in rules, one typed class per method, each with the defaults its paper suggests
    kernel.py     rule_attention: blocked causal attention with an online softmax (memory linear in T), GQA aware
    reference.py  the oracle: one query-key pair at a time in Python floats
    spec.py       patch specs: a rule as JSON ({"method": ..., its fields}), read by posenc.patch
    scheme.py     RuleScheme: a RoPE scheme of the lab's TinyLM under a rule

transformers models run a rule through ``posenc.patch`` (posenc/hf/attention_patch.py). A new method is one rule
class registered with ``@register_attention_method`` (in a plug-in file, or a module here plus one import line).
"""

from __future__ import annotations

from posenc.attention.registry import (ATTENTION_METHODS, AttentionMethod, as_rule, attention_method_names,
                                       attention_rule, get_attention_method, is_attention_method,
                                       register_attention_method)
from posenc.attention.rules import AttentionRule, Mode, window_mode
from posenc.attention.methods import STRING, DualChunk, LeakyReRoPE, LMInfinite, ReRoPE, SelfExtend, Sinks
from posenc.attention.spec import read_patch_spec, rule_spec

__all__ = ["ATTENTION_METHODS", "AttentionMethod", "AttentionRule", "DualChunk", "LMInfinite", "LeakyReRoPE", "Mode",
           "ReRoPE", "STRING", "SelfExtend", "Sinks", "as_rule", "attention_method_names", "attention_rule",
           "get_attention_method", "is_attention_method", "read_patch_spec", "register_attention_method", "rule_spec",
           "window_mode"]
