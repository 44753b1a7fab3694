"""Training checkpoints in safetensors: model weights, AdamW state, step, RNG state and run settings.

Layout of one file:
    model.<param name>             model state_dict tensors (the tied head is not stored twice)
    optim.<param index>.<key>      AdamW state tensors (step, exp_avg, exp_avg_sq)
    rng.torch                      torch CPU RNG state (uint8)
    metadata (strings): format, step, param_groups (JSON), settings (JSON), sha256 (of the other metadata and every
                        tensor's name, dtype, shape and bytes: safetensors checks the header, not the payload)

Loading never unpickles: safetensors holds only tensors and strings. Any unreadable file, foreign format, payload
that does not match its checksum, invalid metadata (a step outside 0..the run's steps) or mismatch with the model
raises posenc._internal.errors.CheckpointError naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from posenc._internal.errors import CheckpointError
from posenc._internal.atomic import atomic_path
from posenc._internal.json_io import loads

FORMAT = "posenc-lab-checkpoint/1"


def payload_sha256(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """SHA-256 over the metadata strings and (name, dtype, shape, bytes) of every tensor in name order: any edited
    metadata value or flipped payload byte changes it."""
    h = hashlib.sha256(json.dumps({k: meta[k] for k in sorted(meta) if k != "sha256"}).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, settings: dict | None = None) -> Path:
    """Atomically write a checkpoint (temp file + os.replace)."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    groups = []
    if optimizer is not None:
        state = optimizer.state_dict()
        for idx, st in state["state"].items():
            for key, value in st.items():
                tensors[f"optim.{idx}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
        groups = state["param_groups"]
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {"format": FORMAT, "step": str(int(step)), "param_groups": json.dumps(groups),
            "settings": json.dumps(settings or {}, sort_keys=True)}
    meta["sha256"] = payload_sha256(tensors, meta)
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    """-> (tensors, metadata). Raises CheckpointError if the file is missing, corrupt or not ours."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for truncated or garbled files
        raise CheckpointError(f"checkpoint {path}: unreadable or corrupt ({type(exc).__name__}: {exc})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: not a posenc lab checkpoint (format {meta.get('format')!r}, "
                              f"expected {FORMAT!r})")
    if meta.get("sha256") != payload_sha256(tensors, meta):
        raise CheckpointError(f"checkpoint {path}: contents do not match its checksum (the file was modified or "
                              "damaged); delete it (or run without --resume) to retrain that model")
    try:
        meta["step"] = int(meta["step"])
        meta["param_groups"] = loads(meta["param_groups"], f"checkpoint {path}: metadata", error=CheckpointError)
        meta["settings"] = loads(meta["settings"], f"checkpoint {path}: metadata", error=CheckpointError)
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path}: corrupt metadata ({exc})") from None
    train = meta["settings"].get("train") if isinstance(meta["settings"], dict) else None
    total = train.get("steps") if isinstance(train, dict) else None
    if meta["step"] < 0 or (isinstance(total, int) and meta["step"] > total):
        raise CheckpointError(f"checkpoint {path}: invalid metadata step={meta['step']} (expected 0..{total}); "
                              "delete it to retrain that model")
    return tensors, meta


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *, restore_rng: bool = True) -> dict:
    """Load weights (and optimizer state, RNG) into ``model``/``optimizer``; return the metadata (step, settings)."""
    tensors, meta = read_checkpoint(path)
    weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path}: does not match the model (missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]})")
    bad = [k for k in own if own[k].shape != weights[k].shape]
    if bad:
        raise CheckpointError(f"checkpoint {path}: shape mismatch for {bad[:5]} "
                              f"(checkpoint {tuple(weights[bad[0]].shape)}, model {tuple(own[bad[0]].shape)})")
    model.load_state_dict(weights)
    if optimizer is not None:
        state: dict = {}
        for k, v in tensors.items():
            if k.startswith("optim."):
                parts = k.split(".", 2)
                if len(parts) != 3 or not parts[1].isdigit():
                    raise CheckpointError(f"checkpoint {path}: invalid optimizer entry {k!r} (expected "
                                          "optim.<index>.<name>)")
                state.setdefault(int(parts[1]), {})[parts[2]] = v
        groups = meta["param_groups"]
        if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups) \
                or not all(isinstance(g, dict) for g in groups):
            raise CheckpointError(f"checkpoint {path}: optimizer has {len(groups) if isinstance(groups, list) else '?'}"
                                  f" param groups, expected {len(optimizer.param_groups)}")
        # the hyperparameters are the run's (its settings), not the file's: a group that disagrees is refused
        for saved, fresh in zip(groups, optimizer.param_groups):
            differ = sorted(k for k in fresh if k not in ("params", "lr", "initial_lr") and k in saved
                            and saved[k] != (list(fresh[k]) if isinstance(fresh[k], tuple) else fresh[k]))
            if differ:
                raise CheckpointError(f"checkpoint {path}: optimizer hyperparameters {differ} differ from this run's; "
                                      "delete it (or run without --resume) to retrain that model")
        try:
            optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {path}: optimizer state does not match ({exc})") from None
    if restore_rng and "rng.torch" in tensors:
        rng = tensors["rng.torch"]
        if rng.dtype != torch.uint8 or rng.dim() != 1:
            raise CheckpointError(f"checkpoint {path}: invalid RNG state (expected a 1-D uint8 tensor, got "
                                  f"{rng.dtype} {list(rng.shape)})")
        try:
            torch.set_rng_state(rng)
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint {path}: invalid RNG state ({exc})") from None
    return meta
