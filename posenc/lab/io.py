"""Output helpers for the lab: atomic writes and the rank-0-only rule.

Every results file is written to a temporary sibling and moved into place with os.replace, so an interrupted
run never leaves a half-written file. Under torch.distributed only rank 0 writes (``is_main_process``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def is_main_process() -> bool:
    """True unless torch.distributed is initialised and this is not rank 0."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def atomic_tmp_path(path: str | os.PathLike) -> Path:
    """A temporary sibling of ``path`` for writers that need a file name (savefig, safetensors)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
    os.close(fd)
    return Path(tmp)
