"""Evaluation for the lab: perplexity (non-overlapping and sliding window), per-position loss, copy accuracy,
passkey retrieval, and the RoPE extension-method configs applied at evaluation time.

All functions take a trained TinyLM in eval mode; none of them trains. Positions the model cannot encode
(a learned table shorter than the eval length) are reported as None, never clamped.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from posenc.lab.data import (IGNORE, KEY_DIGITS, copy_example, copy_len, encode, passkey_example)

EXTENSION_METHODS = ("linear", "ntk", "dynamic", "yarn", "llama3")


def supports_length(model, length: int) -> bool:
    """False when the model has no encoding for some position < length (learned table too short)."""
    return model.scheme.max_len is None or length <= model.scheme.max_len


def _batches(n: int, per_batch: int):
    for i in range(0, n, per_batch):
        yield range(i, min(n, i + per_batch))


@torch.no_grad()
def lm_eval(model, tokens: torch.Tensor, eval_len: int, *, n_tokens: int, stride: int | None = None,
            device="cpu", batch_tokens: int = 16384) -> dict | None:
    """Perplexity of ``model`` on ``tokens`` (uint8 stream) with windows of ``eval_len``.

    stride None: non-overlapping windows (every token scored once, context restarts at each window start);
    also returns the mean loss at each position of the window, ``per_position`` [eval_len].
    stride S: sliding window; after the first window each pass scores only its S newest tokens, with
    eval_len - S tokens of context. About ``n_tokens`` tokens are scored either way.
    -> {"ppl", "loss", "n_scored", "per_position"?} or None if the model cannot encode eval_len positions.
    """
    if not supports_length(model, eval_len):
        return None
    if stride is None:
        n_win = max(1, min(n_tokens, len(tokens) - 1) // eval_len)
        spans = [(w * eval_len, 0) for w in range(n_win)]  # (window start, first scored position)
    else:
        if not 0 < stride <= eval_len:
            raise ValueError(f"--sliding-stride: expected 1..eval_len ({eval_len}), got {stride}")
        last = min(n_tokens, len(tokens) - 1) - eval_len
        spans = [(0, 0)] + [(s, eval_len - stride) for s in range(stride, max(0, last) + 1, stride)]
    if spans[-1][0] + eval_len + 1 > len(tokens):
        raise ValueError(f"eval length {eval_len}: the validation text ({len(tokens)} bytes) is too short")
    offs = torch.arange(eval_len + 1)
    total, count = 0.0, 0
    pos_sum = torch.zeros(eval_len, dtype=torch.float64)
    per_batch = max(1, batch_tokens // eval_len)
    for rows in _batches(len(spans), per_batch):
        starts = torch.tensor([spans[r][0] for r in rows])
        window = tokens[starts[:, None] + offs].long().to(device)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.transpose(1, 2).float(), window[:, 1:], reduction="none").cpu().double()
        for b, r in enumerate(rows):
            first = spans[r][1]
            total += loss[b, first:].sum().item()
            count += eval_len - first
        if stride is None:
            pos_sum += loss.sum(0)
    out = {"loss": total / count, "ppl": math.exp(total / count), "n_scored": count}
    if stride is None:
        out["per_position"] = (pos_sum / len(spans)).tolist()
    return out


@torch.no_grad()
def copy_eval(model, length: int, *, n_examples: int, seed: int, device="cpu", batch_tokens: int = 16384) -> dict | None:
    """Copy task at sequence ``length`` (copy of copy_len(length) random bytes), teacher-forced.

    Exact match = every copied token is the argmax; with a deterministic copy this equals greedy decoding's
    exact match (greedy reproduces the teacher-forced prefix until its first wrong token).
    -> {"exact_match", "token_accuracy"} or None when the model cannot encode ``length`` positions.
    """
    if not supports_length(model, length):
        return None
    rng = random.Random(seed * 7919 + length)
    rows = [copy_example(copy_len(length), length, rng) for _ in range(n_examples)]
    exact, correct, scored = 0, 0, 0
    for idx in _batches(n_examples, max(1, batch_tokens // length)):
        inputs = torch.tensor([rows[i][0] for i in idx], device=device)
        targets = torch.tensor([rows[i][1] for i in idx], device=device)
        mask = targets != IGNORE
        hit = (model(inputs).argmax(-1) == targets) & mask
        correct += hit.sum().item()
        scored += mask.sum().item()
        exact += (hit.sum(1) == mask.sum(1)).sum().item()
    return {"exact_match": exact / n_examples, "token_accuracy": correct / scored}


@torch.no_grad()
def passkey_eval(model, length: int, depth: float, *, n_trials: int, seed: int, device="cpu") -> float | None:
    """Exact-match rate of greedy decoding (KV cache) of the pass key, in episodes of ``length`` characters with
    the key sentence at ``depth`` (0..1). None when the model cannot encode ``length`` positions."""
    if not supports_length(model, length):
        return None
    rng = random.Random(seed * 104729 + length * 1009 + round(depth * 1000))
    keys = ["".join(rng.choice("0123456789") for _ in range(KEY_DIGITS)) for _ in range(n_trials)]
    prompts = torch.tensor([encode(passkey_example(length, depth, k)[0]) for k in keys], device=device)
    out = model.generate(prompts, KEY_DIGITS).cpu()
    got = ["".join(chr(c) for c in row.tolist()) for row in out]
    return sum(g == k for g, k in zip(got, keys)) / n_trials


# ---- extension methods: Hugging Face style rope_scaling dicts with original length = training length ----

def extension_scaling(method: str, factor: float, train_len: int) -> tuple[dict, int]:
    """-> (rope_scaling mapping, max_position_embeddings) for ``method`` at ``factor`` over ``train_len``.

    dynamic follows transformers' dynamic NTK, whose base grows with the sequence length L past
    max_position_embeddings (= train_len): theta * (s L / Lmax - (s - 1))^(d/(d-2)). With s = 1 that is the
    static NTK base for exactly L / train_len at every length, which is what we use (``factor`` is ignored).
    """
    extended = int(round(factor * train_len))
    if method == "linear":
        return {"rope_type": "linear", "factor": factor}, extended
    if method == "ntk":
        return {"rope_type": "ntk", "factor": factor}, extended
    if method == "dynamic":
        return {"rope_type": "dynamic", "factor": 1.0}, train_len
    if method == "yarn":
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": train_len}, extended
    if method == "llama3":
        return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": train_len}, extended
    raise ValueError(f"--extensions: unknown method {method!r}; expected some of {', '.join(EXTENSION_METHODS)}")


def band_counts(scheme, seq_len: int | None = None) -> dict | None:
    """Pairs kept / blended / interpolated for the scheme's current scaling (YaRN, Llama 3, ...), if known."""
    from posenc.rope.scaling import frequency_bands

    try:
        bands = frequency_bands(scheme.config, seq_len=seq_len)
    except (ValueError, KeyError, TypeError, NotImplementedError):
        return None
    return {k: int(v) for k, v in bands.items() if isinstance(v, (int, float))}  # counts only, not labels
