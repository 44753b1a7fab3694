"""What inference engines compute for a model's RoPE: one rule per engine (transformers, llama.cpp, vLLM, SGLang,
MLX), each citing the engine's code it restates, and the audit that compares them (``posenc audit``).

    >>> from posenc.engines.audit import audit
    >>> report = audit("config.json", length=32768)
"""

from posenc.engines.builtin import engine_names  # noqa: F401
from posenc.engines.registry import ENGINES, AuditModel, EngineRope, register_engine  # noqa: F401
