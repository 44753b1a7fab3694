"""Request-sized YaRN in transformers generation (posenc.hf.request_yarn) on a tiny random Llama: a short request is
the unscaled model, a long one the model loaded with static YaRN at the chosen factor, and the model is restored."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_support"))
pytest.importorskip("transformers")

from posenc_hf_folders import TRAIN_LEN, tiny_llama  # noqa: E402

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.hf.loading import load_causal_lm  # noqa: E402
from posenc.hf.request_yarn import generate, request_yarn  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _load(folder, method=None, factor=None):
    return load_causal_lm(str(folder), method=method, factor=factor, log=lambda *_: None, progress=False)[0]


def _ids(n):
    return (torch.arange(n)[None] * 7 + 3) % 256


def _state(model):
    return model.model.rotary_emb, dict(model.config.rope_parameters), model.config.max_position_embeddings


def test_short_request_is_the_unscaled_model(folder):
    model, plain = _load(folder), _load(folder)
    before = _state(model)
    prompt = _ids(TRAIN_LEN - 8)
    out = generate(model, prompt, 8, factors=(1, 2, 4), do_sample=False)
    assert torch.equal(out, plain.generate(prompt, max_new_tokens=8, do_sample=False))
    assert _state(model) == before


@pytest.mark.parametrize("n, factor", [(TRAIN_LEN + 1, 2), (3 * TRAIN_LEN, 4)])
def test_long_request_is_static_yarn_at_the_chosen_factor(folder, n, factor):
    model, static = _load(folder), _load(folder, "yarn", float(factor))
    before = _state(model)
    with request_yarn(model, n, factors=(1, 2, 4)) as config:
        assert config.rope_parameters["factor"] == factor
        assert model.config.rope_parameters["rope_type"] == "yarn"
        got = model(_ids(n)).logits
    assert torch.equal(got, static(_ids(n)).logits)
    assert not torch.equal(got, _load(folder)(_ids(n)).logits)     # YaRN changed something
    assert _state(model) == before
    out = generate(model, _ids(n - 4), 4, factors=(1, 2, 4), do_sample=False)
    assert torch.equal(out, static.generate(_ids(n - 4), max_new_tokens=4, do_sample=False))


def test_config_is_restored_after_an_exception(folder):
    model = _load(folder)
    before = _state(model)
    with pytest.raises(RuntimeError, match="boom"):
        with request_yarn(model, 2 * TRAIN_LEN, factors=(1, 2)):
            assert model.model.rotary_emb is not before[0]
            raise RuntimeError("boom")
    assert _state(model) == before


def test_a_request_no_factor_covers_is_refused_before_generating(folder):
    model = _load(folder)
    before = _state(model)
    with pytest.raises(ConfigError, match="needed_tokens: 70 tokens"):
        generate(model, _ids(66), 4, factors=(1, 2))
    assert _state(model) == before
