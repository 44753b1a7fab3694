"""The built-in engines, registered on import (transformers first: it is the reference row)."""

from posenc.engines import hf_transformers, llama_cpp, mlx, sglang, vllm  # noqa: F401
from posenc.engines.registry import ENGINES

ORDER = ("transformers", "llama.cpp", "vllm", "sglang", "mlx")


def engine_names() -> list[str]:
    """Registered engines: the built-ins in ORDER (the reference first), then any registered later."""
    return [n for n in ORDER if n in ENGINES] + [n for n in ENGINES if n not in ORDER]
