"""LongRoPE's search space: the monotone repair, the seeds (against closed forms and transformers' YaRN), the
operators (every child valid), the written longrope dict and LongRoPE's n_hat table."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import default_inv_freq, rope_cos_sin, rope_parameters
from posenc._internal.errors import ConfigError
from posenc.search.longrope_space import (PAPER_N_HAT_CHOICES, crossover, longrope_cos_sin, longrope_scaling,
                                          longrope_space, mutate, repair_monotone, seed_factors)

SPACE = dict(rotary_dim=32, theta=10000.0, original_length=128, target_length=1024)


# ------------------------------------------------------------------------------------------- repair

@pytest.mark.parametrize("values, expected", [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),          # already ordered: unchanged
    ([3.0, 1.0, 2.0], [2.0, 2.0, 2.0]),          # the least-squares monotone fit pools all three
    ([1.0, 3.0, 2.0, 4.0], [1.0, 2.5, 2.5, 4.0]),
    ([5.0, 4.0, 3.0, 2.0, 1.0], [3.0] * 5),
])
def test_repair_monotone_examples(values, expected):
    assert repair_monotone(values) == pytest.approx(expected)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(-100, 100), min_size=1, max_size=40))
def test_repair_monotone_laws(values):
    out = repair_monotone(values)
    assert len(out) == len(values)
    assert all(a <= b + 1e-9 for a, b in zip(out, out[1:]))                  # non-decreasing
    assert sum(out) == pytest.approx(sum(values), abs=1e-6)                  # pooling keeps the sum
    assert repair_monotone(out) == pytest.approx(out)                         # a projection: idempotent
    # least squares: no better non-decreasing fit among simple alternatives (the sorted values, the cumulative max)
    sse = sum((a - b) ** 2 for a, b in zip(out, values))
    cummax = [max(values[:i + 1]) for i in range(len(values))]
    assert sse <= sum((a - b) ** 2 for a, b in zip(cummax, values)) + 1e-6
    assert sse <= sum((a - b) ** 2 for a, b in zip(sorted(values), values)) + 1e-6


# ------------------------------------------------------------------------------------------- seeds

@pytest.mark.parametrize("factor", [2.0, 8.0, 5.5])
def test_seeds_match_closed_forms(factor):
    d = 32
    kw = dict(rotary_dim=d, theta=1e4, original_length=128, factor=factor)
    j = torch.arange(d // 2, dtype=torch.float64)
    torch.testing.assert_close(seed_factors("linear", **kw), torch.full((d // 2,), factor, dtype=torch.float64),
                               rtol=1e-6, atol=0)
    # NTK-aware: theta' = theta * s^(d/(d-2)) divides pair j by s^(2j/(d-2)); 1 at the top, s at the bottom
    torch.testing.assert_close(seed_factors("ntk", **kw), factor ** (2 * j / (d - 2)), rtol=2e-6, atol=0)
    torch.testing.assert_close(seed_factors("default", **kw), torch.ones(d // 2, dtype=torch.float64))


def test_yarn_seed_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    d, theta, orig, s = 64, 10000.0, 256, 4.0
    config = LlamaConfig(hidden_size=d * 2, num_attention_heads=2, max_position_embeddings=int(orig * s),
                         rope_parameters={"rope_type": "yarn", "factor": s, "original_max_position_embeddings": orig,
                                          "rope_theta": theta})
    hf_inv, _ = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    expected = default_inv_freq(d, theta).double() / hf_inv.double()
    got = seed_factors("yarn", rotary_dim=d, theta=theta, original_length=orig, factor=s)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    assert got[0] == pytest.approx(1.0) and got[-1] == pytest.approx(s)      # kept ... interpolated
    assert bool((got.diff() >= 0).all())


def test_seed_from_a_mapping_and_bad_seeds():
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 128}
    got = seed_factors(llama3, rotary_dim=32, theta=1e4, original_length=128, factor=8.0)
    inv, _ = rope_parameters({"head_dim": 32, "rope_parameters": {**llama3, "rope_theta": 1e4}})
    torch.testing.assert_close(got, default_inv_freq(32, 1e4).double() / inv.double())
    with pytest.raises(ConfigError, match="not a registered rope_type"):
        seed_factors("pi", rotary_dim=32, theta=1e4, original_length=128, factor=8.0)


# --------------------------------------------------------------------------------------- the space

def test_space_defaults_follow_the_paper():
    space = longrope_space(**SPACE)
    assert space.factor == 8.0 and space.max_factor == 10.0 and space.step == 0.01     # 1.25 x s, 0.01 grid
    assert space.top == 900 and space.factors([0, 7, 900]) == [1.0, 1.07, 10.0]
    assert space.index([0.5, 12.0]) == (0, 900)                                        # clamped to [1, 1.25 s]
    assert space.index([3.0, 2.0]) == (150, 150)                                       # made non-decreasing
    assert longrope_space(rotary_dim=32, theta=1e4, original_length=128, factor=4.0).target_length == 512


@pytest.mark.parametrize("kwargs, match", [
    (dict(SPACE, rotary_dim=31), "rotary_dim"),
    (dict(SPACE, theta=0.5), "theta"),
    (dict(SPACE, target_length=None), "target_length or factor"),
    (dict(SPACE, factor=0.5), "factor"),
    (dict(SPACE, n_hat_choices=(0, -1)), "n_hat_choices"),
    (dict(SPACE, n_hat_choices=(0, 0)), "repeat"),
    (dict(SPACE, n_hat_choices=()), "n_hat_choices"),
    (dict(SPACE, max_factor=1.0), "max_factor"),
    (dict(SPACE, step=0.0), "step"),
])
def test_space_rejects_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        longrope_space(**kwargs)


# ----------------------------------------------------------------------------------------- operators

@st.composite
def spaces_and_parents(draw):
    space = longrope_space(rotary_dim=2 * draw(st.integers(1, 24)), theta=1e4, original_length=64,
                           target_length=64 * draw(st.integers(2, 16)), step=draw(st.sampled_from([0.01, 0.1, 0.25])),
                           n_hat_choices=draw(st.sampled_from([(0,), (0, 4, 8), PAPER_N_HAT_CHOICES[:8]])))

    def parent():
        k = sorted(draw(st.lists(st.integers(0, space.top), min_size=space.n_pairs, max_size=space.n_pairs)))
        return tuple(k), draw(st.sampled_from(space.n_hat_choices))

    return space, parent(), parent()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(spaces_and_parents(), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0), st.floats(0.01, 2.0))
def test_operators_keep_every_constraint(setup, seed, prob, scale):
    space, a, b = setup
    rng = random.Random(seed)
    assert space.is_valid(a) and space.is_valid(b)
    for _ in range(5):
        child = mutate(space, a, rng, prob=prob, scale=scale)
        assert space.is_valid(child), child
        child = crossover(space, a, b, rng, prob=prob)
        assert space.is_valid(child), child
        # pooling averages the mix, so every value stays within the range of the parents' values
        assert min(a[0] + b[0]) <= min(child[0]) and max(child[0]) <= max(a[0] + b[0])
    assert crossover(space, a, b, rng, prob=0.0) == a and crossover(space, a, b, rng, prob=1.0) == b


def test_crossover_repairs_only_a_mix_that_breaks_the_order():
    space = longrope_space(**SPACE)
    rng = random.Random(0)
    a, b = (tuple(range(0, 160, 10)), 0), (tuple(range(5, 165, 10)), 0)   # interleaved: every mix is ordered
    children = {crossover(space, a, b, rng, prob=0.5)[0] for _ in range(50)}
    assert len(children) > 10
    assert all(x in (p, q) for child in children for x, p, q in zip(child, a[0], b[0]))

    class Draws:  # take pair 0 from b, everything else (and n_hat) from a
        def __init__(self):
            self.values = iter([0.0] + [0.99] * 16)

        def random(self):
            return next(self.values)

    a, b = ((0,) * 8 + (700,) * 8, 0), ((400,) * 16, 4)
    # the mix [400, 0 x 7, 700 x 8] breaks the order; its least-squares repair pools the first 8: 400 / 8 = 50
    assert crossover(space, a, b, Draws(), prob=0.5) == ((50,) * 8 + (700,) * 8, 0)


# ------------------------------------------------------------------------------------ the written dict

def test_longrope_scaling_dict():
    out = longrope_scaling(torch.tensor([1.0, 2.0, 3.5], dtype=torch.float64), factor=4,
                           original_max_position_embeddings=256)
    assert out == {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0, 1.0, 1.0],
                   "long_factor": [1.0, 2.0, 3.5], "original_max_position_embeddings": 256}
    assert longrope_scaling([2.0], [1.5], factor=2.0, original_max_position_embeddings=8,
                            attention_factor=1.1)["attention_factor"] == 1.1
    with pytest.raises(ConfigError, match="same length"):
        longrope_scaling([1.0, 2.0], [1.0], factor=2.0, original_max_position_embeddings=8)
    with pytest.raises(ConfigError, match="long_factor entry"):
        longrope_scaling([1.0, -2.0], factor=2.0, original_max_position_embeddings=8)
    with pytest.raises(ConfigError, match="long_factor"):
        longrope_scaling([], factor=2.0, original_max_position_embeddings=8)


def test_longrope_cos_sin_applies_n_hat():
    long_factor = [1.0 + 0.5 * j for j in range(16)]
    config = {"head_dim": 32, "max_position_embeddings": 1024, "rope_parameters": {
        **longrope_scaling(long_factor, factor=8.0, original_max_position_embeddings=128), "rope_theta": 1e4}}
    positions = torch.arange(300)
    inv, scaling = rope_parameters(config, seq_len=300)
    assert scaling == pytest.approx(math.sqrt(1 + math.log(8) / math.log(128)))
    torch.testing.assert_close(inv, default_inv_freq(32, 1e4) / torch.tensor(long_factor))
    cos, sin = longrope_cos_sin(config, positions)                            # n_hat 0: exactly the config
    want = rope_cos_sin(positions, inv, scaling)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    cos, sin = longrope_cos_sin(config, positions, n_hat=16)
    plain = rope_cos_sin(positions, default_inv_freq(32, 1e4))               # the original RoPE, scaling 1
    assert torch.equal(cos[:16], plain[0][:16]) and torch.equal(sin[:16], plain[1][:16])
    assert torch.equal(cos[16:], want[0][16:]) and torch.equal(sin[16:], want[1][16:])
    with pytest.raises(ConfigError, match="n_hat"):
        longrope_cos_sin(config, positions, n_hat=-1)
