"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", arXiv 2305.16843).

Training on length T, the positions are not 0..T-1 but a uniformly random subset of T positions from
0..max_position-1 (max_position much larger than the test lengths), sorted so that order is kept. The model thus
sees every position up to max_position during training, and a longer test sequence (with ordinary positions
0..L-1, L <= max_position) uses positions it has seen. Works with any scheme that reads positions (absolute
tables, RoPE, relative biases); the evaluation uses ordinary positions.
"""

from __future__ import annotations

import torch

from posenc._internal.validate import positive_int
from posenc._internal.errors import PosencError


def randomized_positions(seq_len: int, max_position: int, *, generator: torch.Generator | None = None,
                         batch_size: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """A sorted uniformly random subset of ``seq_len`` distinct positions from range(max_position), int64.

    Returns [seq_len], or [batch_size, seq_len] with an independent subset per row when ``batch_size`` is given.
    Sampling runs on the generator's device (reproducible for a seeded generator) and the result moves to
    ``device`` (default: the generator's device). Cost O(rows * max_position).
    """
    seq_len = positive_int(seq_len, "seq_len")
    max_position = positive_int(max_position, "max_position")
    if seq_len > max_position:
        raise PosencError(f"max_position must be >= seq_len ({seq_len}) to draw distinct positions, "
                          f"got {max_position}")
    rows = 1 if batch_size is None else positive_int(batch_size, "batch_size")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise PosencError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    sample_device = generator.device if generator is not None else device
    # the seq_len largest of max_position i.i.d. uniforms sit at a uniformly random seq_len-subset of indices
    keys = torch.rand(rows, max_position, generator=generator, device=sample_device)
    positions = keys.topk(seq_len, dim=-1, sorted=False).indices.sort(dim=-1).values
    if device is not None:
        positions = positions.to(device)
    return positions[0] if batch_size is None else positions
