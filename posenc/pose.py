"""PoSE position ids (Zhu et al. 2023, "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise
Training", arXiv:2309.10400): train on windows of the original length whose position ids jump, so that over many
samples the relative distances cover the whole target context.

A training window of L_c tokens is cut into N chunks of lengths l_0 .. l_{N-1} (sum L_c, each >= 1); chunk i holds
the positions st_i + u_i, ..., st_i + u_i + l_i - 1, where st_i = l_0 + ... + l_{i-1} and the skipping biases are
u_0 = 0 and u_i drawn uniformly from {u_{i-1}, ..., L_t - L_c} (the paper's rule). Hence the ids increase strictly,
the largest is L_c - 1 + u_{N-1} <= L_t - 1, and every relative distance 0 .. L_t - 1 occurs with positive
probability. Chunk lengths (posenc's choice): the N - 1 cut points are a uniform random subset of {1, ..., L_c - 1}.
Fixing u_0 = 0 keeps the first token at position 0, as at inference; the authors' code made the same choice
because it evens out how often large distances are seen.

These are position ids only: which tokens fill the window is the caller's choice (a contiguous slice of text is
the simplest; the authors' code takes the later chunks' tokens from further on in the same document).

    >>> pos = pose_position_ids(8, 128, 1024, generator=torch.Generator().manual_seed(0))   # LongTensor [8, 128]
"""

from __future__ import annotations

import torch

from posenc._internal.validate import check_int, positive_int
from posenc._internal.errors import PosencError

MAX_TARGET = 2**30  # = posenc.tools.contexts.MAX_CONTEXT (not imported: that module pulls in the scaling registry)


def pose_chunks(batch: int, train_length: int, target_length: int, *, chunks: int = 2,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample PoSE chunks for ``batch`` windows: (lengths LongTensor [batch, chunks], biases LongTensor
    [batch, chunks]). lengths sum to train_length, each >= 1; biases are non-decreasing from u_0 = 0 to at most
    target_length - train_length. Chunk i covers positions st_i + biases[:, i] + (0 .. lengths[:, i] - 1)."""
    batch = positive_int(batch, "batch")
    train_length = positive_int(train_length, "train_length")
    # at most 2^30 (posenc.tools.contexts.MAX_CONTEXT, the longest context posenc reads from a config): beyond
    # it the float64 draw below cannot reach every skip, and no position table or fp32 angle is exact anyway
    target_length = check_int(target_length, "target_length", min=train_length, max=MAX_TARGET)
    chunks = check_int(chunks, "chunks", min=1, max=train_length)
    # N - 1 distinct cut points, uniform over {1, ..., L_c - 1}: every composition into N parts is equally likely
    if chunks > 1:
        cuts = torch.multinomial(torch.ones(batch, train_length - 1), chunks - 1, replacement=False,
                                 generator=generator).sort(dim=1).values + 1
    else:
        cuts = torch.empty(batch, 0, dtype=torch.long)
    edges = torch.cat([torch.zeros(batch, 1, dtype=torch.long), cuts,
                       torch.full((batch, 1), train_length, dtype=torch.long)], dim=1)
    lengths = edges.diff(dim=1)
    room = target_length - train_length  # the largest total skip
    biases = torch.zeros(batch, chunks, dtype=torch.long)
    for i in range(1, chunks):  # u_i ~ U{u_{i-1}, ..., room}
        low = biases[:, i - 1]
        draw = torch.rand(batch, generator=generator, dtype=torch.float64)
        biases[:, i] = low + (draw * (room - low + 1)).floor().long().clamp(max=room - low)
    return lengths, biases


def pose_position_ids(batch: int, train_length: int, target_length: int, *, chunks: int = 2,
                      generator: torch.Generator | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """PoSE position ids: LongTensor [batch, train_length], strictly increasing along each row, in
    [0, target_length). chunks: N (the paper's default 2); generator: for reproducible sampling (CPU).

    Same random draws as ``pose_chunks`` with the same generator state; train_length == target_length gives
    plain positions 0 .. L - 1.
    """
    lengths, biases = pose_chunks(batch, train_length, target_length, chunks=chunks, generator=generator)
    # chunk index of each slot of the window, then its bias
    ends = lengths.cumsum(dim=1)                                             # [B, N]
    slots = torch.arange(train_length).expand(batch, train_length)
    which = torch.searchsorted(ends, slots.contiguous(), right=True)          # [B, L_c] in 0 .. N-1
    positions = slots + biases.gather(1, which)
    if int(positions.max()) >= target_length:  # cannot happen by construction; a silent overflow would be worse
        raise PosencError("internal error: PoSE position beyond target_length")
    return positions if device is None else positions.to(device)
