"""The shared position helpers of posenc.bias: KV-cache alignment and the relative-position sign convention."""

import math

import pytest
import torch

import posenc
from posenc.bias.positions import end_aligned_positions, relative_positions
from posenc._internal.errors import PosencError


def test_end_alignment_and_sign_convention():
    q, k = end_aligned_positions(3, 7, offset=10)
    assert q.tolist() == [14, 15, 16] and k.tolist() == list(range(10, 17))
    r = relative_positions(q, k)
    for a, i in enumerate(q.tolist()):
        for b, j in enumerate(k.tolist()):
            assert r[a, b] == j - i                      # key - query: <= 0 for the keys a causal query sees
    big = relative_positions(torch.tensor([2**40 + 1]), torch.tensor([2**40]), dtype=torch.float64)
    assert big.item() == -1.0                            # converted before subtracting: exact at large positions


def test_batched_positions_broadcast():
    q = torch.tensor([[5, 6], [0, 1]])
    k = torch.arange(7)
    assert relative_positions(q, k).shape == (2, 2, 7)


@pytest.mark.parametrize("call, match", [
    (lambda: end_aligned_positions(5, 3), "k_len must be >= q_len"),
    (lambda: end_aligned_positions(2, offset=1.5), "offset must be an integer"),
    (lambda: relative_positions(torch.tensor(3), torch.arange(2)), "query_positions must have shape"),
    (lambda: relative_positions(torch.zeros(2, 3), torch.zeros(3, 3)), "must share their leading"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.uint32])
def test_narrow_integer_positions_subtract_without_wrapping(dtype):
    """uint8 10 - 12 must be -2, not 254: integer positions subtract in int64 (and T5's buckets follow)."""
    q, k = torch.tensor([10], dtype=dtype), torch.arange(12).to(dtype)
    r = relative_positions(q, k)
    assert r.dtype == torch.int64 and r.tolist() == [[j - 10 for j in range(12)]]
    table = torch.randn(32, 2)
    assert torch.equal(posenc.t5_bias(table, q, k), posenc.t5_bias(table, q.long(), k.long()))


def test_a_distance_of_one_survives_a_float32_result_at_large_positions():
    q, k = torch.tensor([100_000_001]), torch.tensor([100_000_000, 100_000_001])
    assert relative_positions(q, k, dtype=torch.float32).tolist() == [[-1.0, 0.0]]
    bias = posenc.kerple_bias(torch.ones(1), torch.ones(1), q, k)          # -r1 log(1 + r2 |d|)
    torch.testing.assert_close(bias[0, 0], torch.tensor([-math.log(2.0), 0.0]))


def test_non_finite_positions_are_refused():
    with pytest.raises(PosencError, match="finite"):
        relative_positions(torch.tensor([0.0, float("nan")]), torch.arange(2.0))
