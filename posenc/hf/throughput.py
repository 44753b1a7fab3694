"""What a long evaluation costs: model FLOPs, peak memory, the machine's measured matmul peak.

``model_flops(model, length, windows)``: forward FLOPs of a transformers causal LM on ``windows`` windows of
``length`` tokens: 2 x (weights of every nn.Linear, the output head included) per token, plus causal attention,
2 x 2 x layers x (heads x head_dim) x length (length + 1) / 2 per window (q.k and the weighted sum of v over the
keys at or before each query). Embedding lookups, norms and softmax are not counted (the usual convention, as in
Kaplan et al. 2020 and the PaLM paper's MFU, there with the backward pass too).

``matmul_peak(dtype)``: the FLOP/s of one square matmul on this machine at its current thread count (the best of a
few timed repeats), the yardstick achieved FLOP/s are compared with; benchmarks/matmul_peak.py prints it.

``peak_memory()`` / ``reset_peak_memory()``: the process's peak resident memory (Linux: VmHWM, reset through
/proc/self/clear_refs) and, on a GPU, torch's peak allocation.
"""

from __future__ import annotations

import time

import torch


def linear_weights(model: torch.nn.Module) -> int:
    """Weights of every nn.Linear (each module once: a tied output head counts as a matmul of its own)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def attention_width(config) -> tuple[int, int]:
    """(layers, heads x head_dim) of a transformers config (head_dim derived when the config has none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers"))
    heads = int(getattr(text, "num_attention_heads"))
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return layers, heads * int(head_dim)


def model_flops(model: torch.nn.Module, length: int, windows: int = 1) -> float:
    """Forward FLOPs of ``windows`` causal windows of ``length`` tokens (see the module docstring)."""
    return (2.0 * linear_weights(model) * length + attention_flops(model.config, length)) * windows


def attention_flops(config, length: int) -> float:
    """Causal attention's FLOPs in one window of ``length`` tokens: 2 x 2 x layers x (heads x head_dim) x
    length (length + 1) / 2."""
    layers, width = attention_width(config)
    return 4.0 * layers * width * length * (length + 1) / 2


def matmul_peak(dtype: torch.dtype = torch.bfloat16, n: int = 2048, repeats: int = 5,
                device: str | torch.device = "cpu") -> float:
    """FLOP/s of an [n, n] @ [n, n] matmul in ``dtype`` on ``device``, best of ``repeats`` (after one warm-up)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    a @ b
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def reset_peak_memory() -> None:
    """Start a new peak: the process's VmHWM (Linux; elsewhere it stays the lifetime peak) and CUDA's."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict:
    """{"rss_bytes": peak resident memory since the last reset (None where unknown), "cuda_bytes"?: peak CUDA
    allocation}."""
    out: dict = {"rss_bytes": None}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    out["rss_bytes"] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        import resource

        out["rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if torch.cuda.is_available():
        out["cuda_bytes"] = int(torch.cuda.max_memory_allocated())
    return out
