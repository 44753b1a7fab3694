"""PoSE position ids (Zhu et al. 2023): the laws of every sample (shape, strictly increasing, inside the target
context, chunks that add up), the paper's uniform skipping bias, and coverage of every relative distance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import pose_chunks, pose_position_ids
from posenc._internal.errors import PosencError


@st.composite
def shapes(draw):
    train = draw(st.integers(1, 64))
    target = train + draw(st.integers(0, 4 * train))
    return draw(st.integers(1, 8)), train, target, draw(st.integers(1, min(train, 5))), draw(st.integers(0, 2**31))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(shapes())
def test_pose_laws(shape):
    batch, train, target, chunks, seed = shape
    pos = pose_position_ids(batch, train, target, chunks=chunks, generator=torch.Generator().manual_seed(seed))
    assert pos.shape == (batch, train) and pos.dtype == torch.long
    assert bool((pos[:, 0] == 0).all())                                     # u_0 = 0: starts at 0, as at inference
    assert bool((pos.diff(dim=1) >= 1).all())                               # strictly increasing
    assert int(pos.max()) < target
    lengths, biases = pose_chunks(batch, train, target, chunks=chunks, generator=torch.Generator().manual_seed(seed))
    assert bool((lengths.sum(1) == train).all()) and bool((lengths >= 1).all())
    assert bool((biases[:, 0] == 0).all()) and bool((biases.diff(dim=1) >= 0).all())
    assert int(biases.max()) <= target - train
    # rebuild the ids from the chunks: chunk i holds st_i + u_i + (0 .. l_i - 1)
    for b in range(batch):
        expected = torch.cat([torch.arange(l) + st + u for l, st, u in
                              zip(lengths[b].tolist(), (lengths[b].cumsum(0) - lengths[b]).tolist(),
                                  biases[b].tolist())])
        assert torch.equal(pos[b], expected)


def test_no_room_gives_plain_positions():
    assert torch.equal(pose_position_ids(3, 16, 16, chunks=4), torch.arange(16).expand(3, 16))


@pytest.mark.parametrize("chunks", [2, 3])
def test_relative_distances_cover_the_target_context(chunks):
    train, target = 12, 48
    pos = pose_position_ids(3000, train, target, chunks=chunks, generator=torch.Generator().manual_seed(0))
    distances = (pos[:, :, None] - pos[:, None, :]).flatten()
    covered = set(distances[distances >= 0].unique().tolist())
    assert covered == set(range(target))                                    # every distance 0 .. L_t - 1
    # one window alone covers at most train * (train - 1) / 2 + 1 distances: the coverage comes from the skips
    assert int(pos.max()) == target - 1


def test_skip_bias_is_uniform_as_in_the_paper():
    train, target = 8, 15                                                   # u_1 ~ U{0, ..., 7}
    _, biases = pose_chunks(40000, train, target, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(biases[:, 1], minlength=target - train + 1).double()
    assert counts.numel() == target - train + 1
    expected = 40000 / (target - train + 1)                                 # 5000 each; binomial std ~66
    assert bool(((counts - expected).abs() < 400).all()), counts.tolist()


def test_chunk_lengths_are_uniform_compositions():
    lengths, _ = pose_chunks(30000, 5, 20, chunks=2, generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(lengths[:, 0], minlength=5)[1:].double()       # l_0 uniform on {1, ..., 4}
    assert bool(((counts - 7500).abs() < 400).all()), counts.tolist()


def test_seeded_and_device():
    a = pose_position_ids(4, 32, 256, generator=torch.Generator().manual_seed(5), device="cpu")
    b = pose_position_ids(4, 32, 256, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.device.type == "cpu"


@pytest.mark.parametrize("args, kwargs, match", [
    ((2, 32, 16), {}, "target_length"),
    ((2, 8, 32), {"chunks": 9}, "chunks"),
    ((2, 8, 32), {"chunks": 0}, "chunks"),
    ((0, 8, 32), {}, "batch"),
    ((2, 0, 32), {}, "train_length"),
])
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(PosencError, match=match):
        pose_position_ids(*args, **kwargs)
