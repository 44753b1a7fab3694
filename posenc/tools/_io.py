"""Reading and writing Hugging Face config.json files for the tools: clear errors, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from posenc.errors import ConfigError


def read_config(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    """Return a config as a plain dict: a mapping is copied; a path (a config.json or a folder holding one) is read.

    Raises FileNotFoundError for a missing file and ConfigError (a ValueError) for unreadable or invalid JSON, or JSON
    that is not an object. Each message names the file.
    """
    if isinstance(config, Mapping):
        return json.loads(json.dumps(config))  # a deep copy that also rejects non-JSON values early
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a path to a config.json or a mapping, got {type(config).__name__}")
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object (a config.json), got a JSON {type(data).__name__}")
    return data


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file in the same folder, then os.replace)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"output path {path} is a folder; give a file name such as {path / 'config.json'}")
    if not path.parent.exists():
        raise FileNotFoundError(f"output folder does not exist: {path.parent}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        # mkstemp creates 0600: keep the replaced file's mode, else use an ordinary 0644
        os.chmod(tmp, (path.stat().st_mode & 0o777) if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
