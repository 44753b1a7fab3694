"""The one owner of "is this a device torch has here": ``check_device`` for every command that takes --device."""

from __future__ import annotations

import torch

from posenc._internal.errors import ConfigError


def check_device(device, name: str = "device") -> torch.device:
    """``device`` as a torch.device present on this machine, else ConfigError naming ``name``: "bogus" or
    "cuda:99" is refused here, in the first second, not by torch once the model has been loaded."""
    text = str(device)
    expected = f"{name}: expected cpu, cuda, cuda:N, mps or another torch device type, got {text!r}"
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(expected) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "meta":
        raise ConfigError(f"{name}: {text} holds no data (shapes only); expected cpu, cuda, cuda:N, mps, ...")
    backend = torch.backends.mps if dev.type == "mps" else getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise ConfigError(f"{name}: {text} requested but {dev.type} is not available on this machine (torch "
                          f"{torch.__version__}); use cpu" + (" or cuda" if torch.cuda.is_available() else ""))
    count = getattr(getattr(torch, dev.type, None), "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise ConfigError(f"{name}: {text} requested but this machine has {count()} {dev.type} device(s), "
                          f"{dev.type}:0 upwards")
    return dev
