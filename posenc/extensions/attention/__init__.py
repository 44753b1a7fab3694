"""Extension methods that change attention (kind "attention" in the extension registry): the rules, their
blocked kernel, the plain-loop oracle, the registrations and the lab's scheme wrapper.

    rules.py      AttentionRule and the four rules (Self-Extend, ReRoPE / Leaky ReRoPE, Dual Chunk, sinks) as modes
    kernel.py     rule_attention: blocked causal attention with an online softmax (memory linear in T), GQA aware
    reference.py  the oracle: one query-key pair at a time in Python floats
    methods.py    the registrations (defaults derived from the trained length and the target)
    scheme.py     RuleScheme: a RoPE scheme of the lab's TinyLM under a rule
"""
