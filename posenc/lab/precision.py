"""The lab's numeric precision: fp32, or bf16 autocast where the hardware runs bf16 matmuls natively.

    fp32  every op in float32 (the default: the README's numbers)
    bf16  torch.autocast(bfloat16) around the forward pass and loss of training and evaluation; weights, gradients,
          optimizer state, layer norms, softmax and the loss stay float32 (autocast's rules), and on the CPU the
          attention itself runs in float32 (posenc.nn.attention: torch's bf16 CPU attention kernels were slower
          than its fp32 ones here)
    auto  bf16 where it is native (``native_bf16``), else fp32

bf16 rounds every matmul input to 8 bits of mantissa, so its numbers differ from fp32's; docs/lab.md
("Throughput") compares the two over three seeds. Positions and RoPE angles stay float32 in either mode.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from posenc._internal.validate import check_choice
from posenc._internal.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "auto")

# /proc/cpuinfo flags of x86 CPUs with bf16 dot-product instructions (AVX512-BF16, Intel AMX)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """True when ``device`` multiplies bf16 matrices in hardware: a CUDA GPU with bf16 support (Ampere or later),
    or a CPU with AVX512-BF16 or AMX (its /proc/cpuinfo flags, or torch's reported CPU capability)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    if any(flag in cpu_flags() for flag in BF16_CPU_FLAGS):
        return True
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()
    return "AMX" in str(capability).upper()


def resolve_precision(precision: str, device: str | torch.device = "cpu") -> str:
    """The lab's --precision setting as "fp32" or "bf16": "auto" -> bf16 where native (``native_bf16``)."""
    check_choice(precision, "precision", PRECISIONS, error=ConfigError)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast(precision: str, device: str | torch.device = "cpu"):
    """Context for the forward pass and loss: bf16 autocast on ``device`` for "bf16", nothing for "fp32"."""
    check_choice(precision, "precision", PRECISIONS[:2], error=ConfigError)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
