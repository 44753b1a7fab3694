"""Sinusoidal / learned / NoPE against the lesson's loop and their documented contracts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference
from posenc.absolute import LearnedPositionalEmbedding, NoPE, SinusoidalPositionalEncoding, sinusoidal, sinusoidal_at
from posenc._internal.errors import PosencError


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 64), half=st.integers(1, 32), base=st.sampled_from([10000.0, 100.0, 1e6]))
def test_table_matches_lesson_loop(n, half, base):
    dim = 2 * half
    ref = torch.tensor(reference.sinusoidal(n, dim, base), dtype=torch.float64)
    got = sinusoidal(n, dim, base)
    assert got.shape == (n, dim) and got.dtype == torch.float32
    assert torch.allclose(got.double(), ref, atol=1e-7)


def test_closed_form_values():
    pe = sinusoidal(3, 4)
    # pos 0: sin 0 = 0, cos 0 = 1; pos 1, i=0: sin(1), cos(1); i=1: sin(1/100), cos(1/100)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    expected = torch.tensor([0.8414709848, 0.5403023059, 0.0099998333, 0.9999500004])
    assert torch.allclose(pe[1], expected, atol=1e-7)


def test_large_positions_are_exact():
    # 1e6 + 1 is not representable in bf16 and loses digits in fp16; the table is formed in float64
    got = sinusoidal_at(torch.tensor([1_000_001]), 2)
    assert got[0, 0].item() == pytest.approx(torch.tensor(1_000_001.0, dtype=torch.float64).sin().item(), abs=1e-7)


def test_module_adds_table_at_positions():
    x = torch.randn(2, 5, 8)
    m = SinusoidalPositionalEncoding(8)
    assert torch.allclose(m(x), x + sinusoidal(5, 8))
    pos = torch.tensor([[10, 11, 12, 13, 14], [0, 1, 2, 3, 4]])
    out = m(x, pos)
    assert torch.allclose(out[0], x[0] + sinusoidal(15, 8)[10:])
    assert torch.allclose(out[1], x[1] + sinusoidal(5, 8))


def test_learned_table_and_its_limit():
    m = LearnedPositionalEmbedding(max_len=6, dim=4)
    x = torch.zeros(1, 6, 4)
    assert torch.equal(m(x)[0], m.weight.detach())
    with pytest.raises(PosencError, match=r"max_len=6"):
        m(torch.zeros(1, 7, 4))
    with pytest.raises(PosencError, match=r"max_len=6"):
        m(torch.zeros(1, 2, 4), torch.tensor([5, 6]))


def test_nope_is_identity():
    x = torch.randn(2, 3, 4)
    assert NoPE()(x) is x


@pytest.mark.parametrize("call, match", [
    (lambda: sinusoidal(4, 7), "dim must be even"),
    (lambda: sinusoidal(0, 8), "n_positions must be a positive integer"),
    (lambda: sinusoidal(-3, 8), "n_positions must be a positive integer"),
    (lambda: sinusoidal(4, 8, base=0), "base must be a positive"),
    (lambda: SinusoidalPositionalEncoding(8)(torch.zeros(1, 3, 6)), "dim=8"),
    (lambda: LearnedPositionalEmbedding(0, 4), "max_len must be a positive integer"),
    (lambda: SinusoidalPositionalEncoding(4)(torch.zeros(1, 3, 4), torch.arange(4)), "positions must have shape"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(PosencError, match=match):
        call()


@pytest.mark.parametrize("bad", [1.7, 0.5, float("nan"), float("inf")])
def test_learned_table_refuses_non_integer_positions(bad):
    emb = posenc.LearnedPositionalEmbedding(8, 4)
    x = torch.zeros(1, 2, 4)
    with pytest.raises(PosencError, match="positions must be (integers|finite)"):
        emb(x, positions=torch.tensor([0.0, bad]))
    # integral floats are rows: same as the integer positions
    torch.testing.assert_close(emb(x, positions=torch.tensor([0.0, 1.0])), emb(x, positions=torch.tensor([0, 1])))


@pytest.mark.parametrize("base", ["1e4", None, True])
def test_sinusoidal_base_must_be_a_number(base):
    with pytest.raises(PosencError, match="base must be"):
        posenc.sinusoidal(4, 4, base=base)
    with pytest.raises(PosencError, match="base must be"):
        posenc.SinusoidalPositionalEncoding(4, base=base)


def test_positions_that_are_not_exact_numbers_are_refused():
    x = torch.zeros(1, 3, 8)
    with pytest.raises(PosencError, match="finite"):
        SinusoidalPositionalEncoding(8)(x, torch.tensor([0.0, float("nan"), 2.0]))
    with pytest.raises(PosencError, match="half precision"):
        sinusoidal_at(torch.tensor([257.0], dtype=torch.bfloat16), 8)      # bf16 holds 257 as 256
