"""RoPE writes obey torch's aliasing and autograd rules, identically with the C kernel and the eager fallback.

Every case runs the posenc call twice (native C kernel, and the eager fallback forced by cpu_rope.eager_only(), the
same switch as POSENC_NATIVE=0) and once with torch's own analogous op (``x.mul_(c)`` for inplace=True,
``torch.mul(x, c, out=o)`` for out=): the oracle says whether the write must be refused. The two backends must
give the same outcome: the same error message, or the same tensors.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc._internal.errors import PosencError
from posenc.kernels import cpu_rope
from posenc.kernels.rope_checks import RopeAliasError
from posenc.rope.apply import apply_rope_table_qk, default_inv_freq
from posenc_oracles import assert_close_to_oracle, reference_rope

HAS_CC = cpu_rope._compiler() is not None
BACKENDS = ["native", "eager"] if HAS_CC else ["eager"]
POS = torch.arange(4) + 3


def _backend(name):
    if name == "eager":
        return cpu_rope.eager_only()
    import contextlib
    return contextlib.nullcontext()


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _x(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype)


def _ref(x, positions=POS, layout="interleaved"):
    return reference_rope(x.detach(), positions, default_inv_freq(x.shape[-1]).tolist(), layout, x.shape[-1])


# ---- the cases: name -> (posenc call, torch's analogous call or None); each builds its own tensors ----------------
# A call returns the tensors whose values must agree between backends; an exception is the outcome otherwise.

def inplace_saved_by_other_op(op):
    w = _x(2, 4, 8, seed=1).requires_grad_()
    x = _x(2, 4, 8)
    y = (w * x).sum()                      # mul saves x for w's gradient
    op(x)
    y.backward()                           # must raise: x was modified in place after being saved
    return {"w.grad": w.grad}


def inplace_nonleaf_saved(op):
    leaf = _x(2, 4, 8).requires_grad_()
    h = leaf * 1.5
    z = (h * h).sum()                      # saves h
    op(h)
    z.backward()
    return {"leaf.grad": leaf.grad}


def out_saved_by_other_op(op_out):
    w = _x(2, 4, 8, seed=1).requires_grad_()
    o = _x(2, 4, 8, seed=2)
    y = (w * o).sum()
    with torch.no_grad():
        op_out(_x(2, 4, 8), o)
    y.backward()
    return {"w.grad": w.grad}


def inplace_expanded(op):
    base = _x(1, 4, 8)
    x = base.expand(3, 4, 8)
    try:
        op(x)
    finally:
        assert torch.equal(base, _x(1, 4, 8))   # nothing written, whatever happens
    return {"x": x}


def out_expanded(op_out):
    o = torch.zeros(1, 4, 8, dtype=torch.float64).expand(3, 4, 8)
    op_out(_x(3, 4, 8), o)
    return {"o": o}


def out_shifted_one_row_dense(op_out):
    buf = _x(5 * 8)
    x, o = buf[:32].view(4, 8), buf[8:].view(4, 8)       # both dense, one row apart
    op_out(x, o)
    return {"buf": buf}


def out_shifted_one_column(op_out):
    buf = _x(4, 9)
    x, o = buf[:, :8], buf[:, 1:]                          # non-dense views one column apart
    op_out(x, o)
    return {"buf": buf}


def out_is_input(op_out):
    x = _x(2, 4, 8)
    op_out(x, x)                                           # out= the input itself: in place, allowed
    return {"x": x}


def out_disjoint_halves_of_one_buffer(op_out):
    buf = _x(2, 4, 16)
    op_out(buf[..., :8], buf[..., 8:])                     # interleaved in memory, no shared element
    return {"buf": buf}


def out_into_leaf_requiring_grad(op_out):
    leaf = torch.zeros(2, 4, 8, dtype=torch.float64, requires_grad=True)
    op_out(_x(2, 4, 8), leaf)
    return {"leaf": leaf.detach()}


def out_into_leaf_requiring_grad_no_grad(op_out):
    leaf = torch.zeros(2, 4, 8, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        op_out(_x(2, 4, 8), leaf)
    return {"leaf": leaf.detach()}


def out_with_input_requiring_grad(op_out):
    x = _x(2, 4, 8).requires_grad_()
    o = torch.zeros(2, 4, 8, dtype=torch.float64)
    op_out(x, o)
    return {"o": o}


def inplace_leaf_requiring_grad(op):
    leaf = _x(2, 4, 8).requires_grad_()
    try:
        op(leaf)
    finally:
        assert torch.equal(leaf.detach(), _x(2, 4, 8))     # refused before anything was written
    return {"leaf": leaf.detach()}


def inplace_leaf_requiring_grad_no_grad(op):
    leaf = _x(2, 4, 8).requires_grad_()
    with torch.no_grad():
        op(leaf)
    return {"leaf": leaf.detach()}


def inplace_nonleaf_view_gradient(op):
    leaf = _x(2, 4, 16).requires_grad_()
    base = leaf * 1.0
    view = base[..., :8]                                   # a view of a non-leaf, rotated in place
    op(view)
    (base * _x(2, 4, 16, seed=5)).sum().backward()
    return {"base": base.detach(), "leaf.grad": leaf.grad}


def inplace_inference_tensor_outside_inference_mode(op):
    with torch.inference_mode():
        x = _x(2, 4, 8)
    op(x)
    return {"x": x}


def inplace_inference_tensor_inside_inference_mode(op):
    with torch.inference_mode():
        x = _x(2, 4, 8)
        op(x)
    return {"x": x}


def _posenc_inplace(x):
    posenc.apply_rope(x, POS, inplace=True)


def _posenc_out(x, o):
    posenc.apply_rope(x, POS, out=o)


def _torch_inplace(x):
    x.mul_(1.0)


def _torch_out(x, o):
    torch.mul(x, 1.0, out=o)


INPLACE_CASES = [inplace_saved_by_other_op, inplace_nonleaf_saved, inplace_expanded, inplace_leaf_requiring_grad,
                 inplace_leaf_requiring_grad_no_grad, inplace_nonleaf_view_gradient,
                 inplace_inference_tensor_outside_inference_mode, inplace_inference_tensor_inside_inference_mode]
OUT_CASES = [out_saved_by_other_op, out_expanded, out_shifted_one_row_dense, out_is_input,
             out_disjoint_halves_of_one_buffer, out_into_leaf_requiring_grad, out_into_leaf_requiring_grad_no_grad,
             out_with_input_requiring_grad]
# where torch itself does not refuse (it skips its overlap check on non-dense views and writes garbage), posenc
# refuses: the only case posenc is stricter in
STRICTER = {out_shifted_one_column: True}
CASES = INPLACE_CASES + OUT_CASES + list(STRICTER)


def _run(case, backend):
    """('raises', message) or ('ok', {name: tensor}) for one case on one backend."""
    op = _posenc_inplace if case in INPLACE_CASES else _posenc_out
    with _backend(backend):
        try:
            return "ok", case(op)
        except (RuntimeError, PosencError) as exc:
            return "raises", str(exc)


def _torch_refuses(case) -> bool:
    if case in STRICTER:
        return STRICTER[case]
    try:
        case(_torch_inplace if case in INPLACE_CASES else _torch_out)
    except RuntimeError:
        return True
    return False


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_refuses_exactly_what_torch_refuses(case, backend):
    kind, detail = _run(case, backend)
    assert (kind == "raises") == _torch_refuses(case), (kind, detail)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: only the eager backend exists")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_both_backends_behave_the_same(case):
    native, eager = _run(case, "native"), _run(case, "eager")
    assert native[0] == eager[0], (native, eager)
    if native[0] == "raises":
        # the eager ops bump a version counter several times per write, the kernel once: "is at version N" differs
        assert re.sub(r"version \d+", "version N", native[1]) == re.sub(r"version \d+", "version N", eager[1])
    else:
        assert native[1].keys() == eager[1].keys()
        for name in native[1]:
            torch.testing.assert_close(native[1][name], eager[1][name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_allowed_writes_give_the_rotation(backend):
    with _backend(backend):
        # out= the input itself, out= into disjoint halves of one buffer, in place on a view of a non-leaf
        x = _x(2, 4, 8)
        want = _ref(x)
        posenc.apply_rope(x, POS, out=x)
        assert_close_to_oracle(x, want, torch.float64)
        buf = _x(2, 4, 16)
        want = _ref(buf[..., :8])
        posenc.apply_rope(buf[..., :8], POS, out=buf[..., 8:])
        assert_close_to_oracle(buf[..., 8:], want, torch.float64)
        _, got = _run(inplace_nonleaf_view_gradient, backend)
        leaf = _x(2, 4, 16)
        assert_close_to_oracle(got["base"][..., :8], _ref(leaf[..., :8]), torch.float64)
        assert torch.equal(got["base"][..., 8:], leaf[..., 8:])
        # d/d leaf of sum(base * g): the inverse rotation of g on the rotated half, g itself on the rest
        g = _x(2, 4, 16, seed=5)
        inv = reference_rope(g[..., :8], POS, default_inv_freq(8).tolist(), "interleaved", 8, inverse=True)
        assert_close_to_oracle(got["leaf.grad"][..., :8], inv, torch.float64)
        assert torch.equal(got["leaf.grad"][..., 8:], g[..., 8:])


# ---- q and k: aliasing between the two tensors ----------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_q_and_k_aliasing(backend):
    with _backend(backend):
        q = _x(1, 2, 4, 8)
        before = q.clone()
        with pytest.raises(RopeAliasError, match="rotated twice"):
            posenc.apply_rope_qk(q, q, POS, inplace=True)
        assert torch.equal(q, before)                               # nothing rotated, not even once
        with pytest.raises(RopeAliasError, match="rotated twice"):  # partial: q and k overlap by one head
            buf = _x(1, 3, 4, 8)
            posenc.apply_rope_qk(buf[:, :2], buf[:, 1:], POS, inplace=True)
        qr, kr = posenc.apply_rope_qk(q, q, POS)                   # reading one tensor twice is fine
        assert torch.equal(qr, kr) and torch.equal(q, before)
        assert_close_to_oracle(qr, _ref(q), torch.float64)
        k = _x(1, 2, 4, 8, seed=3)
        o = torch.empty_like(q)
        with pytest.raises(RopeAliasError, match="share memory"):
            posenc.apply_rope_qk(q, k, POS, out=(o, o))              # two results into one place
        with pytest.raises(RopeAliasError, match="shares memory with the input"):
            posenc.apply_rope_qk(q, k, POS, out=(k, q))              # q's result over k before k is read
        assert torch.equal(q, before) and torch.equal(k, _x(1, 2, 4, 8, seed=3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_q_and_k_views_of_one_fused_projection_in_place(backend):
    # the usual fused qkv buffer [B, T, 3, H, D]: q, k are interleaved views, disjoint: in place is allowed
    with _backend(backend):
        qkv = _x(2, 4, 3, 2, 8)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
        want_q, want_k, v = _ref(q), _ref(k), qkv[:, :, 2].clone()
        rq, rk = posenc.apply_rope_qk(q, k, POS, inplace=True)
        assert rq is q and rk is k
        assert_close_to_oracle(q, want_q, torch.float64)
        assert_close_to_oracle(k, want_k, torch.float64)
        assert torch.equal(qkv[:, :, 2], v)


# ---- double backward -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_double_backward(backend, layout):
    with _backend(backend):
        x = _x(1, 2, 4, 8).requires_grad_()
        assert torch.autograd.gradgradcheck(lambda t: posenc.apply_rope(t, POS, layout=layout, rotary_dim=6), (x,))
        q, k = _x(1, 2, 4, 8).requires_grad_(), _x(1, 1, 4, 8, seed=1).requires_grad_()
        assert torch.autograd.gradgradcheck(lambda a, b: posenc.apply_rope_qk(a, b, POS, layout=layout), (q, k))
        # create_graph=True gives a gradient that is itself differentiable
        y = posenc.apply_rope(x, POS, layout=layout)
        (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
        assert g.grad_fn is not None
        torch.testing.assert_close(g, 2 * x)               # R^T (2 R x): the rotation is orthogonal


def test_caches_filled_under_inference_mode_serve_later_autograd_calls():
    """An evaluation under torch.inference_mode() before training: the tables it caches are ordinary tensors, so
    the later calls with autograd work (an inference tensor cannot be saved for backward)."""
    import posenc
    from posenc.rope.apply import TABLES

    TABLES.clear()
    pos = torch.arange(7)
    rot = posenc.Rotary(16)
    q = torch.randn(1, 2, 7, 16)
    with torch.inference_mode():
        posenc.apply_rope(q, pos)
        rot(q, q, pos)
        posenc.alibi_attention(q, q, q, causal=True)
    x = q.clone().requires_grad_(True)
    posenc.apply_rope(x, pos).sum().backward()
    sum(t.sum() for t in rot(x, x, pos)).backward()
    posenc.alibi_attention(x, x, x, causal=True).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_rotary_table_never_grows_past_its_cap(monkeypatch):
    import posenc.rope.module as M

    monkeypatch.setattr(M, "_MAX_CACHED_POSITIONS", 1000)
    rot = M.Rotary(8)
    q = torch.randn(1, 1, 1, 8)
    rot(q, q, torch.tensor([600]))
    rot(q, q, torch.tensor([999]))              # doubling would ask 1202 rows
    assert rot.cos_cached.shape[0] == 1000
    torch.testing.assert_close(rot(q, q, torch.tensor([999]))[0], posenc.apply_rope(q, torch.tensor([999])))


@settings(max_examples=300, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), gaps=st.lists(st.integers(0, 3), min_size=3,
       max_size=3), order=st.permutations([0, 1, 2]), esize=st.sampled_from([1, 2, 4]), delta=st.integers(-80, 80))
def test_two_views_of_one_geometry_overlap_exactly_when_their_bytes_meet(shape, gaps, order, esize, delta):
    """The exact any-size test for same-geometry views against enumerating every byte."""
    from posenc.kernels.rope_checks import _intervals, _layout, _translate_overlap

    stride, cur = [0] * len(shape), 1
    for d in [o for o in order if o < len(shape)]:
        stride[d], cur = cur, cur * shape[d] + gaps[d]
    shape, stride = tuple(shape), tuple(stride)
    if _layout(shape, stride)[1]:
        return
    a = {b for lo, hi in _intervals(shape, stride, esize).tolist() for b in range(lo, hi)}
    want = any(b + delta in a for b in a)
    assert _translate_overlap(delta, shape, stride, esize) == want


def test_q_and_k_views_of_a_long_fused_buffer_are_not_taken_for_overlapping():
    """Past 2^22 rows (131073 tokens x 32 heads): disjoint q and k views of one qkv buffer rotate in place, and
    even -> odd columns of one buffer take out=; a truly shifted out= is still refused."""
    import posenc

    T = (1 << 17) + 1
    qkv = torch.randn(1, T, 3, 32, 4, dtype=torch.bfloat16)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)      # [1, H, T, D] views, disjoint
    want = posenc.apply_rope_qk(q.clone(), k.clone(), torch.arange(T))
    posenc.apply_rope_qk(q, k, torch.arange(T), inplace=True)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])
    x = torch.randn(4097, 2048)
    posenc.apply_rope(x[:, ::2], torch.arange(4097), out=x[:, 1::2])
    with pytest.raises(RopeAliasError):
        posenc.apply_rope(x[:, :1024], torch.arange(4097), out=x[:, 1:1025])


# ---- negated views (is_neg(): torch's lazy negation) -------------------------------------------------------------
# Their memory holds minus their values; a kernel reading or writing raw memory must not miss the sign. The oracle
# is the same call on resolved (ordinary) tensors.

def _neg(t):
    return torch._neg_view(t.clone())


NEGATED = ["q", "k", "out", "inplace", "table"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("role", NEGATED)
def test_negated_views_are_read_and_written_with_their_sign(backend, role):
    q, k = _x(1, 4, 4, 8, seed=2, dtype=torch.float32), _x(1, 2, 4, 8, seed=3, dtype=torch.float32)
    want = posenc.apply_rope_qk(q, k, POS)
    with _backend(backend):
        for _ in range(3):                          # again and again: a remembered geometry must not skip the sign
            if role in ("q", "k"):
                got = posenc.apply_rope_qk(_neg(q) if role == "q" else q, _neg(k) if role == "k" else k, POS)
                want_here = posenc.apply_rope_qk(-q if role == "q" else q, -k if role == "k" else k, POS)
            elif role == "out":
                got = (_neg(torch.empty_like(q)), torch.empty_like(k))
                posenc.apply_rope_qk(q, k, POS, out=got)
                want_here = want
            elif role == "inplace":
                got = (_neg(-q), k.clone())             # a view whose values are q
                posenc.apply_rope_qk(*got, POS, inplace=True)
                want_here = want
            else:
                cos, sin = posenc.rope_cos_sin(POS, default_inv_freq(8))
                got = apply_rope_table_qk(q, k, _neg(-cos), sin)     # cos given as a negated view of cos
                want_here = want
            for g, w in zip(got, want_here):
                torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negated_positions_keep_their_sign(backend):
    q, k = _x(1, 2, 4, 8, seed=6), _x(1, 2, 4, 8, seed=7)
    with _backend(backend):
        got = posenc.apply_rope_qk(q, k, torch._neg_view(POS.clone()))
        rot = posenc.Rotary(8)
        by_module = rot(q.float(), k.float(), torch._neg_view(-POS))            # values POS
    want = posenc.apply_rope_qk(q, k, -POS)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(by_module[0], posenc.Rotary(8)(q.float(), k.float(), POS)[0], rtol=0, atol=0)


def test_gradients_through_a_negated_view():
    x = _x(1, 2, 4, 8, seed=4).requires_grad_()
    k = _x(1, 2, 4, 8, seed=5)
    qr, _ = posenc.apply_rope_qk(torch._neg_view(x), k, POS)
    qr.sum().backward()
    # d/dx sum(R(-x)) = -R^T 1
    ones = torch.ones_like(x)
    torch.testing.assert_close(x.grad, -reference_rope(ones, POS, default_inv_freq(8).tolist(), "interleaved", 8,
                                                        inverse=True), rtol=1e-12, atol=1e-12)
