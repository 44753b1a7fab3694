"""The shared position helpers of posenc.bias: KV-cache alignment and the relative-position sign convention."""

import pytest
import torch

from posenc.bias.positions import end_aligned_positions, relative_positions
from posenc.errors import PosencError


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
