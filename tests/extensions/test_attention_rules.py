"""The attention-changing methods: the blocked kernel against the plain-loop oracle (one pair at a time, float64),
identity settings against plain RoPE attention (torch SDPA), the KV-cache decode against the full forward, and
which keys attention sinks keep."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from posenc._internal.errors import ConfigError
from posenc.attention import attention_method_names, attention_rule, reference
from posenc.attention.kernel import rotate, rule_attention
from posenc.attention.methods import STRING, DualChunk, LeakyReRoPE, LMInfinite, ReRoPE, SelfExtend, Sinks
from posenc.extensions import ExtensionSpec, method_config, method_names
from posenc.rope.apply import default_inv_freq


def qkv(T, Hq=4, Hk=2, D=8, dtype=torch.float64, seed=0, B=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, T, D, generator=g, dtype=dtype) for h in (Hq, Hk, Hk))


def oracle(q, k, v, rule, inv_freq, attention_scaling=1.0):
    """The reference per (batch, head), GQA mapping h -> h // (Hq / Hk)."""
    B, Hq = q.shape[:2]
    g = Hq // k.shape[1]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            out[b, h] = torch.tensor(reference.attention(q[b, h].tolist(), k[b, h // g].tolist(),
                                                         v[b, h // g].tolist(), rule, inv_freq.tolist(),
                                                         attention_scaling=attention_scaling), dtype=torch.float64)
    return out


RULES = [SelfExtend(group_size=3, window=4), SelfExtend(group_size=2, window=5), ReRoPE(window=5),
         LeakyReRoPE(window=4, leak=2.5), DualChunk(chunk_size=6, local_window=2), DualChunk(chunk_size=5, local_window=0),
         Sinks(n_sink=2, window=5), Sinks(n_sink=0, window=4), STRING(shift=7, local_window=2),
         STRING(shift=3, local_window=1), LMInfinite(n_global=3, n_local=5, ceiling=8),
         LMInfinite(n_global=2, n_local=4, ceiling=4), LMInfinite(n_global=0, n_local=6, ceiling=6)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.name}{tuple(r.params().values())}")
def test_kernel_equals_reference(rule):
    q, k, v = qkv(23)
    inv = default_inv_freq(8, 100.0).double()
    want = oracle(q, k, v, rule, inv, attention_scaling=1.1)
    got = rule_attention(q, k, v, rule, inv, attention_scaling=1.1, block=8)  # several query blocks
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # float32 (torch's CPU flash kernel for the pieces): within float32 rounding of the oracle
    got32 = rule_attention(q.float(), k.float(), v.float(), rule, inv.float(), attention_scaling=1.1, block=8)
    torch.testing.assert_close(got32.double(), want, rtol=2e-5, atol=2e-5)


rules = st.one_of(
    st.builds(SelfExtend, group_size=st.integers(1, 5), window=st.integers(1, 12)),
    st.builds(ReRoPE, window=st.integers(1, 12)),
    st.builds(LeakyReRoPE, window=st.integers(1, 12), leak=st.floats(1.0, 8.0)),
    st.tuples(st.integers(2, 10), st.integers(0, 9)).filter(lambda t: t[1] < t[0])
    .map(lambda t: DualChunk(chunk_size=t[0], local_window=t[1])),
    st.builds(Sinks, n_sink=st.integers(0, 4), window=st.integers(1, 10)),
    st.tuples(st.integers(2, 12), st.integers(1, 11)).filter(lambda t: t[1] < t[0])
    .map(lambda t: STRING(shift=t[0], local_window=t[1])),
    st.tuples(st.integers(0, 4), st.integers(1, 8), st.integers(0, 6))
    .map(lambda t: LMInfinite(n_global=t[0], n_local=t[1], ceiling=t[1] + t[2])))


