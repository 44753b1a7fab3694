"""ALiBi slopes and bias against the paper's published slopes and the lesson's loop."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc.alibi import MAX_BIAS_ELEMENTS, MAX_HEADS, alibi_bias, alibi_slopes
from posenc._internal.errors import PosencError


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
    (lambda: alibi_slopes(0), r"n_heads must be an integer in \[1, 65536\], got 0"),
    (lambda: alibi_slopes(2.0), "n_heads must be an integer"),
    (lambda: alibi_slopes("8"), "n_heads must be an integer"),
    (lambda: alibi_bias(4, -1), "q_len must be a positive integer"),
    (lambda: alibi_bias(4, 5, 3), "k_len must be >= q_len"),
    (lambda: alibi_bias(4, 5, slopes=torch.ones(3)), r"slopes must have shape \[n_heads\] = \[4\]"),
    (lambda: alibi_bias(2, 5, slopes=["a", "b"]), "slopes must be a tensor or sequence of 2 numbers"),
    (lambda: alibi_bias(2, 5, dtype=torch.int64), "dtype must be a floating torch.dtype"),
    (lambda: alibi_bias(2, 5, max_elements=0), "max_elements must be a positive integer"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_slopes_refused(bad):
    # one NaN slope would silently turn every score of its head into NaN
    slopes = torch.tensor([0.5, bad, 0.125])
    with pytest.raises(PosencError, match=f"slopes must be finite numbers, got {bad} for head 1"):
        alibi_bias(3, 4, slopes=slopes)


def test_head_count_is_bounded_before_any_allocation():
    # 10**9 heads used to grow a Python list until the OOM killer (24 GB); now refused at once, naming the limit
    with pytest.raises(PosencError, match=r"n_heads must be an integer in \[1, 65536\], got 1000000000"):
        alibi_slopes(10**9)
    with pytest.raises(PosencError, match="n_heads must be an integer in"):
        alibi_bias(MAX_HEADS + 1, 1)
    assert alibi_slopes(MAX_HEADS).shape == (MAX_HEADS,)  # the documented limit itself is accepted


def test_bias_size_is_bounded_and_points_to_alibi_attention():
    # 64 heads at 8192 x 8192 would be 16 GiB of fp32: refused before allocating, with the way out in the message
    with pytest.raises(PosencError, match=r"alibi_bias\(64, 8192, 8192\) would hold 4,294,967,296 elements "
                                          r"\(16\.0 GiB\).*posenc\.alibi_attention"):
        alibi_bias(64, 8192)
    assert MAX_BIAS_ELEMENTS == 2**30
    # the bound is on elements, whatever the shape: 2 heads x 1 query x 2^30 keys is just over it
    with pytest.raises(PosencError, match="max_elements=1,073,741,824"):
        alibi_bias(2, 1, 2**29 + 1)
    # an explicit max_elements moves the bound both ways
    with pytest.raises(PosencError, match="max_elements=100"):
        alibi_bias(4, 5, 6, max_elements=100)
    assert alibi_bias(4, 5, 5, max_elements=100).shape == (4, 5, 5)


def test_meta_device_slopes_pass_the_check_without_values():
    # models traced on the meta device (shapes only) build their bias there: nothing to check, nothing to refuse
    bias = alibi_bias(4, 8, slopes=alibi_slopes(4).to("meta"))
    assert bias.device.type == "meta" and bias.shape == (4, 8, 8)
