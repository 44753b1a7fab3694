"""ALiBi attention without the N^2 bias: the chunked and FlexAttention paths against a float64 oracle.

Oracle: softmax(q k^T * scale - m_h * |(i + offset) - j| [causal: -inf for j > i + offset]) v, written out in
float64 with the slopes from the lesson's reference loops (posenc.reference), not from the code under test.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import reference
from posenc._internal.errors import PosencError
from posenc_oracles import alibi_oracle as oracle, peak_bytes, qkv
from posenc.kernels import alibi_attention as module
from posenc.kernels.alibi_attention import (alibi_attention, bias_template, causal_blocks, default_block_size,
                                            flex_available, reversed_keys_bias, split_causal_attention)




@st.composite
def cases(draw):
    Hkv = draw(st.sampled_from([1, 2, 3]))
    H = Hkv * draw(st.sampled_from([1, 2, 4]))
    Tk = draw(st.integers(1, 96))
    Tq = draw(st.integers(1, Tk))
    explicit = draw(st.booleans())
    offset = draw(st.integers(0, 2 * Tk)) if explicit else None
    if explicit and not draw(st.booleans()):
        Tq = draw(st.integers(1, 96))  # explicit offsets may place more queries than keys
    return dict(B=draw(st.integers(1, 2)), H=H, Hkv=Hkv, Tq=Tq, Tk=Tk, offset=offset,
                causal=draw(st.booleans()), block=draw(st.one_of(st.none(), st.integers(1, 40))),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_chunked_matches_materialised_oracle(c):
    q, k, v = qkv(c["B"], c["H"], c["Hkv"], c["Tq"], c["Tk"], seed=c["seed"])
    out = alibi_attention(q, k, v, causal=c["causal"], q_offset=c["offset"], block_size=c["block"],
                          backend="chunked")
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), oracle(q, k, v, causal=c["causal"], offset=c["offset"]),
                               atol=2e-5, rtol=1e-4)


def test_chunked_matches_sdpa_with_posenc_alibi_bias():
    # the materialised path users would write: posenc.alibi_bias (queries at the end of the keys) + SDPA
    from posenc.alibi import alibi_bias
    q, k, v = qkv(2, 8, 8, 40, 100, D=32)
    bias = alibi_bias(8, 40, 100).masked_fill(torch.ones(40, 100, dtype=torch.bool).triu(61), float("-inf"))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(alibi_attention(q, k, v, block_size=16, backend="chunked"), ref,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_bf16_close_to_fp32_oracle(causal):
    q, k, v = qkv(1, 4, 2, 70, 150, D=32, dtype=torch.bfloat16)
    out = alibi_attention(q, k, v, causal=causal, block_size=32, backend="chunked")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), oracle(q, k, v, causal=causal), atol=3e-2, rtol=3e-2)


def test_auto_on_cpu_is_the_chunked_path():
    q, k, v = qkv(1, 4, 4, 30, 30)
    torch.testing.assert_close(alibi_attention(q, k, v), alibi_attention(q, k, v, backend="chunked"),
                               atol=0, rtol=0)


def test_custom_slopes_and_scale():
    q, k, v = qkv(1, 3, 3, 20, 20)
    slopes = [0.7, 0.0, 2.0]
    out = alibi_attention(q, k, v, torch.tensor(slopes), scale=0.3, causal=False, block_size=6)
    torch.testing.assert_close(out.double(), oracle(q, k, v, slopes, causal=False, scale=0.3),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("Hkv", [2, 4])   # GQA reverses k and v; MHA reverses q (and writes the output back)
def test_gradients_match_oracle(Hkv):
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, Hkv, 24, 24))
    out = alibi_attention(q, k, v, block_size=8, backend="chunked")
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(oracle(q64, k64, v64).square().sum(), (q64, k64, v64))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g.double(), e, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- CPU schedules

@st.composite
def split_cases(draw):
    Hkv = draw(st.sampled_from([1, 2, 3]))
    inner = draw(st.sampled_from([1, 2, 4, 8]))
    outer = inner * draw(st.integers(1, 4))
    Tq = draw(st.integers(outer, 80))   # at least one full outer block; Tq mod outer is the ragged head
    return dict(B=draw(st.integers(1, 3)), H=Hkv * draw(st.sampled_from([1, 2, 4])), Hkv=Hkv, Tq=Tq,
                offset=draw(st.integers(0, 40)), outer=outer, inner=inner,
                dtype=draw(st.sampled_from([torch.float32, torch.float64])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=40, deadline=None)
@given(split_cases())
def test_split_schedule_matches_oracle(c):
    # diagonal squares batched over blocks + fully visible keys, merged by log-sum-exp: the same attention
    q, k, v = qkv(c["B"], c["H"], c["Hkv"], c["Tq"], c["Tq"] + c["offset"], dtype=c["dtype"], seed=c["seed"])
    slopes = torch.tensor(reference.alibi_slopes(c["H"]), dtype=torch.float32)  # slopes are stored in fp32
    out = split_causal_attention(q, k, v, slopes, offset=c["offset"], scale=None, outer=c["outer"],
                                 inner=c["inner"])
    assert out.shape == q.shape and out.dtype == q.dtype
    tol = dict(atol=2e-5, rtol=1e-4) if c["dtype"] == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out.double(), oracle(q, k, v, slopes.tolist(), offset=c["offset"]), **tol)


def test_split_schedule_with_custom_slopes_scale_and_strided_inputs():
    # a custom scale and slopes, and q/k/v that are transposed views ([B, T, H, D] memory), as models hand them over
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 24, 4, 8, generator=g, dtype=torch.float64).transpose(1, 2)
    k = torch.randn(2, 30, 2, 8, generator=g, dtype=torch.float64).transpose(1, 2)
    v = torch.randn(2, 30, 2, 8, generator=g, dtype=torch.float64).transpose(1, 2)
    slopes = torch.tensor([0.5, 0.0, 0.03125, 1.5])   # exact in fp32, the slopes' storage dtype
    out = split_causal_attention(q, k, v, slopes, offset=6, scale=0.2, outer=8, inner=4)
    torch.testing.assert_close(out, oracle(q, k, v, slopes.tolist(), scale=0.2), atol=1e-12, rtol=1e-12)


def test_split_schedule_refuses_a_layout_it_does_not_cover():
    q, k, v = qkv(1, 2, 2, 16, 20)
    with pytest.raises(PosencError, match="needs Tk = Tq \\+ offset"):
        split_causal_attention(q, k, v, torch.ones(2), offset=0, scale=None, outer=8, inner=4)
    with pytest.raises(PosencError, match="Dv = D"):
        split_causal_attention(q, k, v[..., :3], torch.ones(2), offset=4, scale=None, outer=8, inner=4)


@pytest.mark.parametrize("causal", [True, False])
def test_value_width_other_than_key_width(causal):
    # Dv != D takes torch's unfused attention, which writes scores out: blocks bound them; same answer either way
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 50, 8, generator=g), torch.randn(1, 2, 60, 8, generator=g)
    v = torch.randn(1, 2, 60, 3, generator=g)
    torch.testing.assert_close(alibi_attention(q, k, v, causal=causal).double(), oracle(q, k, v, causal=causal),
                               atol=2e-5, rtol=1e-4)


@pytest.fixture
def small_split(monkeypatch):
    # the split schedule's thresholds scaled down, so that alibi_attention picks it on test-sized inputs
    monkeypatch.setattr(module, "SPLIT_MIN_QUERIES", 16)
    monkeypatch.setattr(module, "SPLIT_OUTER", 8)
    monkeypatch.setattr(module, "SPLIT_INNER", 4)


@pytest.mark.parametrize("offset", [None, 0, 7, 40])
def test_alibi_attention_uses_the_split_schedule_correctly(small_split, offset):
    # q_offset=40 > Tk - Tq: queries past the keys (their block schedule); 7 < Tk - Tq: later keys are never seen
    q, k, v = qkv(2, 4, 2, 37, 45)
    with torch.no_grad():
        out = alibi_attention(q, k, v, q_offset=offset)
    torch.testing.assert_close(out.double(), oracle(q, k, v, offset=offset), atol=2e-5, rtol=1e-4)


def test_split_schedule_is_not_used_under_autograd(small_split):
    # torch gives the log-sum-exp no gradient: with grad enabled the (differentiable) block schedule must run
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 33, 33))
    out = alibi_attention(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad(oracle(q64, k64, v64).square().sum(), (q64, k64, v64))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g.double(), e, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_float64_inputs_get_a_float64_bias(causal):
    # 12 heads: slopes like 2^-0.5 whose multiples are not exact in fp32; an fp32 template would cost ~1e-8 here
    q, k, v = qkv(1, 12, 12, 20, 30, dtype=torch.float64)
    slopes = torch.tensor(reference.alibi_slopes(12), dtype=torch.float32)
    expected = oracle(q, k, v, slopes.tolist(), causal=causal)
    out = alibi_attention(q, k, v, slopes, causal=causal)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_block_schedule_reversing_queries_or_keys_agree(causal):
    # a decoding step (Tq=1, the query is reversed) and a long prefill block (the keys are) against the oracle
    for shape in ((2, 4, 2, 1, 300), (1, 8, 2, 5, 300), (1, 2, 2, 40, 40)):
        q, k, v = qkv(*shape)
        slopes = torch.tensor(reference.alibi_slopes(shape[1]))
        out = causal_blocks(q, k, v, slopes, causal=causal, offset=shape[4] - shape[3], scale=None, block=3)
        torch.testing.assert_close(out.double(), oracle(q, k, v, causal=causal), atol=2e-5, rtol=1e-4)


def test_learnable_slopes_get_gradients():
    # slopes that require grad bypass the template cache: the gradient reaches them through the bias view
    q, k, v = qkv(1, 3, 3, 12, 12, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float32, requires_grad=True)
    (grad,) = torch.autograd.grad(alibi_attention(q, k, v, slopes, block_size=5).square().sum(), (slopes,))
    s64 = slopes.detach().double().requires_grad_()
    H, T = 3, 12
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    bias = (-s64.view(H, 1, 1) * (i - j).abs()).masked_fill(j > i, float("-inf"))
    ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(16) + bias, dim=-1) @ v
    (expected,) = torch.autograd.grad(ref.square().sum(), (s64,))
    torch.testing.assert_close(grad.double(), expected, atol=1e-6, rtol=1e-5)


def test_template_cache_is_keyed_by_slope_values():
    # same shapes, other slopes in between: each call sees its own slopes (the cache must not hand back stale ones)
    q, k, v = qkv(1, 2, 2, 30, 30)
    for slopes in ([0.5, 0.25], [1.0, 0.0], [0.5, 0.25]):
        torch.testing.assert_close(alibi_attention(q, k, v, torch.tensor(slopes)).double(),
                                   oracle(q, k, v, slopes), atol=2e-5, rtol=1e-4)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(1, 64), st.integers(0, 2**16))
def test_key_only_shortcut_equals_symmetric_form_under_causal_mask(H, T, seed):
    # softmax is shift invariant per row: m*j and -m*|i-j| = m*j - m*i (for j <= i) differ by a row constant
    q, k, v = qkv(1, H, H, T, T, seed=seed)
    m = torch.tensor(reference.alibi_slopes(H), dtype=torch.float64).view(H, 1, 1)
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    future = (j > i).expand(H, T, T)
    key_only = (m * j).masked_fill(future, float("-inf"))
    symmetric = (-m * (i - j).abs()).masked_fill(future, float("-inf"))
    q, k, v = q.double(), k.double(), v.double()
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_only)
    b = F.scaled_dot_product_attention(q, k, v, attn_mask=symmetric)
    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(b, alibi_attention(q, k, v, backend="chunked"), atol=1e-10, rtol=1e-10)


def test_key_only_shortcut_is_wrong_without_causal_mask():
    q, k, v = qkv(1, 2, 2, 16, 16, D=8)
    m = torch.tensor(reference.alibi_slopes(2)).view(2, 1, 1)
    j = torch.arange(16)
    shortcut = F.scaled_dot_product_attention(q, k, v, attn_mask=(m * j).expand(2, 16, 16))
    assert not torch.allclose(shortcut, alibi_attention(q, k, v, causal=False), atol=1e-3)


# ----------------------------------------------------------------------------------------------- memory

def test_block_bias_is_a_view_of_the_small_template():
    slopes = torch.tensor(reference.alibi_slopes(4))
    template = bias_template(slopes, 50, 80, 30, causal=True)
    assert template.shape == (4, 50 + 80 - 1)   # one entry per distance that occurs, whatever the offset
    view = reversed_keys_bias(template, 80, 10, 30, 70)
    assert view.shape == (1, 4, 20, 70)
    assert view.untyped_storage().data_ptr() == template.untyped_storage().data_ptr()
    # the view holds the right numbers: query 10 + r at position 40 + r, reversed key c is key 69 - c
    r, c = torch.arange(20).unsqueeze(1), torch.arange(70).unsqueeze(0)
    d = (40 + r - (69 - c)).double()
    expected = (-torch.tensor(reference.alibi_slopes(4), dtype=torch.float64).view(4, 1, 1) * d)
    expected = expected.masked_fill((d < 0).expand(4, 20, 70), float("-inf"))
    torch.testing.assert_close(view[0].double(), expected)


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_never_allocates_the_full_bias(causal):
    B, H, N, D = 1, 8, 1024, 16
    q, k, v = qkv(B, H, H, N, N, D=D)
    full_bias = H * N * N * 4
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        alibi_attention(q, k, v, causal=causal, backend="chunked")
    assert peak_bytes(prof) < full_bias / 8, (peak_bytes(prof), full_bias)   # one head's bias is 1/8 of it


def test_split_schedule_never_allocates_the_full_bias(small_split):
    B, H, N, D = 1, 8, 1024, 16
    q, k, v = qkv(B, H, H, N, N, D=D)
    full_bias = H * N * N * 4
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                 profile_memory=True) as prof:
        alibi_attention(q, k, v)
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names and "aten::lerp_" in names  # split ran
    assert peak_bytes(prof) < full_bias / 8, (peak_bytes(prof), full_bias)



def test_decoding_step_does_not_copy_the_cache():
    # Tq=1 against a 4096-key cache: the query is reversed, not k and v (a copy of both per generated token)
    q, k, v = qkv(1, 8, 8, 1, 4096)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = alibi_attention(q, k, v)
    biggest = max(e.self_cpu_memory_usage for e in prof.key_averages())
    assert biggest < k.numel() * k.element_size() / 4, biggest   # the bias template is the biggest piece
    torch.testing.assert_close(out.double(), oracle(q, k, v), atol=2e-5, rtol=1e-4)


def test_default_block_size():
    # CPU: the bias is a view, so blocks only serve to skip masked keys: 256 queries per causal call (the fused
    # kernel's own causal granularity), one bidirectional call
    assert default_block_size(16, 8192, 8192, "cpu") == 256
    assert default_block_size(16, 100, 100, "cpu") == 100
    assert default_block_size(16, 8192, 8192, "cpu", causal=False) == 8192
    # elsewhere each block's bias is materialised: it stays near 8 Mi elements
    blk = default_block_size(16, 8192, 8192, "cuda")
    assert 16 * blk * 8192 <= 8 * 2**20 and blk >= 16


# ----------------------------------------------------------------------------------------------- FlexAttention

flex = pytest.mark.skipif(not flex_available(), reason="torch without flex_attention")


@flex
@pytest.mark.parametrize("causal,dtype", [(True, torch.float32), (False, torch.bfloat16)])
def test_flex_matches_oracle(causal, dtype):
    # one compile per case (seconds on CPU): a GQA, KV-cache shape with ragged lengths covers the index maths
    q, k, v = qkv(2, 4, 2, 70, 200, D=16, dtype=dtype)
    out = alibi_attention(q, k, v, causal=causal, backend="flex")
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out.double(), oracle(q, k, v, causal=causal), **tol)
    if causal:  # another offset reuses the compiled kernel (the offset is a tensor input): same answer as the oracle
        torch.testing.assert_close(alibi_attention(q, k, v, q_offset=100, backend="flex").double(),
                                   oracle(q, k, v, offset=100), **tol)


@flex
def test_flex_past_the_recompile_limit_never_runs_unfused(monkeypatch):
    # past torch._dynamo.config.recompile_limit shapes, dynamo would silently run flex_attention unfused, which
    # builds the full [B, H, Tq, Tk] scores (seen at the 9th shape). Explicit flex must say so instead; auto must
    # fall back to the chunked path (same answer, no N^2 memory) with a warning. A limit of 1 reaches it fast.
    import torch._dynamo

    # (config.patch, not monkeypatch: monkeypatch's undo deleted the setting, and a later torch.compile failed)
    with torch._dynamo.config.patch(recompile_limit=1):
        _past_the_limit(monkeypatch)


def _past_the_limit(monkeypatch):
    shapes = [(37, 37), (41, 41), (43, 43)]             # lengths no other test compiles
    q, k, v = qkv(1, 2, 2, *shapes[0], D=8)
    try:
        alibi_attention(q, k, v, backend="flex")        # compiles, unless flex already holds compiled shapes
    except module.FlexRecompileLimit:
        pass
    q, k, v = qkv(1, 2, 2, *shapes[1], D=8)
    with pytest.raises(module.FlexRecompileLimit, match="recompile_limit"):
        alibi_attention(q, k, v, backend="flex")
    q, k, v = qkv(1, 2, 2, *shapes[2], D=8)
    monkeypatch.setattr(module, "_auto_backend", lambda q: "flex")           # what CUDA picks
    with pytest.warns(RuntimeWarning, match="flex_attention failed"):
        out = alibi_attention(q, k, v)
    torch.testing.assert_close(out.double(), oracle(q, k, v), atol=2e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,shapes,match", [
    ({}, ((1, 4, 8, 16), (1, 4, 8, 8), (1, 4, 8, 8)), "k must have shape"),
    ({}, ((1, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)), "k must have shape"),
    ({}, ((1, 4, 8, 16), (1, 4, 8, 16), (1, 4, 9, 16)), "v must have shape"),
    ({}, ((1, 4, 8, 16), (1, 3, 8, 16), (1, 3, 8, 16)), "multiple of k's"),
    ({}, ((4, 8, 16), (1, 4, 8, 16), (1, 4, 8, 16)), "q must be a 4-D tensor"),
    ({}, ((1, 4, 9, 16), (1, 4, 8, 16), (1, 4, 8, 16)), "pass q_offset"),
    ({"slopes": torch.ones(3)}, None, r"slopes must have shape \[H\] = \[4\]"),
    ({"slopes": torch.tensor([1.0, float("nan"), 1.0, 1.0])}, None, "slopes must be finite numbers, got nan for head 1"),
    ({"slopes": [0.5, 0.25, float("inf"), 1.0]}, None, "slopes must be finite numbers, got inf for head 2"),
    ({"slopes": "abcd"}, None, "slopes must be a tensor or sequence of 4 numbers"),
    ({"block_size": 0}, None, "block_size must be a positive integer, got 0"),
    ({"block_size": -4}, None, "block_size must be a positive integer"),
    ({"block_size": 2.5}, None, "block_size must be a positive integer"),
    ({"block_size": True}, None, "block_size must be a positive integer"),
    ({"q_offset": -1}, None, r"q_offset must be an integer in \[0, "),
    ({"q_offset": 10**30}, None, r"q_offset must be an integer in \[0, 4503599627370496\]"),
    ({"q_offset": 1.0}, None, "q_offset must be an integer"),
    ({"scale": 0.0}, None, "scale must be a positive finite number"),
    ({"scale": float("nan")}, None, "scale must be a positive finite number"),
    ({"scale": "0.5"}, None, "scale must be a number, got '0.5'"),
    ({"backend": "cuda"}, None, "backend: expected one of auto, chunked, flex"),
    ({"causal": "no"}, None, "causal must be True or False, got 'no'"),
    ({"causal": 1}, None, "causal must be True or False, got 1"),
])
def test_bad_input_names_the_argument(kwargs, shapes, match):
    shapes = shapes or ((1, 4, 8, 16), (1, 4, 8, 16), (1, 4, 8, 16))
    q, k, v = (torch.randn(s) for s in shapes)
    kwargs = dict(kwargs)
    slopes = kwargs.pop("slopes", None)
    with pytest.raises(PosencError, match=match):
        alibi_attention(q, k, v, slopes, **kwargs)


def test_mixed_dtypes_rejected():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(PosencError, match="share one floating dtype"):
        alibi_attention(q, q.double(), q)
