"""ALiBi slopes and bias against the paper's published slopes and the lesson's loop."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc.alibi import alibi_bias, alibi_slopes
from posenc.errors import PosencError


def test_published_slopes():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    assert torch.allclose(alibi_slopes(12).double(), torch.tensor(
        [2.0 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], dtype=torch.float64))
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    assert alibi_slopes(1).tolist() == [2 ** -8]


def test_lesson_formula_for_powers_of_two():
    for n in (1, 2, 4, 16, 32, 64):
        lesson = torch.tensor([2 ** (-8 * (h + 1) / n) for h in range(n)], dtype=torch.float32)
        assert torch.equal(alibi_slopes(n), lesson)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 128))
def test_any_head_count_matches_reference_and_is_geometric_per_group(n):
    s = alibi_slopes(n).double()
    assert torch.allclose(s, torch.tensor(reference.alibi_slopes(n), dtype=torch.float64), rtol=1e-7)
    c = 2 ** int(math.floor(math.log2(n)))
    for group, ratio in ((s[:c], 2 ** (-8 / c)), (s[c:], 2 ** (-8 / c))):
        if len(group) >= 2:  # second group steps through every other slope of 2c heads: ratio 2^(-16/2c)
            assert torch.allclose(group[1:] / group[:-1], torch.full((len(group) - 1,), ratio, dtype=torch.float64))
    assert len(set(s.tolist())) == n and (s > 0).all() and (s < 1).all()


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 12), n=st.integers(1, 24))
def test_bias_matches_lesson_loop(h, n):
    ref = torch.tensor(reference.alibi_bias(h, n), dtype=torch.float64)
    got = alibi_bias(h, n)
    assert got.shape == (h, n, n)
    assert torch.allclose(got.double(), ref, atol=1e-6)


def test_kv_cache_alignment():
    # 3 new queries over 7 keys: query i sits at key position i + 4
    full = alibi_bias(4, 7)
    assert torch.equal(alibi_bias(4, 3, 7), full[:, 4:, :])
    assert alibi_bias(2, 1, 5)[0, 0].tolist() == [-0.0625 * d for d in (4, 3, 2, 1, 0)]


@pytest.mark.parametrize("call, match", [
    (lambda: alibi_slopes(0), "n_heads must be a positive integer"),
    (lambda: alibi_bias(4, -1), "q_len must be a positive integer"),
    (lambda: alibi_bias(4, 5, 3), "k_len must be >= q_len"),
    (lambda: alibi_bias(4, 5, slopes=torch.ones(3)), r"slopes must have shape \[n_heads\]"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()
