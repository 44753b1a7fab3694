"""The built-in schemes: each hook against the lesson's reference loops or a law it must satisfy; RoPE through
posenc.Rotary (the library's module) with the lab's per-sequence length rule."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from posenc import reference, rope_parameters
from posenc._internal.errors import ConfigError, PosencError
from posenc.schemes import AttentionContext, make_scheme, scheme_names

D_MODEL, HEADS = 32, 4
BUILTIN = ("nope", "sinusoidal", "learned", "rope", "alibi", "rope+alibi")


def _scheme(name, **kw):
    return make_scheme(name, d_model=D_MODEL, n_heads=HEADS, max_len=16, **kw)


def _ctx(q_pos, k_pos=None, past=0):
    q_pos = torch.as_tensor(q_pos)
    return AttentionContext(q_pos, q_pos if k_pos is None else torch.as_tensor(k_pos), past=past)


def _rotate(s, x, positions):
    """Rotate x alone at ``positions`` (x as the query; a one-token key at position 0 alongside)."""
    k = torch.zeros(*x.shape[:-2], 1, x.shape[-1], dtype=x.dtype)
    return s.rotate_qk(x, k, _ctx(positions, [0], past=int(positions[0])))[0]


def test_every_builtin_builds_and_declares_its_capabilities():
    assert scheme_names()[:6] == BUILTIN
    expect = {"nope": (False, False, False), "sinusoidal": (True, False, False), "learned": (True, False, False),
              "rope": (False, True, False), "alibi": (False, False, True), "rope+alibi": (False, True, True)}
    for name in BUILTIN:
        s = _scheme(name)
        caps = s.capabilities
        assert s.name == name
        assert (caps.embeds, caps.rotates, caps.biases) == expect[name]
        assert caps.extendable == ("rope" in name) and caps.max_len == (16 if name == "learned" else None)


def test_unknown_scheme_names_the_choices():
    with pytest.raises(ConfigError, match="scheme: expected one of .*rope\\+alibi.*'t6'"):
        _scheme("t6")


def test_bad_rope_layout_and_indivisible_width():
    with pytest.raises(ConfigError, match="rope_layout"):
        _scheme("rope", rope_layout="diagonal")
    with pytest.raises(ConfigError, match="d_model must be divisible by n_heads"):
        make_scheme("rope", d_model=30, n_heads=4, max_len=8)


def test_sinusoidal_embed_adds_the_lesson_table():
    s = _scheme("sinusoidal")
    x = torch.zeros(1, 6, D_MODEL)
    pos = torch.arange(10, 16)
    table = reference.sinusoidal(16, D_MODEL)
    torch.testing.assert_close(s.embed(x, pos)[0], torch.tensor(table[10:16]), atol=1e-6, rtol=0)


def test_learned_table_refuses_positions_past_it():
    s = _scheme("learned")
    s.embed(torch.zeros(1, 16, D_MODEL), torch.arange(16))
    with pytest.raises(PosencError, match="max_len=16"):
        s.embed(torch.zeros(1, 2, D_MODEL), torch.arange(15, 17))


@pytest.mark.parametrize("layout,ref", [("interleaved", reference.apply_rope), ("half", reference.apply_rope_half)])
def test_rope_rotation_matches_the_reference_loop(layout, ref):
    s = _scheme("rope", rope_layout=layout)
    x = torch.randn(1, 1, 5, D_MODEL // HEADS, dtype=torch.float64)
    pos = torch.arange(3, 8)
    want = torch.tensor([ref(x[0, 0, t].tolist(), float(pos[t])) for t in range(5)], dtype=torch.float64)
    torch.testing.assert_close(_rotate(s, x, pos)[0, 0], want, atol=1e-6, rtol=0)
    q, k = s.rotate_qk(x, x, _ctx(pos))  # the joint path (q and k at the same positions)
    torch.testing.assert_close(q[0, 0], want, atol=1e-6, rtol=0)
    torch.testing.assert_close(k[0, 0], want, atol=1e-6, rtol=0)


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
        qr, kr = s.rotate_qk(q, k, _ctx([a], [b], past=a))
        return (qr * kr).sum().item()

    assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-6, abs_tol=1e-6)


def test_rope_scaling_comes_from_the_registry_and_dynamic_uses_each_sequences_length():
    s = _scheme("rope")
    assert not s.length_dependent and s.rope_type == "default"
    s.set_rope_scaling({"rope_type": "dynamic", "factor": 1.0})
    assert s.length_dependent and s.rope_type == "dynamic" and s.rope_config["rope_scaling"]["factor"] == 1.0
    x = torch.randn(1, 1, 64, D_MODEL // HEADS, dtype=torch.float64)

    def rotated_with(length):  # the oracle: rotate with rope_parameters at exactly this length
        inv, _ = rope_parameters(s.rope_config, seq_len=length)
        return torch.tensor([reference.apply_rope_half(x[0, 0, t].tolist(), float(t), inv_freq=inv.tolist())
                             for t in range(length)], dtype=torch.float64)

    # a long sequence, then a shorter one still past max_position_embeddings (16): each gets its own length's
    # frequencies (transformers' stateful rule would keep the larger scale for the second)
    for length in (64, 40, 16, 40):
        pos = torch.arange(length)
        got, _ = s.rotate_qk(x[..., :length, :], x[..., :length, :], _ctx(pos))
        torch.testing.assert_close(got[0, 0], rotated_with(length), atol=1e-6, rtol=0)
    s.set_rope_scaling({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 64)
    assert s.rotary.attention_scaling == rope_parameters(s.rope_config)[1] > 1
    s.set_rope_scaling(None)
    assert s.rope_type == "default" and s.rotary.attention_scaling == 1.0


def test_bad_rope_scaling_fails_when_set_not_mid_run():
    s = _scheme("rope")
    with pytest.raises(ConfigError):
        s.set_rope_scaling({"rope_type": "yarn"})  # no factor and no original length


@pytest.mark.parametrize("name", ["alibi", "rope+alibi"])
def test_alibi_bias_matches_the_reference_loop(name):
    s = _scheme(name)
    want = torch.tensor(reference.alibi_bias(HEADS, 7))
    q = k = torch.zeros(1, HEADS, 7, D_MODEL // HEADS)
    torch.testing.assert_close(s.bias(q, k, _ctx(torch.arange(7))), want)
    # with a cache: the last 2 queries of 7 keys are the last 2 rows
    torch.testing.assert_close(s.bias(q[:, :, :2], k, _ctx(torch.arange(5, 7), torch.arange(7), past=5)), want[:, 5:])
    # positions that are not 0..T-1 (randomized positions): the bias follows the positions, not the indices
    pos = torch.tensor([0, 3, 4, 9])
    ctx = AttentionContext(pos, pos, contiguous=False)
    wide = reference.alibi_bias(HEADS, 10)
    want_far = torch.tensor([[[wide[h][i][j] for j in pos.tolist()] for i in pos.tolist()] for h in range(HEADS)])
    torch.testing.assert_close(s.bias(q[:, :, :4], k[:, :, :4], ctx), want_far)


def test_schemes_follow_the_model_device():
    """Every buffer the schemes build must follow the model's device (meta stands in for a GPU here)."""
    from posenc.nn.model import ModelConfig, TinyLM

    for scheme in ("alibi", "sinusoidal", "nope"):
        model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2)).to("meta")
        logits = model(torch.zeros(2, 16, dtype=torch.long, device="meta"))
        assert logits.device.type == "meta" and logits.shape == (2, 16, 256)
    for scheme in ("rope", "rope+alibi"):  # Rotary checks its positions' values, which meta tensors lack
        model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2)).to("meta")
        assert model.scheme.rotary.inv_freq.device.type == "meta"
        model.scheme.set_rope_scaling({"rope_type": "linear", "factor": 2.0})  # a new Rotary stays on the device
        assert model.scheme.rotary.inv_freq.device.type == "meta"


