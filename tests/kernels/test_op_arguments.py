"""posenc's custom ops called directly (``torch.ops.posenc.*``) refuse bad arguments as the public functions do.

The RoPE kernels read raw memory: before the ops applied ``posenc.apply_rope_table``'s checks, a cos/sin table of
the wrong shape returned uninitialised memory and an index of the wrong shape crashed the process. Each bad call is
compared with the same call of the public function (``apply_rope_table`` / ``apply_rope_table_qk`` /
``alibi_attention``): the same exception class and the same one-line message, from every op form, eager and under
torch.compile (the fake implementations check too).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc._internal.errors import PosencError
from posenc.kernels import alibi_attention as alibi_module
from posenc.kernels import ops
from posenc.kernels.rope_checks import TableIndexError
from posenc.rope.apply import apply_rope_table, apply_rope_table_qk, default_inv_freq, rope_cos_sin

SEQ, DIM = 4, 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, SEQ, DIM, generator=g)
    k = torch.randn(1, 1, SEQ, DIM, generator=g)
    cos, sin = rope_cos_sin(torch.arange(6), default_inv_freq(DIM), 1.0, torch.float32)
    return q, k, cos, sin


def _bad_rope_calls():
    """(id, q, k, cos, sin, index, layout, rotary_dim): each one argument wrong, the rest right."""
    q, k, cos, sin = _inputs()
    idx = torch.arange(SEQ)
    return [
        ("table-too-narrow", q, k, cos[:SEQ, :2], sin[:SEQ, :2], None, "half", DIM),
        ("table-rows-not-seq", q, k, cos[:2], sin[:2], None, "half", DIM),       # the case
        ("table-one-row-short", q, k, cos[:SEQ - 1], sin[:SEQ - 1], None, "half", DIM),
        ("cos-sin-shapes-differ", q, k, cos[:SEQ], sin[:SEQ, :2], None, "half", DIM),
        ("table-float64", q, k, cos[:SEQ].double(), sin[:SEQ].double(), None, "half", DIM),
        ("table-on-meta", q, k, cos[:SEQ].to("meta"), sin[:SEQ].to("meta"), None, "half", DIM),
        ("rotary-dim-odd", q, k, cos[:SEQ], sin[:SEQ], None, "half", 7),
        ("rotary-dim-past-head", q, k, cos[:SEQ], sin[:SEQ], None, "half", 2 * DIM),
        ("layout", q, k, cos[:SEQ], sin[:SEQ], None, "diagonal", DIM),
        ("index-shape", q, k, cos, sin, torch.arange(SEQ - 1), "half", DIM),       # crashed the process
        ("index-float", q, k, cos, sin, idx.float(), "half", DIM),
        ("index-out-of-table", q, k, cos, sin, idx + 3, "half", DIM),
        ("index-negative", q, k, cos, sin, idx - 1, "half", DIM),
        ("index-with-3d-table", q, k, cos[None], sin[None], idx, "half", DIM),
        ("x-integer", q.to(torch.int32), k.to(torch.int32), cos[:SEQ], sin[:SEQ], None, "half", DIM),
        ("x-1d", q[0, 0, 0], k[0, 0, 0], cos[:SEQ], sin[:SEQ], None, "half", DIM),
        ("k-other-seq", q, k[:, :, :2], cos[:SEQ], sin[:SEQ], None, "half", DIM),
    ]


BAD_ROPE = _bad_rope_calls()


def _public_error(call):
    with pytest.raises(PosencError) as info:
        call()
    return info.type, str(info.value)


def _assert_same_error(call, expected):
    kind, message = expected
    with pytest.raises(kind) as info:
        call()
    assert str(info.value) == message


@pytest.mark.parametrize("case", BAD_ROPE, ids=[c[0] for c in BAD_ROPE])
def test_every_rope_op_refuses_what_apply_rope_table_refuses(case):
    _, q, k, cos, sin, index, layout, rotary_dim = case
    single = not case[0].startswith("k-")
    expected_qk = _public_error(lambda: apply_rope_table_qk(q, k, cos, sin, index=index, layout=layout,
                                                                   rotary_dim=rotary_dim))
    spec = (cos, sin, index, layout, rotary_dim, False)
    _assert_same_error(lambda: ops.rope_qk(q, k, *spec), expected_qk)
    _assert_same_error(lambda: ops.rope_qk_(q.clone(), k.clone(), *spec), expected_qk)
    _assert_same_error(lambda: ops.rope_qk_out(q, k, *spec, torch.empty_like(q), torch.empty_like(k)), expected_qk)
    if single:
        expected = _public_error(lambda: apply_rope_table(q, cos, sin, index=index, layout=layout,
                                                                 rotary_dim=rotary_dim))
        _assert_same_error(lambda: ops.rope(q, *spec), expected)
        _assert_same_error(lambda: ops.rope_(q.clone(), *spec), expected)
        _assert_same_error(lambda: ops.rope_out(q, *spec, torch.empty_like(q)), expected)


def test_index_errors_are_table_index_errors_and_nothing_is_written():
    q, k, cos, sin = _inputs()
    q_in = q.clone()
    with pytest.raises(TableIndexError, match=r"index must hold row numbers in \[0, 6\)"):
        ops.rope_(q_in, cos, sin, torch.arange(SEQ) + 3, "half", DIM, False)
    assert torch.equal(q_in, q)


def test_out_forms_refuse_a_mismatched_out_as_apply_rope_table_does():
    q, k, cos, sin = _inputs()
    spec = (cos[:SEQ], sin[:SEQ], None, "half", DIM, False)
    bad = torch.empty(1, 2, SEQ, DIM, dtype=torch.float64)
    expected = _public_error(lambda: apply_rope_table(q, cos[:SEQ], sin[:SEQ], layout="half", out=bad))
    _assert_same_error(lambda: ops.rope_out(q, *spec, bad), expected)
    _assert_same_error(lambda: ops.rope_qk_out(q, k, *spec, bad, torch.empty_like(k)), expected)


def test_a_traced_direct_call_is_refused_at_trace_time_in_the_same_words():
    q, k, cos, sin = _inputs()
    expected = _public_error(lambda: apply_rope_table(q, cos[:2], sin[:2], layout="half"))

    def f(x):
        return torch.ops.posenc.rope(x, cos[:2], sin[:2], None, "half", DIM, False)
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:           # dynamo wraps what the fake raised
        torch.compile(f, backend="aot_eager", fullgraph=True)(q)
    torch._dynamo.reset()
    assert expected[1] in str(info.value)


# ------------------------------------------------------------------------------------------------ ALiBi's ops

def _attention_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g),
            torch.randn(1, 2, 5, 8, generator=g))


def _bad_alibi_calls():
    """(id, q, k, v, slopes, causal, q_offset, scale, block_size, backend): one argument wrong each."""
    q, k, v = _attention_inputs()
    s = posenc.alibi_slopes(4)
    return [
        ("slopes-shape", q, k, v, s[:3], True, 0, None, None, "auto"),
        ("slopes-nan", q, k, v, torch.tensor([1.0, float("nan"), 0.5, 0.25]), True, 0, None, None, "auto"),
        ("slopes-inf", q, k, v, torch.tensor([1.0, 0.5, float("inf"), 0.25]), False, 0, None, None, "auto"),
        ("backend", q, k, v, s, True, 0, None, None, "fast"),
        ("q-offset-negative", q, k, v, s, True, -3, None, None, "auto"),
        ("q-offset-huge", q, k, v, s, True, 2**60, None, None, "auto"),
        ("scale-negative", q, k, v, s, True, 0, -1.0, None, "auto"),
        ("scale-nan", q, k, v, s, True, 0, float("nan"), None, "auto"),
        ("block-size-zero", q, k, v, s, True, 0, None, 0, "auto"),
        ("q-3d", q[0], k, v, s, True, 0, None, None, "auto"),
        ("heads-not-multiple", q[:, :3], k, v, s[:3], True, 0, None, None, "auto"),
        ("v-other-length", q, k, v[:, :, :4], s, True, 0, None, None, "auto"),
        ("dtypes-differ", q, k.double(), v, s, True, 0, None, None, "auto"),
        ("q-integer", q.int(), k.int(), v.int(), s, True, 0, None, None, "auto"),
        ("no-keys", q, k[:, :, :0], v[:, :, :0], s, True, 0, None, None, "auto"),
    ]


BAD_ALIBI = _bad_alibi_calls()


@pytest.mark.parametrize("case", BAD_ALIBI, ids=[c[0] for c in BAD_ALIBI])
def test_alibi_ops_refuse_what_alibi_attention_refuses(case):
    _, q, k, v, slopes, causal, q_offset, scale, block_size, backend = case
    expected = _public_error(lambda: posenc.alibi_attention(q, k, v, slopes, causal=causal, q_offset=q_offset,
                                                            scale=scale, block_size=block_size, backend=backend))
    args = (slopes, causal, q_offset, scale, block_size, backend)
    _assert_same_error(lambda: torch.ops.posenc.alibi_attention(q, k, v, *args), expected)
    grad = torch.zeros(q.shape[:3] + v.shape[3:]) if q.dim() == 4 and v.dim() == 4 else q
    _assert_same_error(lambda: torch.ops.posenc.alibi_attention_backward(grad, q, k, v, *args, [True] * 4),
                       expected)


def test_alibi_backward_op_refuses_a_mismatched_grad_or_flags():
    q, k, v = _attention_inputs()
    args = (posenc.alibi_slopes(4), True, 0, None, None, "auto")
    good = torch.zeros(1, 4, 5, 8)
    with pytest.raises(PosencError, match=r"grad must be the output's gradient \(1, 4, 5, 8\)"):
        torch.ops.posenc.alibi_attention_backward(good[:, :, :3], q, k, v, *args, [True] * 4)
    with pytest.raises(PosencError, match="needs must be 4 flags"):
        torch.ops.posenc.alibi_attention_backward(good, q, k, v, *args, [True])
    dq, dk, dv, ds = torch.ops.posenc.alibi_attention_backward(good, q, k, v, *args, [True] * 4)
    assert dq.shape == q.shape and ds.shape == (4,) and not dq.any()       # (a zero grad: zero gradients)


def test_alibi_op_still_matches_the_public_function():
    q, k, v = _attention_inputs()
    s = posenc.alibi_slopes(4)
    assert torch.equal(alibi_module.alibi_attention_op(q, k, v, s, True, 0, None, None, "auto"),
                       posenc.alibi_attention(q, k, v, s))


def test_compiled_alibi_attention_refuses_nan_slopes_when_it_runs():
    """The trace cannot read the slopes, but the op checks them when the compiled graph runs it (before: NaN out)."""
    q, k, v = _attention_inputs()

    def f(q, k, v, slopes):
        return posenc.alibi_attention(q, k, v, slopes)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    good = posenc.alibi_slopes(4)
    assert torch.allclose(compiled(q, k, v, good), posenc.alibi_attention(q, k, v, good), atol=1e-6)
    with pytest.raises(PosencError, match="slopes must be finite numbers, got nan for head 2"):
        compiled(q, k, v, torch.tensor([1.0, 0.5, float("nan"), 0.25]))
    torch._dynamo.reset()
