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

from collections.abc import Callable

import torch

from posenc._internal.validate import positive_int
from posenc._internal.errors import PosencError
from posenc.perplexity import lm_perplexity  # the one owner of windowed LM scoring

__all__ = ["lm_perplexity", "perplexity_fitness"]


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
