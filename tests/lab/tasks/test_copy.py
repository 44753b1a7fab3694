"""The copy task: episode layout, sampler determinism, scoring against oracle models."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from posenc.lab.data import IGNORE
from posenc._internal.errors import ConfigError, DataError
from posenc.lab.presets import get_preset
from posenc.lab.tasks.registry import HELD_OUT
from posenc.lab.tasks.copy import COPY_SEP, CopySampler, copy_eval, copy_example, copy_len, shortest_copy
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import NoPEScheme


def test_copy_example_layout():
    inputs, targets = copy_example(4, 12, random.Random(0))
    xs = inputs[1:5]
    assert inputs[0] == inputs[5] == COPY_SEP and COPY_SEP not in xs and inputs[6:10] == xs and len(inputs) == 12
    # the second separator (position 5) predicts x_1: each target is the byte after its input's first occurrence
    assert targets[5:9] == xs and all(t == IGNORE for i, t in enumerate(targets) if not 5 <= i < 9)
    for i in range(5, 9):
        assert targets[i] == inputs[inputs.index(inputs[i]) + 1]
    # the longest copy fills the sequence: SEP, n bytes, SEP, the first n - 1 copied bytes
    inputs, targets = copy_example(copy_len(11), 11, random.Random(1))
    assert copy_len(11) == copy_len(12) == 5 and targets[-1] == inputs[5] and inputs[-1] == inputs[4]
    x, y = CopySampler(21, 5, 0).batch(0)
    assert x.shape == y.shape == (5, 21) and (y != IGNORE).sum(1).min() >= 1
    assert torch.equal(x, CopySampler(21, 5, 0).batch(0)[0])


class _Copier(torch.nn.Module):
    """Oracle for the copy task: from the second separator (position n + 1) on, predicts the token n + 1 places
    back."""

    scheme = NoPEScheme()

    def __init__(self, wrong_last: bool = False):
        super().__init__()
        self.wrong_last = wrong_last

    def forward(self, tokens):
        B, T = tokens.shape
        logits = torch.zeros(B, T, 256)
        for b in range(B):
            n = (tokens[b] == COPY_SEP).nonzero()[1].item() - 1
            for i in range(1, n + 1):
                tok = int(tokens[b, i]) if not (self.wrong_last and i == n) else 1 + int(tokens[b, i]) % 255
                logits[b, n + i, tok] = 1.0
        return logits


def test_copy_scoring_with_oracle_models():
    assert copy_eval(_Copier(), 21, n_examples=3, seed=0) == {"exact_match": 1.0, "token_accuracy": 1.0}
    r = copy_eval(_Copier(wrong_last=True), 21, n_examples=3, seed=0)
    assert r == {"exact_match": 0.0, "token_accuracy": pytest.approx(9 / 10)}


def test_learned_model_is_not_evaluated_past_its_table():
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="learned", d_model=32, n_layers=1, n_heads=2, max_len=16)).eval()
    assert copy_eval(model, 32, n_examples=2, seed=0) is None


def test_default_bytes_are_the_uniform_draw_of_randrange():
    # the repeated-bytes episode is the plain draw (results of earlier runs stay reproducible)
    rng_a, rng_b = random.Random(7), random.Random(7)
    assert copy_example(40, 81, rng_a)[0][1:41] == [rng_b.randrange(1, 256) for _ in range(40)]


@pytest.mark.parametrize("seq_len", [9, 128, 512])
def test_distinct_copies_and_their_lengths(seq_len):
    sampler = CopySampler(seq_len, 64, seed=3, distinct=True, min_fraction=0.5)
    x, y = sampler.batch(5)
    longest = copy_len(seq_len)
    for row, target in zip(x.tolist(), y.tolist()):
        n = row.index(COPY_SEP, 1) - 1
        xs = row[1:n + 1]
        assert math.ceil(0.5 * longest) <= n <= longest
        assert len(set(xs)) == n and COPY_SEP not in xs  # no repeats, no separator in the content
        assert row[n + 2:2 * n + 2] == xs[:len(row) - n - 2] and [t for t in target if t != IGNORE] == xs
    assert shortest_copy(128, 0.0) == 1 and shortest_copy(128, 1.0) == copy_len(128) == 63
    assert shortest_copy(128, 0.5) == 32  # ceil(31.5)


def test_distinct_scoring_and_limits():
    assert copy_eval(_Copier(), 512, n_examples=2, seed=0, distinct=True) == {"exact_match": 1.0,
                                                                              "token_accuracy": 1.0}
    with pytest.raises(DataError, match="seq_len.*512"):
        CopySampler(1024, 2, 0, distinct=True)
    with pytest.raises(ConfigError, match="eval_lens.*512"):
        get_preset("copy-cpu", copy_distinct=True, eval_lens=[128, 1024])
    with pytest.raises(ConfigError, match="copy_min_fraction"):
        get_preset("copy-cpu", copy_min_fraction=1.5)


def test_the_training_criterion_is_exact_match_on_held_out_strings():
    from types import SimpleNamespace

    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.registry import HELD_OUT

    run = SimpleNamespace(cfg=get_preset("copy-cpu", copy_examples=5), device="cpu")
    task = get_task("copy")
    assert task.has_criterion() and not get_task("lm").has_criterion()
    assert task.criterion(run, _Copier(), 0) == 1.0 and task.criterion(run, _Copier(wrong_last=True), 0) == 0.0
    # its strings are not the test's: copy_eval draws from (seed, length)
    held, test = random.Random(HELD_OUT * 7919 + 128), random.Random(0 * 7919 + 128)
    assert copy_example(63, 128, held, distinct=True) != copy_example(63, 128, test, distinct=True)


def test_a_lab_run_trains_each_model_to_the_criterion(tmp_path, monkeypatch):
    from posenc.lab.run import run_lab
    from posenc.lab.tasks import get_task

    calls: dict[int, int] = {}

    def criterion(self, run, model, seed):  # met at the second check for seed 0, never for seed 1
        calls[seed] = calls.get(seed, 0) + 1
        return 1.0 if seed == 0 and calls[seed] >= 2 else 0.0

    monkeypatch.setattr(type(get_task("copy")), "criterion", criterion)
    cfg = get_preset("smoke", tasks=["copy"], schemes=["alibi"], extensions=[], seeds=[0, 1], steps=9,
                     train_until=0.95, check_every=3, jobs=1, out=str(tmp_path))
    doc = run_lab(cfg, progress=False, log=lambda *a: None)
    timings = doc["meta"]["timings_s"]
    assert timings["copy/alibi/seed0"]["steps"] == 6 and timings["copy/alibi/seed0"]["criterion_met"]
    assert timings["copy/alibi/seed1"]["steps"] == 9 and not timings["copy/alibi/seed1"]["criterion_met"]
    assert calls == {0: 2, 1: 2}  # checks at 3 and 6 (none at the cap)
    report = (tmp_path / "report.md").read_text()
    assert "## Training to the criterion" in report and "| copy/alibi | 8 +- 2 | 6, 9 | 1 of 2 |" in report
    with pytest.raises(ConfigError, match="train_until: task 'lm' has no training criterion"):
        get_preset("smoke", tasks=["lm"], train_until=0.9)


def test_the_criterion_needs_two_held_out_sets_the_second_scored_only_after_the_first_passes(monkeypatch):
    from types import SimpleNamespace

    from posenc.lab.tasks import copy as copy_module
    from posenc.lab.tasks import get_task
    from posenc.lab.tasks.registry import HELD_OUT

    run = SimpleNamespace(cfg=get_preset("copy-cpu", copy_examples=5), device="cpu")   # train_until 0.98
    scores: dict = {}
    seen: list = []

    def fake_eval(model, length, *, n_examples, seed, **kw):
        seen.append((length, n_examples, seed))
        return {"exact_match": scores[seed - 2], "token_accuracy": 1.0}

    monkeypatch.setattr(copy_module, "copy_eval", fake_eval)
    task, first, second = get_task("copy"), HELD_OUT, HELD_OUT + copy_module.CONFIRM
    scores.update({first: 0.97, second: 1.0})
    assert task.criterion(run, None, 2) == 0.97 and seen == [(128, 5, first + 2)]       # the second set unscored
    seen.clear()
    scores[first] = 1.0
    assert task.criterion(run, None, 2) == 1.0 and [s for _, _, s in seen] == [first + 2, second + 2]
    scores[second] = 0.96
    assert task.criterion(run, None, 2) == 0.96                                           # the lower of the two


class _PartlyWrong(_Copier):
    """Copies exactly, except every string whose first byte is in ``bad`` (its last byte is wrong)."""

    def __init__(self, bad):
        super().__init__()
        self.bad = set(bad)
        self.rows = 0

    def forward(self, tokens):
        self.rows += tokens.shape[0]
        logits = super().forward(tokens)
        for b in range(tokens.shape[0]):
            if int(tokens[b, 1]) in self.bad:
                n = (tokens[b] == COPY_SEP).nonzero()[1].item() - 1
                logits[b, 2 * n] = logits[b, 2 * n].roll(1)
        return logits


@settings(max_examples=30, deadline=None)
@given(bad=st.sets(st.integers(1, 255), max_size=12), need=st.sampled_from([0.5, 0.9, 0.95, 0.98, 1.0]))
def test_a_check_with_need_stops_early_with_the_full_counts_verdict(bad, need):
    full = copy_eval(_PartlyWrong(bad), 24, n_examples=100, seed=3, distinct=True)
    model = _PartlyWrong(bad)
    check = copy_eval(model, 24, n_examples=100, seed=3, distinct=True, need=need)
    assert (check["exact_match"] >= need) == (full["exact_match"] >= need)
    if check["exact_match"] >= need:
        assert check == full and model.rows == 100                  # a pass scores every string
    else:
        assert full["exact_match"] <= check["exact_match"] < need    # an upper bound below the bar
        assert model.rows % 32 == 0 or model.rows == 100


def test_a_hopeless_check_scores_one_batch():
    model = _PartlyWrong(range(1, 256))                              # every string wrong
    check = copy_eval(model, 24, n_examples=128, seed=0, distinct=True, need=0.98)
    assert model.rows == 32 and check["exact_match"] == 96 / 128 and check["token_accuracy"] == 10 / 11


@pytest.mark.parametrize("distinct", [False, True])
def test_test_strings_share_no_run_with_training_batches(distinct):
    """No test string shares a run of 8 bytes with the first training batches (by chance: ~1e-14 per pair of
    positions): seed 0's test strings at length L used to be training step L's strings, one draw later."""
    L, steps, run = 64, 160, 8

    class Recorder(_Copier):
        def forward(self, tokens):
            self.seen.extend(tokens.tolist())
            return super().forward(tokens)

    def grams(row):
        return {tuple(row[i:i + run]) for i in range(len(row) - run + 1)}

    for seed in (0, 1):
        sampler = CopySampler(L, 8, seed, distinct=distinct)
        trained = set().union(*(grams(row) for step in range(steps) for row in sampler.batch(step)[0].tolist()))
        for kwargs in ({"seed": seed}, {"seed": HELD_OUT + seed, "held_out": True}):   # test and criterion strings
            model = Recorder()
            model.seen = []
            assert copy_eval(model, L, n_examples=32, distinct=distinct, **kwargs)["exact_match"] == 1.0
            copies = [row[1:row.index(COPY_SEP, 1)] for row in model.seen]          # the bytes to copy
            assert len(copies) == 32 and not any(grams(c) & trained for c in copies)
