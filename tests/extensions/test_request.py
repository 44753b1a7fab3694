"""Request-sized YaRN's rule (posenc.extensions.request.request_factor)."""

import pytest
from hypothesis import given, strategies as st

from posenc._internal.errors import ConfigError
from posenc.extensions.request import request_factor


def test_boundaries_exactly_trained_and_one_past():
    assert request_factor(1, 100) == 1
    assert request_factor(100, 100) == 1
    assert request_factor(101, 100) == 2
    assert request_factor(200, 100) == 2
    assert request_factor(201, 100) == 4
    assert request_factor(101, 100, factors=(8, 1, 3)) == 3   # order of the set does not matter


def test_refuses_a_request_no_factor_covers_in_one_line():
    with pytest.raises(ConfigError, match=r"needed_tokens: 801 tokens .* largest factor of factors \(8 x trained "
                                          r"length 100 = 800\)") as err:
        request_factor(801, 100, factors=(1, 2, 4, 8))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, match", [((0, 100), "needed_tokens"), ((10, 0), "trained_length"),
                                         ((10, 100, ()), "factors"), ((10, 100, (0.5, 2)), "factors"),
                                         ((10, 100, "124"), "factors")])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ConfigError, match=match):
        request_factor(*args)


factor_sets = st.lists(st.sampled_from([1, 1.5, 2, 3, 4, 8, 16]), min_size=1, max_size=5)


@given(st.integers(1, 4000), st.integers(1, 4000), st.integers(1, 500), factor_sets)
def test_monotone_covering_and_smallest(a, b, trained, factors):
    low, high = sorted((a, b))
    top = max(factors) * trained
    if high > top:
        with pytest.raises(ConfigError):
            request_factor(high, trained, factors)
        return
    f_low, f_high = request_factor(low, trained, factors), request_factor(high, trained, factors)
    assert f_low <= f_high                                     # monotone in the tokens needed
    assert f_high in factors and f_high * trained >= high       # it covers the request
    assert all(f * trained < high for f in factors if f < f_high)   # and no smaller factor of the set does
