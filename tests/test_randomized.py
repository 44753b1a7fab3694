"""Randomized positions: the laws of a sorted uniform random subset (sorted, distinct, in range, every position
and every subset equally likely) and reproducibility."""

import math
from itertools import combinations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc._internal.errors import PosencError
from posenc.randomized import randomized_positions


@settings(max_examples=60, deadline=None)
@given(seq_len=st.integers(1, 64), extra=st.integers(0, 500), batch=st.one_of(st.none(), st.integers(1, 4)),
       seed=st.integers(0, 2**31))
def test_sorted_distinct_in_range(seq_len, extra, batch, seed):
    n = seq_len + extra
    p = randomized_positions(seq_len, n, generator=torch.Generator().manual_seed(seed), batch_size=batch)
    assert p.dtype == torch.int64
    assert p.shape == ((seq_len,) if batch is None else (batch, seq_len))
    rows = p.reshape(-1, seq_len)
    assert (rows.diff(dim=-1) > 0).all()                          # strictly increasing: sorted and distinct
    assert int(rows.min()) >= 0 and int(rows.max()) < n
    if extra == 0:
        assert torch.equal(rows, torch.arange(n).expand_as(rows))   # the only subset of full size


def test_every_position_and_every_subset_equally_likely():
    g = torch.Generator().manual_seed(0)
    draws = randomized_positions(3, 6, generator=g, batch_size=6000)
    # each position is in the subset with probability 3/6: 3000 expected, sd ~39
    counts = torch.bincount(draws.flatten(), minlength=6)
    assert ((counts - 3000).abs() < 200).all()
    # each of the C(6,3) = 20 subsets has probability 1/20: 300 expected, sd ~17; chi-square with 19 dof
    subsets = {c: 0 for c in combinations(range(6), 3)}
    for row in draws.tolist():
        subsets[tuple(row)] += 1
    chi2 = sum((c - 300) ** 2 / 300 for c in subsets.values())
    assert chi2 < 43.8          # the 0.999 quantile of chi-square(19)
    # the largest position drawn covers the top of the range: P(max < 5) = C(5,3)/C(6,3) = 1/2
    assert abs(float((draws[:, -1] < 5).float().mean()) - 0.5) < 0.05
    assert math.isclose(float((draws[:, 0] == 0).float().mean()), 0.5, abs_tol=0.05)


def test_reproducible_rows_differ_and_device_argument():
    a = randomized_positions(16, 1024, generator=torch.Generator().manual_seed(5), batch_size=3)
    b = randomized_positions(16, 1024, generator=torch.Generator().manual_seed(5), batch_size=3)
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])
    c = randomized_positions(16, 1024, device="cpu")
    assert c.device.type == "cpu" and c.shape == (16,)


@pytest.mark.parametrize("call, match", [
    (lambda: randomized_positions(10, 5), r"max_position must be >= seq_len \(10\)"),
    (lambda: randomized_positions(0, 5), "seq_len must be a positive integer"),
    (lambda: randomized_positions(2, 5, batch_size=0), "batch_size must be a positive integer"),
    (lambda: randomized_positions(2, 5, generator=0), "generator must be a torch.Generator"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()