@settings(max_examples=30, deadline=None)
@given(rule=rules, T=st.integers(1, 20), past=st.integers(0, 6), block=st.integers(1, 16), seed=st.integers(0, 99))
def test_kernel_equals_reference_property(rule, T, past, block, seed):
    """Any rule, length, query offset (a decode chunk after `past` cached keys) and block size."""
    q, k, v = qkv(T + past, Hq=2, Hk=1, D=6, seed=seed)
    q = q[:, :, past:]
    inv = default_inv_freq(4, 50.0).double()  # partial rotary: 4 of 6 dims rotate
    B, H = q.shape[:2]
    want = torch.empty(B, H, T, 6, dtype=torch.float64)
    for h in range(H):
        want[0, h] = torch.tensor(reference.attention(q[0, h].tolist(), k[0, 0].tolist(), v[0, 0].tolist(), rule,
                                                      inv.tolist()), dtype=torch.float64)
    got = rule_attention(q, k, v, rule, inv, block=block)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def plain_rope_attention(q, k, v, inv, layout="half"):
    T = q.shape[2]
    pos = torch.arange(T, dtype=torch.float64)
    qr, kr = rotate(q, pos, inv, 1.0, layout), rotate(k, pos, inv, 1.0, layout)
    return F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("rule", [SelfExtend(group_size=4, window=40), SelfExtend(group_size=1, window=3),
                                  ReRoPE(window=40), LeakyReRoPE(window=3, leak=1.0), LeakyReRoPE(window=40, leak=3.0),
                                  DualChunk(chunk_size=50, local_window=10), Sinks(n_sink=4, window=40),
                                  STRING(shift=40, local_window=8), LMInfinite(n_global=4, n_local=40, ceiling=40)],
                         ids=lambda r: f"{r.name}{tuple(r.params().values())}")
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_identity_settings_equal_plain_rope_attention(rule, layout):
    q, k, v = qkv(40, dtype=torch.float32)
    inv = default_inv_freq(8)
    assert rule.identity_for(40)
    torch.testing.assert_close(rule_attention(q, k, v, rule, inv, layout=layout, block=16),
                               plain_rope_attention(q, k, v, inv, layout), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.name}{tuple(r.params().values())}")
def test_kv_cache_decode_equals_full_forward(rule):
    """Token by token (queries after a growing cache of unrotated keys) == one full forward."""
    q, k, v = qkv(30, dtype=torch.float32)
    inv = default_inv_freq(8)
    full = rule_attention(q, k, v, rule, inv)
    steps = [rule_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], rule, inv)]
    for t in range(5, 30):
        steps.append(rule_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], rule, inv))
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule", [Sinks(n_sink=3, window=6), LMInfinite(n_global=3, n_local=6, ceiling=9)],
                         ids=["sinks", "lm-infinite"])
def test_sinks_and_lm_infinite_keep_only_first_and_recent_tokens(rule):
    """Changing a value outside the first 3 + last 6 keys (sinks' n_sink + window, LM-Infinite's n_global +
    n_local) changes nothing; inside, it does."""
    q, k, v = qkv(30)
    inv = default_inv_freq(8).double()
    base = rule_attention(q, k, v, rule, inv)[:, :, -1]
    for j in range(30):
        v2 = v.clone()
        v2[:, :, j] += 10.0
        changed = not torch.allclose(rule_attention(q, k, v2, rule, inv)[:, :, -1], base)
        assert changed == (j < 3 or j >= 30 - 6), j


def test_string_and_lm_infinite_distances():
    """STRING: distances below S kept, from S on moved back by S - W, so the farthest pair of an input of its reach
    L + S - W sits at L - 1; LM-Infinite: kept pairs at min(i - j, ceiling)."""
    L, rule = 96, STRING(shift=32, local_window=4)
    n = rule.reach(L)
    assert [reference.string_pair(i, 0, 32, 4)[0] for i in (31, 32, 33, n - 1)] == [31.0, 4.0, 5.0, L - 1.0]
    dist = {d for i in range(n) for d in [reference.string_pair(i, 0, 32, 4)[0]]}
    assert max(dist) == L - 1 and 3.0 in dist and 4.0 in dist
    assert reference.lm_infinite_pair(50, 2, 3, 6, 9) == (9.0, 0.0)
    assert reference.lm_infinite_pair(50, 46, 3, 6, 9) == (4.0, 0.0)
    assert reference.lm_infinite_pair(50, 10, 3, 6, 9) is None


