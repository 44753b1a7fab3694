"""The passkey task: episode layout, the sampler's teacher forcing, scoring with an oracle and a real model."""

from __future__ import annotations

import pytest
import torch

from posenc._internal.errors import DataError
from posenc.lab.data import IGNORE
from posenc.lab.tasks.passkey import KEY_DIGITS, QUESTION, PasskeySampler, passkey_eval, passkey_example
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import NoPEScheme


def _model(scheme, max_len=16):
    torch.manual_seed(0)
    return TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2, max_len=max_len)).eval()


def test_passkey_episode_places_the_key_at_depth():
    for depth in (0.0, 0.5, 1.0):
        prompt, key = passkey_example(300, depth, "31415")
        assert len(prompt) + len(key) == 300 and prompt.endswith(QUESTION)
        at = prompt.index("The pass key is 31415.")
        filler = len(prompt) - len(QUESTION) - len("The pass key is 31415. Remember it. ")
        assert at == round(depth * filler)
    x, y = PasskeySampler(120, 3, 0).batch(5)
    assert x.shape == (3, 120)
    for row_x, row_y in zip(x, y):
        scored = (row_y != IGNORE).nonzero().flatten()
        assert len(scored) == KEY_DIGITS and all(chr(int(row_y[i])).isdigit() for i in scored)
        # teacher forcing: each answer digit is the next input (the last one ends the episode)
        assert torch.equal(row_x[scored[:-1] + 1], row_y[scored[:-1]]) and scored[-1] == 118
    with pytest.raises(DataError, match="too short"):
        passkey_example(50, 0.5, "12345")


class _KeyReader(torch.nn.Module):
    """Oracle for passkey retrieval: reads the key out of the prompt text."""

    scheme = NoPEScheme()

    def generate(self, prompts, n_new):
        out = []
        for row in prompts:
            text = bytes(row.tolist()).decode()
            at = text.index("The pass key is ") + len("The pass key is ")
            out.append(list(text[at:at + n_new].encode()))
        return torch.tensor(out)


def test_passkey_scoring_with_an_oracle_and_a_real_model():
    for depth in (0.0, 0.5, 1.0):
        assert passkey_eval(_KeyReader(), 200, depth, n_trials=4, seed=1) == 1.0
    v = passkey_eval(_model("alibi"), 100, 0.5, n_trials=3, seed=0)
    assert v in (0.0, 1 / 3, 2 / 3, 1.0)


def test_learned_model_is_not_evaluated_past_its_table():
    assert passkey_eval(_model("learned"), 100, 0.5, n_trials=1, seed=0) is None


class _FirstDigitsReader(_KeyReader):
    """Reads the key right only where it sits in the first half of the prompt (depth <= 0.5)."""

    def generate(self, prompts, n_new):
        out = super().generate(prompts, n_new)
        for i, row in enumerate(prompts):
            text = bytes(row.tolist()).decode()
            if text.index("The pass key is ") > len(text) // 2:
                out[i] = torch.tensor(list(b"x" * n_new))  # never a key: keys are digits
        return out


def test_the_training_criterion_is_the_mean_retrieval_over_the_depths():
    from types import SimpleNamespace

    from posenc.lab.presets import get_preset
    from posenc.lab.tasks import get_task

    task = get_task("passkey")
    run = SimpleNamespace(cfg=get_preset("passkey", train_len=200, passkey_trials=3,
                                         passkey_depths=[0.0, 0.25, 1.0]), device="cpu")
    assert task.has_criterion() and task.criterion(run, _KeyReader(), 0) == 1.0
    # the key is missed at depth 1.0 only: 2 of 3 depths
    assert task.criterion(run, _FirstDigitsReader(), 0) == pytest.approx(2 / 3)
