"""Fingerprints: what a resumable record (a search checkpoint, a fine-tune checkpoint) was computed from, so it is
resumed only for the same model, data and files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

_HASHED_BYTES = 64 << 20      # files up to this size are identified by their SHA-256, larger ones by size and mtime


def file_fingerprint(path: str | Path) -> dict:
    """A file's identity for a search's ``problem``: name, size and SHA-256 (size and modification time for files
    over 64 MiB, e.g. a large model's weights, which would take long to hash)."""
    path = Path(path)
    stat = path.stat()
    out = {"name": path.name, "bytes": stat.st_size}
    if stat.st_size <= _HASHED_BYTES:
        out["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        out["mtime_ns"] = stat.st_mtime_ns
    return out


def tensor_fingerprint(tokens: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and values (e.g. the token splits a fitness scores)."""
    t = tokens.detach().cpu()
    digest = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def state_fingerprint(module: torch.nn.Module) -> str:
    """SHA-256 of a module's state (every parameter's and buffer's name, dtype, shape and values): the identity of a
    trained model, e.g. the base a fine-tune or a search started from."""
    digest = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor_fingerprint(value).encode())
    return digest.hexdigest()

