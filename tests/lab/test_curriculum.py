"""Sequence-length warmup (posenc.lab.curriculum): validation, the phase of each step, the batches each phase
draws, and a lab run with it (shapes seen by the model, the checkpoint's settings, the CLI flag)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc._internal.errors import CheckpointError, ConfigError
from posenc.lab.curriculum import LengthWarmupSampler, check_length_warmup
from posenc.lab.presets import get_preset
from posenc.lab.tasks.copy import CopySampler


class _Tagged:
    """A sampler that returns its own tag and the step it was asked for (batch of 1 x 2)."""

    def __init__(self, tag: int, batch_size: int = 4):
        self.tag, self.batch_size = tag, batch_size

    def batch(self, step, rank=0, world_size=1):
        return torch.tensor([[self.tag, step]]), torch.tensor([[rank, world_size]])


@given(st.lists(st.integers(1, 20), max_size=4), st.integers(0, 100))
@settings(max_examples=200, deadline=None)
def test_each_step_goes_to_the_phase_that_holds_it(counts, step):
    sampler = LengthWarmupSampler([(n, _Tagged(i)) for i, n in enumerate(counts)], _Tagged(-1))
    ends = [sum(counts[:i + 1]) for i in range(len(counts))]  # phase i covers [ends[i-1], ends[i])
    expected = next((i for i, end in enumerate(ends) if step < end), -1)
    inputs, shard = sampler.batch(step, 1, 3)
    assert inputs.tolist() == [[expected, step]] and shard.tolist() == [[1, 3]]  # global step and rank passed on


def test_phases_hold_the_tokens_of_a_main_step_and_draw_by_step():
    main = CopySampler(128, 8, 5, distinct=True, min_fraction=0.75)
    short = CopySampler(32, 32, 5, distinct=True, min_fraction=0.75)
    mid = CopySampler(64, 16, 5, distinct=True, min_fraction=0.75)
    sampler = LengthWarmupSampler([(3, short), (2, mid)], main)
    shapes = [tuple(sampler.batch(step)[0].shape) for step in range(7)]
    assert shapes == [(32, 32)] * 3 + [(16, 64)] * 2 + [(8, 128)] * 2
    assert all(a * b == 8 * 128 for a, b in shapes)
    for step in (0, 2):  # a phase's batch is its sampler's batch of the global step: a resume draws the same
        assert torch.equal(sampler.batch(step)[0], short.batch(step)[0])
    assert torch.equal(sampler.batch(6)[1], main.batch(6)[1])
    assert sampler.batch_size == 8


@pytest.mark.parametrize("phases, match", [
    ([[128, 10]], "length_warmup \\(a length\\) must be an integer in \\[2, 127\\]"),
    ([[1, 10]], "length_warmup \\(a length\\)"),
    ([[32, 0]], "length_warmup \\(a step count\\) must be a positive integer, got 0"),
    ([[48, 10]], "length 48 does not divide the 1024 tokens per step"),
    ([[32, 60], [64, 40]], "its 100 steps leave none of the 100 steps"),
    ([32, 10], "expected pairs length:steps, got 32"),
])
def test_bad_phases_are_refused_by_name(phases, match):
    with pytest.raises(ConfigError, match=match):
        check_length_warmup(phases, train_len=128, batch_size=8, steps=100)
    with pytest.raises(ConfigError, match="length_warmup"):
        get_preset("copy-cpu", steps=100, length_warmup=phases)


def test_the_cli_flag():
    from posenc.lab.cli import _phases

    assert _phases("32:300, 64:300") == [[32, 300], [64, 300]] and _phases("none") == []
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="length:steps pairs"):
        _phases("32-300")
    assert get_preset("copy-cpu", length_warmup=[]).length_warmup == []


def test_a_lab_run_trains_the_short_phases_first(tmp_path, monkeypatch):
    from posenc.lab.run import run_lab
    from posenc.nn.model import TinyLM

    seen: list[tuple] = []
    forward = TinyLM.forward

    def spy(self, tokens, *args, **kwargs):
        if self.training:
            seen.append(tuple(tokens.shape))
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(TinyLM, "forward", spy)
    common = dict(tasks=["copy"], schemes=["rope"], extensions=[], seeds=[0], steps=6, train_len=16, batch_size=4,
                  eval_lens=[16], jobs=1, randomized_positions=0, finetune_steps=0, out=str(tmp_path))
    run_lab(get_preset("smoke", length_warmup=[[4, 2], [8, 1]], **common), progress=False, log=lambda *a: None)
    assert seen == [(16, 4)] * 2 + [(8, 8)] + [(4, 16)] * 3
    report = (tmp_path / "report.md").read_text()
    assert "sequence-length warmup first (length x steps, same tokens per step): 4 x 2, 8 x 1" in report
    # the checkpoint records the warmup: resuming it with another warmup is refused, not silently mixed
    with pytest.raises(CheckpointError, match="different settings"):
        run_lab(get_preset("smoke", length_warmup=[[8, 3]], **common), resume=True, progress=False,
                log=lambda *a: None)
