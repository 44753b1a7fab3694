"""Reading and writing Hugging Face config.json files for the tools: clear errors, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from posenc.errors import ConfigError
from posenc._atomic import atomic_write_json
from posenc.rope.config import read_config_file


def read_config(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Return a config as a plain dict: a mapping is deep-copied; a path (a config.json or a folder holding one) is
    read with ``posenc.rope.config.read_config_file`` (ConfigError naming the file when missing, unreadable, not
    JSON or not a JSON object).
    """
    if isinstance(config, Mapping):
        return json.loads(json.dumps(config))  # a deep copy that also rejects non-JSON values early
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a path to a config.json or a mapping, got {type(config).__name__}")
    return read_config_file(config)


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
