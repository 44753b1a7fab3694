"""Position schemes: each hook against the lesson's reference loops or a law it must satisfy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from posenc import reference
from posenc.errors import ConfigError, PosencError
from posenc.schemes import SCHEME_NAMES, make_scheme

D_MODEL, HEADS = 32, 4


def _scheme(name, **kw):
    return make_scheme(name, d_model=D_MODEL, n_heads=HEADS, max_len=16, **kw)


def test_every_name_builds_and_declares_its_hooks():
    expect = {"nope": (False, False), "sinusoidal": (False, False), "learned": (False, False),
              "rope": (True, False), "alibi": (False, True), "rope+alibi": (True, True)}
    for name in SCHEME_NAMES:
        s = _scheme(name)
        assert s.name == name
        assert (s.rotates, s.has_bias) == expect[name]


def test_unknown_scheme_names_the_choices():
    with pytest.raises(ConfigError, match="scheme: expected one of .*rope\\+alibi.*'t5'"):
        _scheme("t5")


def test_bad_rope_layout_and_indivisible_width():
    with pytest.raises(ConfigError, match="layout"):
        _scheme("rope", rope_layout="diagonal")
    with pytest.raises(ConfigError, match="d_model"):
        make_scheme("rope", d_model=30, n_heads=4, max_len=8)


def test_sinusoidal_embed_adds_the_lesson_table():
    s = _scheme("sinusoidal")
    x = torch.zeros(1, 6, D_MODEL)
    pos = torch.arange(10, 16)
    table = reference.sinusoidal(16, D_MODEL)
    torch.testing.assert_close(s.embed(x, pos)[0], torch.tensor(table[10:16]), atol=1e-6, rtol=0)


def test_learned_table_refuses_positions_past_it():
    s = _scheme("learned")
    assert s.max_len == 16
    s.embed(torch.zeros(1, 16, D_MODEL), torch.arange(16))
    with pytest.raises(PosencError, match="max_len=16"):
        s.embed(torch.zeros(1, 2, D_MODEL), torch.arange(15, 17))


@pytest.mark.parametrize("layout,ref", [("interleaved", reference.apply_rope), ("half", reference.apply_rope_half)])
def test_rope_rotation_matches_the_reference_loop(layout, ref):
    s = _scheme("rope", rope_layout=layout)
    x = torch.randn(1, 1, 5, D_MODEL // HEADS, dtype=torch.float64)
    pos = torch.arange(3, 8)
    got = s.rotate(x, pos, total_len=8)
    want = torch.tensor([ref(x[0, 0, t].tolist(), float(pos[t])) for t in range(5)], dtype=torch.float64)
    torch.testing.assert_close(got[0, 0], want, atol=1e-6, rtol=0)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 2000),
       scaling=st.sampled_from([None, {"rope_type": "linear", "factor": 4.0}, {"rope_type": "ntk", "factor": 8.0},
                                {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}]))
def test_rope_scores_depend_only_on_relative_position(m, n, shift, scaling):
    """The lesson's step 4, for every static scaling: q_m . k_n == q_(m+s) . k_(n+s)."""
    s = _scheme("rope", rope_scaling=scaling)
    g = torch.Generator().manual_seed(m * 1000 + n)
    q, k = torch.randn(2, 1, 1, 1, D_MODEL // HEADS, dtype=torch.float64, generator=g)

    def score(a, b):
        return (s.rotate(q, torch.tensor([a]), 1) * s.rotate(k, torch.tensor([b]), 1)).sum().item()

    assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-6, abs_tol=1e-6)


def test_rope_scaling_uses_the_registry_and_dynamic_depends_on_length():
    from posenc import rope_parameters

    s = _scheme("rope")
    assert not s.length_dependent
    s.set_scaling({"rope_type": "dynamic", "factor": 1.0})
    assert s.length_dependent and s.rope_type == "dynamic"
    for length in (8, 16, 64):
        inv, scale = rope_parameters(s.config, seq_len=length)
        torch.testing.assert_close(s.frequencies(length)[0], inv)
    assert torch.equal(s.frequencies(8)[0], s.frequencies(16)[0])  # at or below max_position_embeddings
    assert not torch.equal(s.frequencies(16)[0], s.frequencies(64)[0])
    s.set_scaling({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 64)
    inv, scale = rope_parameters(s.config)
    assert scale > 1 and s.frequencies(64)[1] == scale
    s.set_scaling(None)
    assert s.rope_type == "default" and s.frequencies(100)[1] == 1.0


def test_bad_rope_scaling_fails_when_set_not_mid_run():
    s = _scheme("rope")
    with pytest.raises((ValueError, KeyError)):
        s.set_scaling({"rope_type": "yarn"})  # no factor and no original length


@pytest.mark.parametrize("name", ["alibi", "rope+alibi"])
def test_alibi_bias_matches_the_reference_loop(name):
    s = _scheme(name)
    want = torch.tensor(reference.alibi_bias(HEADS, 7))
    torch.testing.assert_close(s.bias(7, 7, "cpu"), want)
    # with a cache: the last 2 queries of 7 keys are the last 2 rows
    torch.testing.assert_close(s.bias(2, 7, "cpu"), want[:, 5:])


def test_alibi_and_rope_models_run_off_the_cpu_device():
    """Every buffer the schemes build must follow the model's device (meta stands in for a GPU here)."""
    from posenc.model import ModelConfig, TinyLM

    for scheme in ("alibi", "rope+alibi", "rope", "sinusoidal"):
        model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2)).to("meta")
        logits = model(torch.zeros(2, 16, dtype=torch.long, device="meta"))
        assert logits.device.type == "meta" and logits.shape == (2, 16, 256)


def test_length_dependence_comes_from_the_registry():
    """A rope type registered with a seq_len_rule is length dependent (keys cached before rotation); aliases too."""
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS, register_rope_type

    @register_rope_type("test_grows_with_length", seq_len_rule="dynamic")
    def _grows(cfg, seq_len):
        return default_inv_freq(cfg.rotary_dim, cfg.theta) / max(1, (seq_len or 1) // 16), 1.0

    try:
        assert _scheme("rope", rope_scaling={"rope_type": "test_grows_with_length"}).length_dependent
        assert _scheme("rope", rope_scaling={"rope_type": "dynamic", "factor": 2.0}).length_dependent
        assert not _scheme("rope", rope_scaling={"rope_type": "linear", "factor": 2.0}).length_dependent
        assert not _scheme("rope").length_dependent
    finally:
        del ROPE_SCALING_FUNCTIONS["test_grows_with_length"]
