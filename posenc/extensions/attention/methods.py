"""The attention-changing extension methods, registered with kind "attention". Each ``write(spec, **options)``
returns the method's rule; an option left out is derived from the trained length L = spec.original and the target
N = spec.target, as the method's paper or official code suggests (each function says how)."""

from __future__ import annotations

import math

from posenc.extensions.attention.rules import DualChunk, LeakyReRoPE, ReRoPE, SelfExtend, Sinks
from posenc.extensions.registry import ExtensionSpec, register_method

TWO_SCORE_PASSES = "two score passes per far pair region (normal and remapped), one softmax; keys cached unrotated"


@register_method("self-extend", label="Self-Extend", kind="attention", costs=TWO_SCORE_PASSES,
                 note="zero-shot (Jin et al. 2024; the LongLM README's passkey demo: Llama-2 trained at 4k answers none "
                      "of 5 prompts of 5,144 tokens, with Self-Extend all 5; Mistral likewise at 9,994 tokens). Reach "
                      "(L - W) * G + W; the README suggests G 2-64 and W 512-1536 for Llama-2.")
def self_extend(spec: ExtensionSpec, *, group_size: int | None = None, window: int | None = None) -> SelfExtend:
    """window default L // 4; group_size default the smallest G with W + (N - W) / G <= 2L/3 (the LongLM README's
    rule of thumb: the largest grouped distance between half and two thirds of L)."""
    if window is None:
        window = max(1, spec.original // 4)
    if group_size is None:
        room = 2 * spec.original / 3 - window
        group_size = 1 if spec.target <= window else max(1, math.ceil((spec.target - window) / max(room, 1.0)))
    return SelfExtend(group_size=group_size, window=window)


@register_method("rerope", label="ReRoPE", kind="attention", costs=TWO_SCORE_PASSES,
                 note="zero-shot (Su 2023): relative positions capped at the window; every key beyond it looks "
                      "equally far, so order among far keys is lost.")
def rerope(spec: ExtensionSpec, *, window: int | None = None) -> ReRoPE:
    """window default L // 2."""
    return ReRoPE(window=max(1, spec.original // 2) if window is None else window)


@register_method("leaky-rerope", label="Leaky ReRoPE", kind="attention", costs=TWO_SCORE_PASSES,
                 note="zero-shot (Su 2023): like ReRoPE but far distances compressed by the leak factor instead of "
                      "capped.")
def leaky_rerope(spec: ExtensionSpec, *, window: int | None = None, leak: float | None = None) -> LeakyReRoPE:
    """window default L // 2; leak default (N - 1 - w) / (L - 1 - w) (the farthest pair lands at L - 1), at least 1."""
    if window is None:
        window = max(1, spec.original // 2)
    if leak is None:
        leak = max(1.0, (spec.target - 1 - window) / max(spec.original - 1 - window, 1))
    return LeakyReRoPE(window=window, leak=leak)


@register_method("dca", label="Dual Chunk", kind="attention",
                 costs="three score passes (intra, successive, inter chunk), one softmax; keys cached unrotated",
                 note="zero-shot (An et al. 2024; the ChunkLlama README: Llama-2 7B/13B trained at 4k extended to 32k, "
                      "70B to 128k, 'more than 8x' the pre-training length).")
def dca(spec: ExtensionSpec, *, chunk_size: int | None = None, local_window: int | None = None) -> DualChunk:
    """ChunkLlama's defaults: chunk_size 3L // 4, local_window L // 16."""
    return DualChunk(chunk_size=max(2, 3 * spec.original // 4) if chunk_size is None else chunk_size,
                     local_window=spec.original // 16 if local_window is None else local_window)


@register_method("sinks", label="attention sinks", kind="attention",
                 costs="one pass over n_sink + window keys per query (cheaper than full attention); keys cached "
                       "unrotated and re-indexed; tokens evicted from the middle cannot be retrieved",
                 note="streaming (Xiao et al. 2023): stable perplexity over 4 million tokens (Llama-2, MPT, Falcon, "
                      "Pythia), but only the first n_sink and the last window tokens are attended: their StreamEval "
                      "accuracy drops to zero once the answer is farther back than the cache.")
def sinks(spec: ExtensionSpec, *, n_sink: int = 4, window: int | None = None) -> Sinks:
    """n_sink default 4 (StreamingLLM); window default L - n_sink (the cache holds L tokens)."""
    return Sinks(n_sink=n_sink, window=max(1, spec.original - n_sink) if window is None else window)
