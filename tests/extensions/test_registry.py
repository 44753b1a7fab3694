"""The extension-method registry: registering a method, what readers get from it, and clear errors."""

from __future__ import annotations

import pytest

import posenc
from posenc._internal.errors import ConfigError
from posenc.extensions import (METHODS, ExtensionSpec, FitContext, get_method, method_config, method_label,
                               register_method)

SPEC = ExtensionSpec(original=100, factor=4.0, rotary_dim=16)


@pytest.fixture
def registered():
    before = set(METHODS)
    yield
    for name in set(METHODS) - before:
        del METHODS[name]


def test_a_new_method_is_one_decorated_function(registered):
    @posenc.register_method("test-half-pi", label="half PI", expects_finetune=True, note="tune it")
    def half_pi(spec):
        return {"rope_type": "linear", "factor": spec.factor / 2}

    written = method_config("test-half-pi", SPEC)
    assert written.scaling == {"rope_type": "linear", "factor": 2.0} and written.max_position_embeddings == 400
    assert method_label("test-half-pi") == "half PI" and get_method("test-half-pi").expects_finetune
    assert "test-half-pi" in posenc.method_names() and method_label("unknown") == "unknown"


def test_spec_and_registration_errors(registered):
    assert SPEC.target == 400 and SPEC.head_dim == 16
    with pytest.raises(ConfigError, match="factor must be"):
        ExtensionSpec(original=100, factor=0.5, rotary_dim=16)
    with pytest.raises(ConfigError, match="rotary_dim must be even"):
        ExtensionSpec(original=100, factor=2.0, rotary_dim=15)
    with pytest.raises(ConfigError, match="'yarn' is already registered"):
        register_method("yarn", label="again")
    with pytest.raises(ConfigError, match="label"):
        register_method("test-no-label", label="")
    with pytest.raises(ConfigError, match="extensions: expected one of .*llama3.*'no-such-method'"):
        get_method("no-such-method", "extensions")
    with pytest.raises(ConfigError, match="takes no option short_factor"):
        method_config("yarn", SPEC, short_factor=[1.0])

    @register_method("test-no-type", label="broken")
    def broken(spec):
        return {"factor": 2}

    with pytest.raises(ConfigError, match="test-no-type.*rope_type"):
        method_config("test-no-type", SPEC)


def test_a_method_that_fits_to_the_model_gets_the_model_and_data(registered):
    seen = {}

    def fit(spec, ctx: FitContext):
        seen.update(spec=spec, model=ctx.model, task=ctx.task)
        return {"rope_type": "linear", "factor": spec.factor * 2}

    @register_method("test-searched", label="searched", fit=fit)
    def initial(spec):
        return {"rope_type": "linear", "factor": spec.factor}

    from posenc.lab.evaluate import extension_config
    from posenc.nn.model import ModelConfig, TinyLM

    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_heads=2, n_layers=1, max_len=100))
    ctx = FitContext(model=model, task="lm", corpus=None, device="cpu", seed=0, eval_lens=[100, 400])
    written = extension_config("test-searched", model, 4.0, 100, ctx)
    assert written.scaling == {"rope_type": "linear", "factor": 8.0} and seen["model"] is model
    assert seen["spec"].original == 100 and seen["spec"].rotary_dim == 16 and seen["task"] == "lm"
    with pytest.raises(ConfigError, match="FitContext"):
        extension_config("test-searched", model, 4.0, 100)
