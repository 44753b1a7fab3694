"""Language-model scoring over windows of a token stream: the one owner of "feed a window, score the next token".

    window_losses   per-position next-token losses of windows starting anywhere in the stream (batched)
    lm_perplexity   exp(mean loss) over non-overlapping windows (LongRoPE's search fitness uses it)

The lab's ``lm`` task (posenc/lab/tasks/lm.py: non-overlapping and sliding protocols, per-position curves) and the
search fitness (posenc/search/fitness.py) both score through ``window_losses``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from posenc._internal.validate import check_int, positive_int
from posenc._internal.errors import DataError, PosencError


def _check_stream(tokens) -> None:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
        raise DataError(f"tokens must be a 1-D integer tensor (a token stream), got "
                        f"{type(tokens).__name__}{list(getattr(tokens, 'shape', []))}")


@torch.no_grad()
def window_losses(model: Callable, tokens: torch.Tensor, starts: Sequence[int], length: int, *,
                  batch_size: int = 4, device: torch.device | str | None = None
                  ) -> Iterator[tuple[range, torch.Tensor]]:
    """Yield (indices into ``starts``, losses float64 [b, length]) batch by batch.

    Window i feeds tokens[starts[i] : starts[i] + length] to ``model`` (any ``model(ids [B, T]) -> logits
    [B, T, V]`` or an output with ``.logits``) and loss[b, t] is the cross-entropy of the next token
    tokens[starts[i] + t + 1]. A model with a ``token_losses(ids [B, T], targets [B, T]) -> [B, T]`` method
    computes those losses itself (so that it never holds the [B, T, V] logits at once). Every window must fit: starts[i] + length + 1 <= len(tokens).
    """
    _check_stream(tokens)
    length = positive_int(length, "length")
    batch_size = positive_int(batch_size, "batch_size")
    device = tokens.device if device is None else torch.device(device)
    offsets = torch.arange(length + 1)
    for first in range(0, len(starts), batch_size):
        rows = range(first, min(len(starts), first + batch_size))
        begin = torch.tensor([starts[r] for r in rows], dtype=torch.long)
        window = tokens[begin[:, None] + offsets].long().to(device)          # [b, length + 1]
        token_losses = getattr(model, "token_losses", None)
        if token_losses is not None:
            # the model scores its own next tokens (posenc eval: the head in chunks, never [b, length, vocab])
            yield rows, token_losses(window[:, :-1], window[:, 1:]).cpu().double()
            continue
        out = model(window[:, :-1])
        logits = getattr(out, "logits", out)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != window[:, 1:].shape:
            raise PosencError(f"model must return logits [batch, {length}, vocab], got "
                              f"{type(logits).__name__}{list(getattr(logits, 'shape', []))}")
        loss = F.cross_entropy(logits.float().transpose(1, 2), window[:, 1:], reduction="none")
        yield rows, loss.cpu().double()


def lm_perplexity(model: Callable, tokens: torch.Tensor, length: int, *, windows: int | None = None,
                  batch_size: int = 4, device: torch.device | str | None = None) -> float:
    """exp(mean next-token cross-entropy) of ``model`` over non-overlapping windows of ``length`` tokens.

    tokens: 1-D integer tensor (a token stream). Window w feeds tokens[w*length : (w+1)*length] and scores the
    next token at every position (tokens[w*length + 1 : (w+1)*length + 1]); the context restarts at each window,
    as in the lab's non-overlapping evaluation. windows: how many (default: all that fit), batch_size: windows
    per forward, device: where the windows go (default: the tokens' device). A diverged model scores +inf.
    """
    length = positive_int(length, "length")
    positive_int(batch_size, "batch_size")
    _check_stream(tokens)
    fit = (len(tokens) - 1) // length
    if fit < 1:
        raise DataError(f"tokens must hold at least length + 1 = {length + 1} tokens for one window, "
                        f"got {len(tokens)}")
    n = fit if windows is None else min(fit, check_int(windows, "windows", min=1))
    total, count = 0.0, 0
    for _, loss in window_losses(model, tokens, [w * length for w in range(n)], length, batch_size=batch_size,
                                 device=device):
        total += float(loss.sum())
        count += loss.numel()
    mean = total / count
    return math.exp(mean) if mean < 700 else math.inf  # exp overflows past ~709


def evaluation_prefix(settings: dict) -> int:
    """Validation tokens [0, n) that the lab's reported perplexity may read under ``settings`` (a LabConfig dict):
    each protocol (posenc.lab.tasks.lm.lm_eval) reads at most max(its token budget, its longest window) + 1 tokens
    from the start, since it scores at least one window. Anything fitted on the validation text (LongRoPE's
    search) starts after them."""
    lens = list(settings.get("eval_lens") or []) + list(settings.get("sliding_lens") or [])
    return max([settings.get("eval_tokens", 0), settings.get("sliding_tokens", 0), *lens]) + 1

