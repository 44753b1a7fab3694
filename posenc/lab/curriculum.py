"""Sequence-length warmup: train on shorter sequences first, then at the training length.

    length_warmup = [(L_1, n_1), (L_2, n_2), ...]  ->  steps [0, n_1) at length L_1, the next n_2 at L_2, ...,
                                                      the rest at train_len

Each phase keeps the tokens per step of the main phase: batch_size * train_len / L_k rows of L_k tokens, so the
learning-rate schedule, the step count and the token budget read the same as without warmup (Li et al. 2022, "The
Stability-Efficiency Dilemma: Investigating Sequence Length Warmup for Training GPT Models").

Why the lab has it: a copy or induction task at length 128 starts on a long plateau, because a head that attends
uniformly over ~100 keys passes the one useful token at 1/100 strength. In short episodes the same head sees it at
~1/10 strength, the mechanism forms in a few hundred steps and then carries over to the full length
(docs/lab.md, exercise 3).
"""

from __future__ import annotations

from posenc._internal.validate import check_int
from posenc._internal.errors import ConfigError


def check_length_warmup(phases, *, train_len: int, batch_size: int, steps: int) -> list[list[int]]:
    """Validate ``phases`` (pairs [length, steps]) -> them as lists of ints. Every length lies in [2, train_len)
    and divides the tokens per step (batch_size * train_len); the phases together end before ``steps``."""
    out = []
    for phase in phases:
        if not isinstance(phase, (list, tuple)) or len(phase) != 2:
            raise ConfigError(f"length_warmup: expected pairs length:steps, got {phase!r}")
        length, n = phase
        check_int(length, "length_warmup (a length)", min=2, max=train_len - 1, error=ConfigError)
        check_int(n, "length_warmup (a step count)", min=1, error=ConfigError)
        if batch_size * train_len % length:
            raise ConfigError(f"length_warmup: length {length} does not divide the {batch_size * train_len} tokens "
                              f"per step (batch_size x train_len), so its batch could not hold the same tokens")
        out.append([int(length), int(n)])
    if sum(n for _, n in out) >= steps:
        raise ConfigError(f"length_warmup: its {sum(n for _, n in out)} steps leave none of the {steps} steps at "
                          f"train_len ({train_len})")
    return out


class LengthWarmupSampler:
    """Batch ``step`` from the phase holding it: ``phases`` = [(steps, sampler), ...] in order, then ``main``.

    The samplers follow the lab's protocol (``batch(step, rank, world_size)`` -> (inputs [B_k, L_k],
    targets [B_k, L_k])) and are called with the global step, so data stay a function of (seed, step) and a resumed
    run draws what an uninterrupted one would. ``batch_size`` is the smallest phase batch (the rows each rank can
    count on).
    """

    def __init__(self, phases: list, main):
        self.ends, self.samplers, end = [], [], 0
        for n, sampler in phases:
            end += n
            self.ends.append(end)
            self.samplers.append(sampler)
        self.main = main
        self.batch_size = min([main.batch_size] + [s.batch_size for s in self.samplers])

    def sampler_at(self, step: int):
        for end, sampler in zip(self.ends, self.samplers):
            if step < end:
                return sampler
        return self.main

    def batch(self, step: int, rank: int = 0, world_size: int = 1):
        return self.sampler_at(step).batch(step, rank, world_size)
