"""A model-agnostic fitness for RoPE factor searches: language-model perplexity at a given length.

    >>> def set_factors(rescale, n_hat):          # how this model takes a candidate (here: a TinyLM's RoPE scheme)
    ...     model.scheme.set_scaling(longrope_scaling(rescale, factor=8.0, original_max_position_embeddings=128),
    ...                              max_position_embeddings=1024)
    >>> fitness = perplexity_fitness(model, search_tokens, 1024, set_factors, windows=4)
    >>> heldout = perplexity_fitness(model, heldout_tokens, 1024, set_factors, windows=4)
    >>> result = longrope_search(fitness, heldout=heldout, rotary_dim=32, theta=1e4, original_length=128,
    ...                          target_length=1024)

The model is any callable ``model(tokens LongTensor [B, T]) -> logits [B, T, V]`` (or an output with ``.logits``,
as transformers' models return); it should be in eval mode. LongRoPE's fitness is the perplexity at the target
length on a few samples of a search split (the paper: 5 PG19 documents).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from posenc._validate import check_int, positive_int
from posenc.errors import DataError, PosencError


@torch.no_grad()
def lm_perplexity(model: Callable, tokens: torch.Tensor, length: int, *, windows: int | None = None,
                  batch_size: int = 4, device: torch.device | str | None = None) -> float:
    """exp(mean next-token cross-entropy) of ``model`` over non-overlapping windows of ``length`` tokens.

    tokens: 1-D integer tensor (a token stream). Window w feeds tokens[w*length : (w+1)*length] and scores the
    next token at every position (tokens[w*length + 1 : (w+1)*length + 1]); the context restarts at each window,
    as in the lab's non-overlapping evaluation. windows: how many (default: all that fit), batch_size: windows
    per forward, device: where the windows go (default: the tokens' device).
    """
    length = positive_int(length, "length")
    batch_size = positive_int(batch_size, "batch_size")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
        raise DataError(f"tokens must be a 1-D integer tensor (a token stream), got "
                        f"{type(tokens).__name__}{list(getattr(tokens, 'shape', []))}")
    fit = (len(tokens) - 1) // length
    if fit < 1:
        raise DataError(f"tokens must hold at least length + 1 = {length + 1} tokens for one window, "
                        f"got {len(tokens)}")
    n = fit if windows is None else min(fit, check_int(windows, "windows", min=1))
    device = tokens.device if device is None else torch.device(device)
    offsets = torch.arange(length + 1)
    total, count = 0.0, 0
    for first in range(0, n, batch_size):
        starts = torch.arange(first, min(n, first + batch_size)) * length
        window = tokens[starts[:, None] + offsets].long().to(device)      # [b, length + 1]
        out = model(window[:, :-1])
        logits = getattr(out, "logits", out)
        if not isinstance(logits, torch.Tensor) or logits.shape[:2] != window[:, 1:].shape or logits.dim() != 3:
            raise PosencError(f"model must return logits [batch, {length}, vocab], got "
                              f"{type(logits).__name__}{list(getattr(logits, 'shape', []))}")
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1),
                               reduction="sum")
        total += float(loss.double())
        count += window[:, 1:].numel()
    mean = total / count
    return math.exp(mean) if mean < 700 else math.inf  # exp overflows past ~709: a diverged model scores +inf


def perplexity_fitness(model: Callable, tokens: torch.Tensor, length: int,
                       set_factors: Callable[[torch.Tensor, int], None], *, windows: int | None = None,
                       batch_size: int = 4, device: torch.device | str | None = None
                       ) -> Callable[[torch.Tensor, int], float]:
    """A search fitness ``(rescale, n_hat) -> perplexity``: ``set_factors(rescale, n_hat)`` puts the candidate into
    the model (rescale float64 [rotary_dim // 2], n_hat leading positions unscaled; raise if the model cannot do
    n_hat > 0), then ``lm_perplexity(model, tokens, length, ...)`` scores it.

    Use one token split for the search and another for the held-out choice of the winner.
    """
    if not callable(set_factors):
        raise PosencError(f"set_factors must be a callable (rescale, n_hat) -> None, got {type(set_factors).__name__}")
    positive_int(length, "length")

    def fitness(rescale: torch.Tensor, n_hat: int) -> float:
        set_factors(rescale, n_hat)
        return lm_perplexity(model, tokens, length, windows=windows, batch_size=batch_size, device=device)

    return fitness
