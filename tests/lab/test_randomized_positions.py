"""The lab's randomized positions (Ruoss et al. 2023): a sorted random subset of 0..N-1 per row while training,
a pure function of (seed, step) so that resuming draws the same positions; plain positions at evaluation;
settings validated."""

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.lab.presets import get_preset
from posenc.lab.run import RandomizedTrainPositions
from posenc.nn.model import ModelConfig, TinyLM


def test_each_call_is_a_sorted_distinct_subset_below_n():
    draw = RandomizedTrainPositions(300, seed=0)
    seen = torch.cat([draw(4, 50, "cpu") for _ in range(20)])
    assert seen.shape == (80, 50)
    assert bool((seen[:, 1:] > seen[:, :-1]).all()) and int(seen.min()) >= 0 and int(seen.max()) < 300
    assert int(seen.max()) > 250  # positions far past the 50-token training length do occur


def test_resumed_draws_equal_the_uninterrupted_ones():
    plain = RandomizedTrainPositions(200, seed=3)
    draws = [plain(2, 16, "cpu") for _ in range(6)]
    resumed = RandomizedTrainPositions(200, seed=3, start_step=4)
    assert torch.equal(resumed(2, 16, "cpu"), draws[4]) and torch.equal(resumed(2, 16, "cpu"), draws[5])
    assert not torch.equal(RandomizedTrainPositions(200, seed=4)(2, 16, "cpu"), draws[0])


def test_model_trains_on_them_and_evaluates_on_plain_positions():
    model = TinyLM(ModelConfig(scheme="rope", d_model=16, n_layers=1, n_heads=2, max_len=8))
    model.train_positions = RandomizedTrainPositions(64, seed=0)
    positions, contiguous = model.train().positions(2, 8, 0, "cpu")
    assert not contiguous and positions.shape == (2, 8) and not torch.equal(positions[0], torch.arange(8))
    positions, contiguous = model.eval().positions(2, 8, 0, "cpu")
    assert contiguous and torch.equal(positions, torch.arange(8))


def test_variants_and_validation():
    both = get_preset("smoke", schemes=["nope", "rope"], randomized_positions=200, randomized_schemes=["rope"])
    assert both.position_variants("rope") == [0, 200] and both.position_variants("nope") == [0]
    only = get_preset("smoke", schemes=["nope", "rope"], randomized_positions=200, randomized_schemes=[])
    assert only.position_variants("rope") == [200] and only.position_variants("nope") == [200]
    with pytest.raises(ConfigError, match="randomized_positions must be 0"):
        get_preset("smoke", randomized_positions=10)
    with pytest.raises(ConfigError, match="learned scheme has no encoding"):
        get_preset("smoke", schemes=["learned"], randomized_positions=200, randomized_schemes=[])
    assert get_preset("smoke", randomized_positions=0).position_variants("rope") == [0]  # 0: off
