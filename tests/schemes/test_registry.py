"""The scheme registry: registration (class or factory), the model arguments a factory receives, clear errors,
per-layer views and custom training positions reaching the attention."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc._internal.errors import ConfigError
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import SCHEMES, NoPEScheme, Scheme, make_scheme, register_scheme, scheme_names


@pytest.fixture
def registered():
    """Names registered by a test are removed afterwards."""
    before = set(SCHEMES)
    yield
    for name in set(SCHEMES) - before:
        del SCHEMES[name]


def test_a_registered_class_gets_only_the_arguments_it_names(registered):
    seen = {}

    @register_scheme("test-heads")
    class Heads(Scheme):
        """Records what it was given."""

        def __init__(self, n_heads, head_dim, flavour="plain"):
            super().__init__()
            seen.update(n_heads=n_heads, head_dim=head_dim, flavour=flavour)

    s = make_scheme("test-heads", d_model=48, n_heads=3, max_len=8, flavour="spicy", unused=1)
    assert isinstance(s, Heads) and s.name == "test-heads"
    assert seen == {"n_heads": 3, "head_dim": 16, "flavour": "spicy"}
    assert "test-heads" in scheme_names() and "test-heads" in posenc.SCHEME_NAMES  # derived, never stale
    assert SCHEMES["test-heads"].description == "Records what it was given."


def test_a_factory_function_with_kwargs_gets_the_whole_model_description(registered):
    got = {}

    @register_scheme("test-factory")
    def build(**model):
        got.update(model)
        return NoPEScheme()

    cfg = ModelConfig(scheme="test-factory", d_model=32, n_heads=2, n_layers=3, max_len=20,
                      scheme_options={"nope_every": 4})
    TinyLM(cfg)
    assert {k: got[k] for k in ("d_model", "n_heads", "head_dim", "n_layers", "max_len", "nope_every")} == \
        {"d_model": 32, "n_heads": 2, "head_dim": 16, "n_layers": 3, "max_len": 20, "nope_every": 4}
    assert {"vocab_size", "rope_base", "rope_layout", "rope_scaling"} <= set(got)


def test_registration_errors_name_the_problem(registered):
    with pytest.raises(ConfigError, match="scheme 'rope' is already registered .*builtin"):
        register_scheme("rope")
    with pytest.raises(ConfigError, match="must subclass posenc.schemes.Scheme"):
        register_scheme("test-bad")(int)
    with pytest.raises(ConfigError, match="name must be letters"):
        register_scheme("a,b")

    @register_scheme("test-returns-int")
    def not_a_scheme():
        return 3

    with pytest.raises(ConfigError, match="test-returns-int.*returned int"):
        make_scheme("test-returns-int", d_model=8, n_heads=2, max_len=4)

    @register_scheme("test-needs-more")
    class NeedsMore(Scheme):
        def __init__(self, window):
            super().__init__()

    with pytest.raises(ConfigError, match="test-needs-more.*needs window"):
        make_scheme("test-needs-more", d_model=8, n_heads=2, max_len=4)
    register_scheme("rope", replace=True)(SCHEMES["rope"].factory)  # replace=True is the explicit override


class _PerLayer(Scheme):
    """Layer 0 uses RoPE, the other layers NoPE: a per-layer schedule (iRoPE-like)."""

    def __init__(self, **model):
        super().__init__()
        self.rope = make_scheme("rope", **{k: model[k] for k in ("d_model", "n_heads", "max_len")})
        self.nope = NoPEScheme()
        self.calls = []

    def for_layer(self, layer):
        self.calls.append(layer)
        return self.rope if layer == 0 else self.nope


def _forward_with(model, views, tokens, positions):
    """The oracle: TinyLM's forward written out with an explicit scheme per block."""
    x = model.tok_emb(tokens) * model.cfg.d_model ** 0.5
    for block, view in zip(model.blocks, views):
        x = block(x, view, positions, None, contiguous=False)
    return torch.nn.functional.linear(model.ln_f(x), model.tok_emb.weight)


def test_each_layer_uses_its_own_view(registered):
    register_scheme("test-per-layer")(_PerLayer)
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="test-per-layer", d_model=32, n_heads=2, n_layers=3, max_len=16)).eval()
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        got = model(tokens)
        s = model.scheme
        want = _forward_with(model, [s.rope, s.nope, s.nope], tokens, torch.arange(12))
        all_rope = _forward_with(model, [s.rope] * 3, tokens, torch.arange(12))
    assert s.calls == [0, 1, 2]
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, all_rope)


def test_training_positions_replace_the_default_only_while_training():
    torch.manual_seed(1)
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_heads=2, n_layers=2, max_len=64))
    tokens = torch.randint(0, 256, (2, 10))
    spread = torch.arange(10) * 3  # e.g. a sorted random subset of 0..N-1 (randomized positions)
    model.train_positions = lambda batch, seq_len, device: spread[:seq_len].to(device)
    with torch.no_grad():
        model.train()
        trained = model(tokens)
        model.eval()
        evaluated = model(tokens)
        torch.testing.assert_close(trained, _forward_with(model, [model.scheme] * 2, tokens, spread))
        torch.testing.assert_close(evaluated, _forward_with(model, [model.scheme] * 2, tokens, torch.arange(10)))
    learned = TinyLM(ModelConfig(scheme="learned", d_model=32, n_heads=2, n_layers=1, max_len=16)).train()
    learned.train_positions = lambda batch, seq_len, device: torch.arange(seq_len, device=device) * 3
    with pytest.raises(ConfigError, match="sequence length 28.*max_len=16"):  # largest position 27
        learned(tokens)