def test_string_and_lm_infinite_defaults_follow_their_papers():
    """STRING: S = L // 3 and W = 128 (capped at S // 4 on short trained lengths); LM-Infinite: 10 starting tokens,
    n_local and the ceiling at L."""
    assert attention_rule("string", ExtensionSpec(original=4096, factor=2.0, rotary_dim=16)) == STRING(1365, 128)
    assert attention_rule("string", ExtensionSpec(original=32, factor=2.0, rotary_dim=8)) == STRING(10, 2)
    assert attention_rule("lm-infinite", ExtensionSpec(original=4096, factor=8.0, rotary_dim=16)) \
        == LMInfinite(n_global=10, n_local=4096, ceiling=4096)


def test_far_positions_stay_in_range():
    """Self-Extend's farthest distance at its reach is below L; DCA's never exceeds chunk_size."""
    L = 64
    se = SelfExtend(group_size=4, window=16)
    n = se.reach(L)
    i, j = n - 1, 0
    qp, kp = reference.self_extend_pair(i, j, 4, 16)
    assert qp - kp < L
    dca = DualChunk(chunk_size=48, local_window=4)
    assert max(a - b for a, b in (reference.dual_chunk_pair(i, j, 48, 4) for i in range(300) for j in range(i + 1))) \
        <= 48


def test_registry_and_validation():
    assert set(attention_method_names()) >= {"self-extend", "rerope", "leaky-rerope", "dca", "sinks", "string",
                                            "lm-infinite"}
    assert not set(attention_method_names()) & set(method_names())
    spec = ExtensionSpec(original=128, factor=4.0, rotary_dim=16)
    rule = attention_rule("self-extend", spec)
    assert rule.reach(128) >= 512 and rule.window == 32
    assert attention_rule("leaky-rerope", spec).leak > 1
    with pytest.raises(ConfigError, match="group_size"):
        attention_rule("self-extend", spec, group_size=0)
    with pytest.raises(ConfigError, match="local_window"):
        attention_rule("dca", spec, chunk_size=8, local_window=8)
    with pytest.raises(ConfigError, match="leak"):
        attention_rule("leaky-rerope", spec, leak=0.5)
    with pytest.raises(ConfigError, match="n_sink"):
        attention_rule("sinks", spec, n_sink=-1)
    with pytest.raises(ConfigError, match="local_window must be below shift"):
        attention_rule("string", spec, shift=8, local_window=8)
    with pytest.raises(ConfigError, match="ceiling must be at least n_local"):
        attention_rule("lm-infinite", spec, n_local=16, ceiling=8)
    with pytest.raises(ConfigError, match="n_global"):
        attention_rule("lm-infinite", spec, n_global=-1)
    with pytest.raises(ConfigError, match="takes no option window_size"):
        attention_rule("rerope", spec, window_size=3)
    with pytest.raises(ConfigError, match="changes attention"):
        method_config("dca", spec)
    with pytest.raises(ConfigError, match="method: expected one of self-extend"):
        attention_rule("yarn", spec)


def test_a_typed_rule_is_the_named_method_with_the_same_options():
    """posenc.SelfExtend(...) and ("self-extend", ...) resolve to the same rule; fields left out are derived from the
    trained length in both forms, fields given stay."""
    import posenc

    spec = ExtensionSpec(original=128, factor=4.0, rotary_dim=16)
    for typed, name, options in [(posenc.SelfExtend(group_size=4, window=16), "self-extend",
                                  dict(group_size=4, window=16)),
                                 (posenc.SelfExtend(window=16), "self-extend", dict(window=16)),
                                 (posenc.ReRoPE(), "rerope", {}), (posenc.LeakyReRoPE(leak=2.0), "leaky-rerope",
                                                                   dict(leak=2.0)),
                                 (posenc.DualChunk(chunk_size=64), "dca", dict(chunk_size=64)),
                                 (posenc.Sinks(n_sink=2), "sinks", dict(n_sink=2)),
                                 (posenc.STRING(), "string", {}), (posenc.STRING(shift=40), "string", dict(shift=40)),
                                 (posenc.LMInfinite(n_global=4), "lm-infinite", dict(n_global=4))]:
        assert typed.name == name
        resolved = attention_rule(typed, spec)
        assert resolved == attention_rule(name, spec, **options)
        assert not resolved.unresolved() and all(getattr(resolved, k) == v for k, v in options.items())
    assert attention_rule(posenc.SelfExtend(), spec) == SelfExtend(group_size=attention_rule("self-extend", spec)
                                                                   .group_size, window=32)


