"""The tiny decoder LM: config validation, shapes, tied head, shared init across schemes, greedy generation."""

from __future__ import annotations

import pytest
import torch

from posenc.errors import ConfigError
from posenc.nn.model import ModelConfig, TinyLM


def test_forward_shape_and_tied_head():
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_layers=2, n_heads=4, max_len=16))
    logits = model(torch.randint(0, 256, (3, 11)))
    assert logits.shape == (3, 11, 256) and logits.dtype == torch.float32
    assert "lm_head.weight" not in model.state_dict()  # tied to tok_emb, stored once
    h = model.ln_f(torch.randn(5, 32))
    torch.testing.assert_close(torch.nn.functional.linear(h, model.tok_emb.weight), h @ model.tok_emb.weight.T)


@pytest.mark.parametrize("bad,match", [(dict(scheme="t6"), "scheme"), (dict(d_model=30, n_heads=4), "d_model"),
                                       (dict(n_layers=0), "n_layers"), (dict(max_len=0), "max_len"),
                                       (dict(n_heads=True), "n_heads"), (dict(rope_layout="x"), "rope_layout"),
                                       (dict(scheme_options=[1]), "scheme_options")])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**bad)


def test_every_scheme_starts_from_the_same_shared_weights():
    """Same seed -> identical embedding/attention/MLP init whatever the scheme (the scheme is built last)."""
    states = []
    for scheme in ("nope", "learned", "rope", "alibi"):
        torch.manual_seed(0)
        states.append(TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2, max_len=8)).state_dict())
    shared = [k for k in states[0] if all(k in s for s in states)]
    assert "tok_emb.weight" in shared and len(shared) == len(states[0])
    for s in states[1:]:
        for k in shared:
            assert torch.equal(s[k], states[0][k]), k


def test_learned_model_refuses_lengths_past_its_table():
    model = TinyLM(ModelConfig(scheme="learned", d_model=32, n_layers=1, n_heads=2, max_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ConfigError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_generate_with_cache_equals_greedy_full_forwards(scheme):
    torch.manual_seed(4)
    model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=2, max_len=64)).eval()
    prompt = torch.randint(0, 256, (2, 9))
    seq = prompt
    with torch.no_grad():
        for _ in range(6):  # oracle: no cache, one full forward per token
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(model.generate(prompt, 6), seq[:, 9:])
