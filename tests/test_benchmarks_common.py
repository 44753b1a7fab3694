"""benchmarks/_common.time_split (the study's and benchmarks/matmul_peak.py's cost split): the fit against times
built from known per-token and attention costs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import time_split  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(a=st.floats(1e-6, 1e-2), b=st.floats(1e-10, 1e-5),
       lengths=st.lists(st.integers(256, 65536), min_size=2, max_size=5, unique=True))
def test_time_split_recovers_the_costs_it_was_built_from(a, b, lengths):
    seconds = [a * T + b * T * T for T in lengths]
    fa, fb = time_split(lengths, seconds)
    assert fa == pytest.approx(a, rel=1e-6, abs=1e-12) and fb == pytest.approx(b, rel=1e-6, abs=1e-15)


def test_time_split_needs_two_lengths():
    with pytest.raises(ValueError, match="lengths"):
        time_split([4096, 4096], [1.0, 1.1])
