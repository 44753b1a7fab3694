"""A base <= 1 warns wherever a user gives a base -- apply_rope, apply_rope_qk, the sinusoidal table and module --
as rope_parameters does (one rule: posenc.rope.config.check_theta), and the warning
names the user's line; a base in (1, 1e38] never warns."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc
from posenc.absolute import SinusoidalPositionalEncoding, sinusoidal

x = torch.randn(1, 2, 4, 8)
pos = torch.arange(4)
CALLS = {
    "apply_rope": lambda b: posenc.apply_rope(x, pos, base=b),
    "apply_rope_qk": lambda b: posenc.apply_rope_qk(x, x, pos, base=b),
    "sinusoidal": lambda b: sinusoidal(4, 8, base=b),
    "SinusoidalPositionalEncoding": lambda b: SinusoidalPositionalEncoding(8, base=b),
}


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("base", [0.5, 1, 1.0, 1e-3, 0.999999])
def test_a_base_at_most_one_warns_everywhere(name, base):
    with pytest.warns(UserWarning, match=rf"base {base:g} <= 1") as record:
        CALLS[name](base)
    assert record[0].filename == __file__   # the user's line, not posenc's


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=1.0001, max_value=1e30))
def test_a_base_above_one_never_warns(base):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in CALLS.values():
            call(base)
