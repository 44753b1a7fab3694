"""Banded ALiBi heads (posenc.kernels.alibi_band): what a band leaves out is below fp64's rounding.

Oracle: the float64 softmax of tests/kernels/test_alibi_attention.py (every key, the bias written out), and the
bound itself checked by brute force: the weight of the keys outside a row's band, summed exactly.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc.alibi import alibi_slopes
from posenc.kernels import alibi_attention as attention
from posenc.kernels import alibi_band
from posenc.kernels.alibi_attention import alibi_attention
from posenc_oracles import alibi_oracle as oracle, peak_bytes, qkv


@pytest.fixture
def small_bands(monkeypatch):
    # thresholds scaled down so that test-sized inputs are banded
    monkeypatch.setattr(alibi_band, "BAND_MIN_QUERIES", 8)
    monkeypatch.setattr(alibi_band, "BAND_BLOCK", 4)


def count_banded(monkeypatch) -> list:
    seen = []
    real = alibi_band.banded_head

    def spy(out, q, k_rev, v_rev, template, head, *args, **kwargs):
        seen.append(head)
        return real(out, q, k_rev, v_rev, template, head, *args, **kwargs)
    monkeypatch.setattr(alibi_band, "banded_head", spy)
    return seen


def steep(H: int) -> list[float]:
    # slopes steep enough that windows are a few keys at small norms, plus a flat, a zero and a negative one
    return [8.0, 4.0, 0.0625, 2.0, 0.0, -0.5, 6.0, 0.25][:H]


def test_windows_follow_the_bound():
    q, k = torch.full((1, 2, 3, 4), 0.5), torch.full((1, 1, 5, 4), 2.0)
    slopes = torch.tensor([1.0, 0.25])
    windows = alibi_band.band_windows(q, k, slopes, 0.5)
    delta = 2 * 1.0 * 4.0 * 0.5 * (1 + alibi_band.NORM_SLACK) + alibi_band.NORM_SLACK   # |q| = 1, |k| = 4
    for w, m in zip(windows, slopes.tolist()):
        need = delta + alibi_band.dropped(torch.float32) + math.log(1 / (1 - math.exp(-m)))
        assert m * (w + 1) >= need > m * w - 1e-9      # the smallest window meeting the bound (ceil)


def test_what_a_band_leaves_out_is_a_share_of_the_roundoff():
    # 1e-4 of the unit roundoff of the arithmetic: fp32 for every input dtype but fp64
    assert math.exp(-alibi_band.dropped(torch.float64)) == pytest.approx(2.0**-52 * 1e-4)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert math.exp(-alibi_band.dropped(dtype)) == pytest.approx(2.0**-23 * 1e-4)


def test_windows_are_per_head():
    # head 1's queries are 10x longer: its bound on score differences, and so its window, is wider
    q, k = torch.ones(1, 2, 3, 4), torch.ones(1, 1, 5, 4)
    q[:, 1] *= 10
    w0, w1 = alibi_band.band_windows(q, k, torch.tensor([1.0, 1.0]), 1.0)
    assert w1 - w0 == pytest.approx(2 * 2 * (20 - 2) * (1 + alibi_band.NORM_SLACK), abs=1)   # |q| 2 -> 20, |k| 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_no_window_without_a_finite_bound(bad):
    # a bad query reaches only its own head; a bad key every head that reads its key head
    q, k, _ = qkv(1, 4, 2, 4, 6)
    q[0, 1, 2, 3] = bad
    windows = alibi_band.band_windows(q, k, torch.ones(4), 0.25)
    assert windows[1] is None and None not in (windows[0], windows[2], windows[3])
    q, k, _ = qkv(1, 4, 2, 4, 6)
    k[0, 1, 5, 0] = bad
    windows = alibi_band.band_windows(q, k, torch.ones(4), 0.25)
    assert windows[2:] == [None, None] and None not in windows[:2]
    assert alibi_band.band_windows(q[:, :2], k[:, :1], torch.tensor([0.0, -1.0]), 0.25) == [None, None]


@settings(max_examples=60, deadline=None)
@given(first=st.integers(0, 40), rows=st.integers(1, 8), k_len=st.integers(1, 40), window=st.integers(0, 12),
       causal=st.booleans())
def test_key_span_holds_every_key_a_row_keeps(first, rows, k_len, window, causal):
    lo, hi = alibi_band.key_span(first, first + rows - 1, k_len, window, causal)
    for p in range(first, first + rows):
        visible = [j for j in range(k_len) if not causal or j <= p]
        if not visible:
            continue
        d0 = min(abs(p - j) for j in visible)
        kept = [j for j in visible if abs(p - j) <= d0 + window]
        assert lo <= min(kept) and max(kept) < hi
    assert 0 <= lo < hi <= k_len
    if causal:
        assert hi <= first + rows


def test_the_weight_left_out_is_below_the_bound():
    # adversarial rows: each query points at the *farthest* keys, the nearest ones point away from it
    torch.manual_seed(0)
    T, D, m = 60, 8, 2.0
    q = torch.randn(1, 1, T, D, dtype=torch.float64)
    k = torch.randn(1, 1, T, D, dtype=torch.float64)
    k[:, :, :20] = q[:, :, -1:] * 3          # far keys aligned with late queries
    k[:, :, 40:] = -q[:, :, -1:]             # near keys opposed
    scale = 0.5
    (w,) = alibi_band.band_windows(q, k, torch.tensor([m]), scale)
    assert w < T
    scores = (q @ k.transpose(-1, -2))[0, 0] * scale
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    logits = (scores - m * (i - j)).masked_fill(j > i, float("-inf"))
    weights = logits.softmax(-1)
    for row in range(T):
        lo, _ = alibi_band.key_span(row, row, T, w, True)
        assert weights[row, :lo].sum() <= math.exp(-alibi_band.dropped(torch.float64)) * weights[row, row]


# the fixture only lowers thresholds: the same for every example
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(H=st.sampled_from([2, 4, 8]), group=st.sampled_from([1, 2]), Tq=st.integers(8, 48), extra=st.integers(0, 20),
       causal=st.booleans(), norm=st.floats(0.05, 2.0), seed=st.integers(0, 2**16))
def test_banded_attention_matches_the_full_softmax(small_bands, H, group, Tq, extra, causal, norm, seed):
    if H % group:
        return
    q, k, v = (t * norm for t in qkv(1, H, H // group, Tq, Tq + extra, D=8, dtype=torch.float64, seed=seed))
    slopes = steep(H)
    out = alibi_attention(q, k, v, torch.tensor(slopes), causal=causal)
    torch.testing.assert_close(out, oracle(q, k, v, slopes, causal=causal), atol=1e-12, rtol=1e-12)


def test_bands_run_for_steep_heads_only(small_bands, monkeypatch):
    # heads 0, 1, 3, 6 are steep; 2 (flat), 4 (zero), 5 (negative) and 7 go through the ordinary schedule together,
    # copied out of q since they are not one run of key-head groups
    seen = count_banded(monkeypatch)
    # (windows at these norms: 3, 6, 12, 4 and 109 keys for slopes 8, 4, 2, 6 and 0.25; 109 is over half of the
    # 80 keys, so slope 0.25 is not worth banding)
    q, k, v = (t * 0.2 for t in qkv(2, 8, 4, 80, 80, D=8))
    out = alibi_attention(q, k, v, torch.tensor(steep(8)))
    assert sorted(seen) == [0, 1, 3, 6]
    torch.testing.assert_close(out.double(), oracle(q, k, v, steep(8)), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_banded_gradients_match_the_oracle(small_bands, monkeypatch, causal):
    seen = count_banded(monkeypatch)
    q, k, v = (t.mul(0.3).requires_grad_() for t in qkv(1, 4, 2, 24, 30, D=8, dtype=torch.float64))
    slopes = torch.tensor(steep(4), dtype=torch.float64, requires_grad=True)
    out = alibi_attention(q, k, v, slopes, causal=causal)
    got = torch.autograd.grad(out.square().sum(), (q, k, v, slopes))
    assert seen
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    s2 = slopes.detach().requires_grad_()
    # the oracle with differentiable slopes: the same softmax, written out
    i = torch.arange(24, dtype=torch.float64).unsqueeze(1) + 6
    j = torch.arange(30, dtype=torch.float64).unsqueeze(0)
    bias = -s2.view(4, 1, 1) * (i - j).abs()
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    kk, vv = k2.repeat_interleave(2, 1), v2.repeat_interleave(2, 1)
    ref = torch.softmax(q2 @ kk.transpose(-1, -2) / math.sqrt(8) + bias, -1) @ vv
    expected = torch.autograd.grad(ref.square().sum(), (q2, k2, v2, s2))
    for g, e in zip(got[:3], expected[:3]):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)
    # slopes are held in float32 (posenc.alibi.check_slopes): their gradient comes back through that cast
    torch.testing.assert_close(got[3], expected[3], atol=1e-6, rtol=1e-6)


def test_far_nan_key_still_reaches_every_row(small_bands):
    # without bands a NaN key poisons every row that sees it; bands must not hide it
    q, k, v = qkv(1, 2, 2, 32, 32, D=8)
    k[0, :, 0, 0] = float("nan")
    out = alibi_attention(q * 0.1, k, v, torch.tensor([8.0, 4.0]))
    assert out.isnan().all()


def test_default_shapes_use_bands_at_long_inputs(monkeypatch):
    # the real thresholds: 16 standard ALiBi heads at 1024 queries of N(0, 1) inputs band their steepest heads
    seen = count_banded(monkeypatch)
    q, k, v = qkv(1, 16, 16, 1024, 1024, D=64)
    with torch.no_grad():
        out = alibi_attention(q, k, v)
    assert seen and len(seen) < 16
    ref = attention.causal_blocks(q.double(), k.double(), v.double(), alibi_slopes(16), causal=True, offset=0,
                                  scale=None, block=256)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)


def test_bands_never_allocate_the_full_bias(monkeypatch):
    seen = count_banded(monkeypatch)
    B, H, N, D = 1, 8, 1024, 16
    q, k, v = qkv(B, H, H, N, N, D=D)
    full_bias = H * N * N * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        alibi_attention(q * 0.1, k, v, torch.tensor([16.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.125]))
    assert len(seen) >= 4 and peak_bytes(prof) < full_bias / 8, (seen, peak_bytes(prof))  # one head's: 1/8


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(Tq=st.integers(8, 40), Tk=st.integers(1, 40), offset=st.integers(0, 80), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_bands_with_explicit_query_offsets(small_bands, Tq, Tk, offset, causal, seed):
    # queries anywhere, also past every key (their nearest key is then the last one)
    q, k, v = (t * 0.3 for t in qkv(1, 4, 2, Tq, Tk, D=8, dtype=torch.float64, seed=seed))
    slopes = steep(4)
    out = alibi_attention(q, k, v, torch.tensor(slopes), causal=causal, q_offset=offset)
    torch.testing.assert_close(out, oracle(q, k, v, slopes, causal=causal, offset=offset), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_bands_with_bf16_inputs_and_a_narrower_v(small_bands, monkeypatch, causal):
    seen = count_banded(monkeypatch)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 48, 8, generator=g) * 0.3, torch.randn(1, 2, 48, 8, generator=g) * 0.3
    v = torch.randn(1, 2, 48, 3, generator=g)                      # Dv != D: torch's unfused attention
    out = alibi_attention(q, k, v, torch.tensor(steep(4)), causal=causal)
    torch.testing.assert_close(out.double(), oracle(q, k, v, steep(4), causal=causal), atol=2e-5, rtol=1e-4)
    out16 = alibi_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.tensor(steep(4)), causal=causal)
    assert out16.dtype == torch.bfloat16 and seen
    torch.testing.assert_close(out16.double(), oracle(q, k, v, steep(4), causal=causal), atol=3e-2, rtol=3e-2)
