"""The record a ``posenc finetune`` run leaves beside its model: ``DIR/finetune.json`` next to ``DIR/model``.

Readers of a model folder (``posenc tune``, ``posenc pick --evidence`` through an eval of it) ask whether its weights
were fine-tuned, and how: ``finetune_record(model_dir)`` finds ``model_dir/../finetune.json`` and returns it, and
``describe`` says it in one phrase ("yarn fine-tuned 300 steps, 614,400 tokens"). No torch or peft import: this
is read by commands that never train, so it lives with the tools (below posenc.hf and posenc.finetune).
"""

from __future__ import annotations

import os
from pathlib import Path

from posenc._internal.errors import ConfigError

RECORD = "finetune.json"
# the keys posenc.finetune.run writes that a reader cites
KEYS = ("extension", "steps", "tokens")


def record_path(model_dir: str | os.PathLike) -> Path:
    """Where the record of the fine-tune that wrote ``model_dir`` (DIR/model) lies: DIR/finetune.json."""
    return Path(model_dir).resolve().parent / RECORD


def finetune_record(model_dir: str | os.PathLike) -> dict | None:
    """The finetune.json beside ``model_dir`` (None when there is none: the model was not made by posenc
    finetune); ConfigError naming the file when it is there but unreadable or not a fine-tune's record."""
    from posenc._internal.json_io import loads

    path = record_path(model_dir)
    if not path.is_file():
        return None
    try:
        doc = loads(path.read_text(encoding="utf-8"), f"{path}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or any(k not in doc for k in KEYS) or not isinstance(doc["extension"], dict):
        raise ConfigError(f"{path} is not a posenc finetune record (expected the keys {', '.join(KEYS)})")
    return doc


def describe(doc: dict) -> str:
    """One phrase of a fine-tune record: its method, steps and tokens."""
    ext = doc["extension"]
    return (f"method {ext.get('method')} fine-tuned {doc['steps']:,} steps, {doc['tokens']:,} tokens, from "
            f"{ext.get('original_context')} to {ext.get('target_length')} tokens")