def test_a_typed_rule_refuses_unknown_fields_and_bad_values_at_construction():
    import posenc

    with pytest.raises(TypeError, match="window_size"):
        posenc.SelfExtend(window_size=1024)
    with pytest.raises(TypeError, match="leak"):
        posenc.ReRoPE(window=8, leak=2.0)
    with pytest.raises(ConfigError, match=r"^group_size must be") as bad:
        posenc.SelfExtend(group_size=0, window=1024)
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"^leak "):
        posenc.LeakyReRoPE(leak=0.5)
    with pytest.raises(ConfigError, match="local_window must be below chunk_size"):
        posenc.DualChunk(chunk_size=8, local_window=8)
    with pytest.raises(ConfigError, match="window"):
        posenc.Sinks(window="64")
    with pytest.raises(ConfigError, match="a self-extend rule holds its options"):
        attention_rule(posenc.SelfExtend(window=4), ExtensionSpec(original=32, factor=2.0, rotary_dim=8), window=8)
    with pytest.raises(Exception, match="frozen|cannot assign"):
        posenc.SelfExtend(window=4).window = 8


def test_the_kernel_refuses_a_rule_whose_derived_fields_are_unset():
    q, k, v = qkv(8)
    with pytest.raises(ConfigError, match="^group_size: the self-extend rule has no group_size"):
        rule_attention(q, k, v, SelfExtend(window=4), default_inv_freq(8))


def test_a_plugin_attention_method_runs_through_its_registry_alone():
    """A rule class registered with register_attention_method whose rule is new (a plain sliding window, one mode)
    is read by attention_rule (its field derived from the trained length) and run by the kernel with no name known
    anywhere: it equals SDPA with a banded causal mask."""
    from dataclasses import dataclass

    from posenc.attention import ATTENTION_METHODS, AttentionRule, Mode, register_attention_method, window_mode
    from posenc.extensions.catalogue import all_method_names, method_label

    @register_attention_method("test-window", label="window", costs="one pass over the window")
    @dataclass(frozen=True)
    class Window(AttentionRule):
        window: int | None = None

        def resolve(self, original, target):
            return self.with_defaults(window=original // 4)

        def modes(self):
            return (window_mode("recent", self.window),)

        def identity_for(self, n):
            return self.window >= n

        keeps = "last window tokens"

    try:
        spec = ExtensionSpec(original=32, factor=2.0, rotary_dim=8)
        assert attention_rule("test-window", spec).window == 8
        rule = attention_rule("test-window", spec, window=6)
        assert rule == attention_rule(Window(window=6), spec)
        assert "test-window" in all_method_names() and method_label("test-window") == "window"
        assert isinstance(rule.modes()[0], Mode)
        q, k, v = qkv(30, dtype=torch.float32)
        inv = default_inv_freq(8)
        pos = torch.arange(30, dtype=torch.float64)
        qr, kr = rotate(q, pos, inv, 1.0, "half"), rotate(k, pos, inv, 1.0, "half")
        i, j = torch.arange(30)[:, None], torch.arange(30)[None, :]
        want = F.scaled_dot_product_attention(qr, kr, v, attn_mask=(j <= i) & (i - j < 6), enable_gqa=True)
        torch.testing.assert_close(rule_attention(q, k, v, rule, inv, block=8), want, rtol=2e-6, atol=2e-6)
        with pytest.raises(ConfigError, match="expected a dataclass subclass of AttentionRule"):
            register_attention_method("test-bad", label="bad")(lambda spec: None)
        with pytest.raises(ConfigError, match="already registered as an attention method"):
            from posenc.extensions import register_method

            register_method("test-window", label="w")(lambda spec: {"rope_type": "linear", "factor": 2.0})
    finally:
        ATTENTION_METHODS.pop("test-window", None)
