"""Reading and writing Hugging Face config.json files for the tools: clear errors, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from posenc._internal.errors import ConfigError
from posenc._internal.atomic import atomic_write_json
# (owned by posenc.rope.describe, below the tools; the tools import it from here)
from posenc.rope.describe import read_config  # noqa: F401


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file in the same folder, then os.replace).

    Unlike the lab's writer it creates no folders (a typo in --out should fail) and keeps a replaced file's mode.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"output path {path} is a folder; give a file name such as {path / 'config.json'}")
    if not path.parent.exists():
        raise FileNotFoundError(f"output folder does not exist: {path.parent}")
    mode = (path.stat().st_mode & 0o777) if path.exists() else None  # keep a replaced file's mode
    return atomic_write_json(path, data, make_parents=False, mode=mode)