def test_length_dependence_comes_from_the_registry():
    """A rope type registered with a seq_len_rule is length dependent (keys cached before rotation); aliases too."""
    from posenc.rope.apply import default_inv_freq
    from posenc.rope.scaling import ROPE_SCALING_FUNCTIONS, register_rope_type

    @register_rope_type("test_grows_with_length", seq_len_rule="dynamic", required=("max_position_embeddings",))
    def _grows(cfg, seq_len):
        return default_inv_freq(cfg.rotary_dim, cfg.theta) / max(1, (seq_len or 1) // 16), 1.0

    try:
        assert _scheme("rope", rope_scaling={"rope_type": "test_grows_with_length"}).length_dependent
        assert _scheme("rope", rope_scaling={"rope_type": "dynamic", "factor": 2.0}).length_dependent
        assert not _scheme("rope", rope_scaling={"rope_type": "linear", "factor": 2.0}).length_dependent
        assert not _scheme("rope").length_dependent
    finally:
        del ROPE_SCALING_FUNCTIONS["test_grows_with_length"]


def test_a_bf16_model_keeps_its_frequencies_and_slopes_in_float32():
    """model.to(bf16) must not round RoPE / xPos frequencies or ALiBi slopes (bf16 inv_freq is off by up to 0.4%:
    radians at position 1500). Every scheme with such a buffer is built inside a TinyLM and cast."""
    from posenc.nn.model import ModelConfig, TinyLM

    for scheme in ("rope", "xpos", "alibi", "rope+alibi", "p-rope"):
        model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2)).to(torch.bfloat16)
        buffers = {name: b for name, b in model.named_buffers()
                   if name.rsplit(".", 1)[-1] in ("inv_freq", "original_inv_freq", "slopes")}
        assert buffers, scheme
        for name, b in buffers.items():
            assert b.dtype == torch.float32, (scheme, name, b.dtype)
        logits = model(torch.zeros(1, 8, dtype=torch.long))
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_the_cached_alibi_bias_follows_its_slopes():
    s = _scheme("alibi")
    q = k = torch.zeros(1, HEADS, 5, D_MODEL // HEADS)
    ctx = _ctx(torch.arange(5))
    first = s.bias(q, k, ctx).clone()
    with torch.no_grad():
        s.slopes.mul_(2)                                             # edited in place
    torch.testing.assert_close(s.bias(q, k, ctx), 2 * first)
    s.slopes = s.slopes / 4                                          # or replaced
    torch.testing.assert_close(s.bias(q, k, ctx), first / 2)
