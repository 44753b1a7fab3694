"""The decode fast paths of apply_rope_qk and Rotary: a call geometry the general path has already checked skips
to the C kernel. Every repeat call must agree with the lesson's loops and with the general path, whatever changed
in between (positions past the table, a cleared table, threads, strides, autograd, aliasing, frequencies)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import Rotary, apply_rope, apply_rope_qk
from posenc._internal.errors import PosencError
from posenc.kernels import cpu_rope
from posenc.kernels.rope_checks import RopeAliasError
from posenc.rope import apply as apply_mod
from posenc.rope import module as module_mod
from posenc.rope.apply import TABLES, default_inv_freq
from posenc_oracles import assert_close_to_oracle, reference_rope

pytestmark = pytest.mark.skipif(not cpu_rope.native_available(), reason="the fast path is the C kernel's")

D = 16
INV = default_inv_freq(D, 10000.0).tolist()


def qk(seed: int, hq: int = 4, hk: int = 2, t: int = 1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hq, t, D, generator=g).to(dtype), torch.randn(1, hk, t, D, generator=g).to(dtype))


def call(mode: str, q, k, pos, **kwargs):
    """apply_rope_qk in one of its three write modes; returns (q_rot, k_rot) and checks where they were written."""
    if mode == "new":
        return apply_rope_qk(q, k, pos, **kwargs)
    if mode == "out":
        out = (torch.empty_like(q), torch.empty_like(k))
        result = apply_rope_qk(q, k, pos, out=out, **kwargs)
        assert result[0] is out[0] and result[1] is out[1]
        return result
    q2, k2 = q.clone(), k.clone()
    result = apply_rope_qk(q2, k2, pos, inplace=True, **kwargs)
    assert result[0] is q2 and result[1] is k2
    return result


def warm(fn, *args, **kwargs):
    """Call twice: the first call checks and records the geometry, the second takes the fast path."""
    fn(*args, **kwargs)
    return fn(*args, **kwargs)


def warm_rotary(seed: int, pos: torch.Tensor):
    """A half-layout Rotary and (q, k) of decode shape, after two calls at ``pos``."""
    rot = Rotary(D, layout="half")
    q, k = qk(seed)
    warm(rot, q, k, pos)
    return rot, q, k


def oracle(q, k, pos, layout):
    return (reference_rope(q, pos, INV, layout, D), reference_rope(k, pos, INV, layout, D))


@pytest.fixture(autouse=True)
def fresh_memory():
    """Each test starts with no remembered calls (what other tests left would decide which path a call takes)."""
    cpu_rope.PLANS.clear()


@pytest.fixture
def hits(monkeypatch):
    """How many apply_rope_qk calls the fast path finished (a spy on posenc.rope.apply.run_known)."""
    counter = {"n": 0}
    run = apply_mod.run_known

    def spy(*args):
        result = run(*args)
        counter["n"] += result is not None
        return result
    monkeypatch.setattr(apply_mod, "run_known", spy)
    return counter


@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(["new", "out", "inplace"]), layout=st.sampled_from(["half", "interleaved"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
       positions=st.lists(st.integers(-50, 9000), min_size=2, max_size=5), seed=st.integers(0, 2 ** 16),
       pair=st.booleans())
def test_repeat_calls_match_the_lesson_loops(mode, layout, dtype, positions, seed, pair):
    # apply_rope_qk (pair) or apply_rope on q alone. Positions past the table's 4096 rows make the kernel refuse
    # (the general path grows the table); negative ones are rotated by their negative angle, as on the general path
    q, k = qk(seed, dtype=dtype)
    for p in positions:
        pos = torch.tensor([[p]])
        rq, rk = oracle(q, k, pos, layout)
        if not pair:
            assert_close_to_oracle(call1(mode, q, pos, layout=layout), rq, dtype)
            continue
        qr, kr = call(mode, q, k, pos, layout=layout)
        assert_close_to_oracle(qr, rq, dtype)
        assert_close_to_oracle(kr, rk, dtype)


@pytest.mark.parametrize("mode", ["new", "out", "inplace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fast_path_runs_and_equals_the_general_path_bit_for_bit(mode, dtype, hits):
    q, k = qk(1, t=3, dtype=dtype)
    pos = torch.tensor([[5, 6, 7]])
    first = call(mode, q, k, pos, layout="half")
    with cpu_rope.eager_only():          # the eager fallback (bit-identical to the kernel), not the fast path
        general = call(mode, q, k, pos + 100, layout="half")
    assert hits["n"] == 0
    fast = call(mode, q, k, pos + 100, layout="half")
    assert hits["n"] == 1
    assert torch.equal(fast[0], general[0]) and torch.equal(fast[1], general[1])
    assert not torch.equal(first[0], fast[0])


def test_a_cleared_table_is_rebuilt_and_a_grown_one_is_used(hits):
    q, k = qk(2)
    call("new", q, k, torch.tensor([[3]]), layout="half")
    TABLES.clear()
    qr, _ = call("new", q, k, torch.tensor([[3]]), layout="half")       # no table: the general path rebuilds it
    assert hits["n"] == 0
    assert_close_to_oracle(qr, oracle(q, k, torch.tensor([[3]]), "half")[0], torch.float32)
    call("new", q, k, torch.tensor([[20000]]), layout="half")           # grows the table past 4096 rows
    qr, _ = call("new", q, k, torch.tensor([[19999]]), layout="half")
    assert hits["n"] == 1
    assert_close_to_oracle(qr, oracle(q, k, torch.tensor([[19999]]), "half")[0], torch.float32)


def test_a_new_thread_count_gets_its_own_plan():
    q, k = qk(3, hq=64, hk=64, t=64)          # big enough for the kernel to split the work across threads
    pos = torch.arange(64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = apply_rope_qk(q, k, pos, layout="half")
        torch.set_num_threads(2)
        apply_rope_qk(q, k, pos, layout="half")
        two = apply_rope_qk(q, k, pos, layout="half")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_eager_only_after_a_warm_call_runs_the_fallback(monkeypatch):
    q, k = qk(4)
    pos = torch.tensor([[9]])
    warm(apply_rope_qk, q, k, pos)
    calls = {"n": 0}
    run = cpu_rope._state["run"]

    def counting(*args):
        calls["n"] += 1
        return run(*args)
    monkeypatch.setitem(cpu_rope._state, "run", counting)
    apply_rope_qk(q, k, pos)
    assert calls["n"] == 1
    with cpu_rope.eager_only():
        qr, _ = apply_rope_qk(q, k, pos)
    assert calls["n"] == 1
    assert_close_to_oracle(qr, oracle(q, k, pos, "interleaved")[0], torch.float32)


def test_aliasing_is_refused_after_warm_calls_of_the_same_shapes():
    q, k = qk(5)
    pos = torch.tensor([[1]])
    for mode in ("inplace", "out"):
        call(mode, q, k, pos)
        call(mode, q, k, pos)
    buf = torch.randn(1, 4, 1, D)
    with pytest.raises(RopeAliasError, match="rotated twice|share memory"):
        apply_rope_qk(buf, buf[:, 2:], pos, inplace=True)         # k is q's last two heads
    with pytest.raises(RopeAliasError):
        apply_rope_qk(q, k, pos, out=(buf, buf[:, 1:3]))          # the two outputs overlap
    with pytest.raises(RopeAliasError):
        apply_rope_qk(buf, k, pos, out=(torch.empty_like(q), buf[:, :2]))     # out[1] overlaps q
    with torch.inference_mode():
        made = (torch.empty_like(q), torch.empty_like(k))
    with pytest.raises(RopeAliasError, match="inference tensor"):
        apply_rope_qk(q, k, pos, out=made)
    with torch.inference_mode():
        qr, _ = apply_rope_qk(q, k, pos, out=made)
    assert_close_to_oracle(qr, oracle(q, k, pos, "interleaved")[0], torch.float32)


def test_an_out_tensor_that_is_its_own_input_still_works():
    q, k = qk(6)
    pos = torch.tensor([[4]])
    ref = oracle(q, k, pos, "interleaved")
    call("out", q, k, pos)
    q2, k2 = q.clone(), k.clone()
    apply_rope_qk(q2, k2, pos, out=(q2, k2))      # out= the inputs themselves: in place, as torch allows
    assert_close_to_oracle(q2, ref[0], torch.float32)
    assert_close_to_oracle(k2, ref[1], torch.float32)


def test_autograd_after_warm_calls_takes_the_differentiable_path():
    q, k = qk(7, dtype=torch.float64)
    pos = torch.tensor([[3]])
    warm(apply_rope_qk, q, k, pos)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    qr, kr = apply_rope_qk(qg, kg, pos)
    assert qr.grad_fn is not None
    (qr.sum() + kr.sum()).backward()
    # the gradient of sum(R x) is R^T 1: the inverse rotation of ones
    ones = torch.ones_like(q)
    assert torch.allclose(qg.grad, reference_rope(ones, pos, INV, "interleaved", D, inverse=True), atol=1e-12)
    call("out", q, k, pos)
    with pytest.raises(RopeAliasError, match="automatic differentiation"):
        apply_rope_qk(q, k, pos, out=(torch.empty_like(q).requires_grad_(), torch.empty_like(k)))
    with pytest.raises(RopeAliasError, match="leaf Variable"):
        apply_rope_qk(qg, kg, pos, inplace=True)


@pytest.mark.parametrize("mode", ["out", "inplace"])
def test_written_tensors_get_their_version_bumped_on_the_fast_path(mode, hits):
    q, k = qk(8)
    pos = torch.tensor([[2]])
    call(mode, q, k, pos)
    out = (torch.empty_like(q), torch.empty_like(k)) if mode == "out" else (q.clone(), k.clone())
    before = [t._version for t in out]
    kwargs = {"out": out} if mode == "out" else {"inplace": True}
    apply_rope_qk(*((q, k) if mode == "out" else out), pos, **kwargs)
    assert hits["n"] == 1
    assert all(t._version > v for t, v in zip(out, before))


def test_arguments_the_general_path_refuses_are_still_refused_after_warm_calls():
    q, k = qk(9)
    pos = torch.tensor([[2]])
    warm(apply_rope_qk, q, k, pos, rotary_dim=D)
    with pytest.raises(PosencError, match="rotary_dim"):
        apply_rope_qk(q, k, pos, rotary_dim=float(D))           # equal as a number, not an integer
    with pytest.raises(PosencError, match="inplace"):
        apply_rope_qk(q, k, pos, inplace=1)
    with pytest.raises(PosencError, match="layout"):
        apply_rope_qk(q, k, pos, layout=["half"])


def test_non_contiguous_inputs_of_a_remembered_shape_are_rotated_correctly():
    q, k = qk(10, t=2)
    pos = torch.tensor([[0, 7]])
    warm(apply_rope_qk, q, k, pos)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)        # same shape and values, other strides
    assert not qt.is_contiguous()
    qr, _ = apply_rope_qk(qt, k, pos)
    assert_close_to_oracle(qr, oracle(q, k, pos, "interleaved")[0], torch.float32)


def test_the_remembered_calls_are_bounded():
    pos = torch.tensor([[1]])
    for t in range(1, 70):
        q, k = qk(t, t=t)
        p = torch.arange(t)[None]
        apply_rope_qk(q, k, p)
        assert len(cpu_rope.PLANS) <= cpu_rope.PLANS.limit
    q, k = qk(0)
    qr, _ = apply_rope_qk(q, k, pos)
    assert_close_to_oracle(qr, oracle(q, k, pos, "interleaved")[0], torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# Rotary
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def general(monkeypatch):
    """How many Rotary calls reached the general kernel branch (a spy on module.qk_plan, which only it calls)."""
    counter = {"n": 0}
    plan = module_mod.qk_plan

    def spy(*args, **kwargs):
        counter["n"] += 1
        return plan(*args, **kwargs)
    monkeypatch.setattr(module_mod, "qk_plan", spy)
    return counter


@pytest.mark.parametrize("positions", [torch.tensor([5, 6]), torch.tensor([[5, 6], [0, 9]])])
def test_rotary_repeat_calls_skip_the_checks_and_match_the_loops(positions, general):
    rot = Rotary(D, layout="half")
    batch = 1 if positions.dim() == 1 else 2
    q, k = torch.randn(batch, 4, 2, D), torch.randn(batch, 2, 2, D)
    rot(q, k, positions + 100)        # builds the table past every position below (growing it drops the plans)
    for step in range(3):
        qr, kr = rot(q, k, positions + step)
        per_row = positions + step if positions.dim() == 1 else (positions + step)[:, None]
        assert_close_to_oracle(qr, reference_rope(q, per_row, INV, "half", D), torch.float32)
        assert_close_to_oracle(kr, reference_rope(k, per_row, INV, "half", D), torch.float32)
    assert general["n"] == 1          # the first call built the table, the second took the general kernel branch


def test_rotary_sees_frequency_edits_and_growth_after_warm_calls():
    pos = torch.tensor([3])
    rot, q, k = warm_rotary(11, pos)
    rot.inv_freq.data.mul_(2.0)                    # a weight loader's write: no version-counter bump
    qr, _ = rot(q, k, pos)
    doubled = [2 * f for f in INV]
    assert_close_to_oracle(qr, reference_rope(q, pos, doubled, "half", D), torch.float32)
    far = torch.tensor([50000])                    # past the table: the general path grows it
    qr, _ = rot(q, k, far)
    assert_close_to_oracle(qr, reference_rope(q, far, doubled, "half", D), torch.float32)


def test_rotary_head_dim_is_part_of_what_was_checked():
    q, k = qk(12)
    pos = torch.tensor([1])
    warm(Rotary(D), q, k, pos)
    with pytest.raises(PosencError, match="head_dim"):
        Rotary(2 * D, partial_rotary_factor=0.5)(q, k, pos)          # another module, same shapes: still its own check


def test_rotary_with_grad_after_warm_calls():
    pos = torch.tensor([4])
    rot, q, k = warm_rotary(13, pos)
    qg = q.clone().requires_grad_()
    qr, _ = rot(qg, k, pos)
    assert qr.grad_fn is not None
    qr.sum().backward()
    assert_close_to_oracle(qg.grad, reference_rope(torch.ones_like(q), pos, INV, "half", D, inverse=True),
                           torch.float32)


def test_rotary_copies_see_their_own_frequency_edits():
    # the table's check compares a view of inv_freq's memory with a snapshot: a copied module must not read the
    # original's memory through it
    import copy

    pos = torch.tensor([5])
    rot, q, k = warm_rotary(14, pos)
    twin = copy.deepcopy(rot)
    warm(twin, q, k, pos)
    twin.inv_freq.data.mul_(3.0)
    qr, _ = twin(q, k, pos)
    assert_close_to_oracle(qr, reference_rope(q, pos, [3 * f for f in INV], "half", D), torch.float32)
    qr, _ = rot(q, k, pos)
    assert_close_to_oracle(qr, reference_rope(q, pos, INV, "half", D), torch.float32)
    rot.inv_freq.data = rot.inv_freq.data * 2.0          # new memory for the same tensor
    qr, _ = rot(q, k, pos)
    assert_close_to_oracle(qr, reference_rope(q, pos, [2 * f for f in INV], "half", D), torch.float32)


# ----------------------------------------------------------------------------------------------- Rotary.__call__
# Rotary calls forward directly when nn.Module.__call__ would do nothing else: everything that __call__ serves
# must still reach it.

def close_to(rotated, expected):
    for got, want in zip(rotated, expected):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_rotary_calls_go_through_module_dispatch(monkeypatch):
    # Rotary has no __call__ shortcut of its own (issue 33: benchmarks/rope.py --threads 1 put a decode step through
    # nn.Module.__call__ at 0.27x transformers' eager function, under the 0.3x that would justify one): every call,
    # warm or not, is torch's module call, so hooks, tracing and compile see it as they see any module
    rot, q, k = warm_rotary(1, torch.tensor([7]))
    dispatched = []
    real = torch.nn.Module.__call__

    def spy(self, *args, **kwargs):
        dispatched.append(self)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(torch.nn.Module, "__call__", spy)
    close_to(rot(q, k, torch.tensor([7])), oracle(q, k, torch.tensor([7]), "half"))
    assert dispatched == [rot]


def test_rotary_hooks_of_every_kind_still_run():
    rot, q, k = warm_rotary(2, torch.tensor([5]))
    seen = []
    handles = [
        rot.register_forward_pre_hook(lambda m, args: seen.append("pre")),
        rot.register_forward_hook(lambda m, args, out: seen.append("post")),
        torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append("global post")),
        torch.nn.modules.module.register_module_forward_pre_hook(lambda m, args: seen.append("global pre")),
    ]
    try:
        out = rot(q, k, torch.tensor([5]))
    finally:
        for h in handles:
            h.remove()
    assert seen == ["global pre", "pre", "global post", "post"]
    close_to(out, oracle(q, k, torch.tensor([5]), "half"))
    # a forward hook that replaces the output is obeyed
    handle = rot.register_forward_hook(lambda m, args, out: (out[0] * 0, out[1]))
    try:
        assert rot(q, k, torch.tensor([5]))[0].abs().max() == 0
    finally:
        handle.remove()
    assert rot(q, k, torch.tensor([5]))[0].abs().max() > 0


def test_rotary_backward_hooks_still_run():
    rot, q, k = warm_rotary(3, torch.tensor([9]))
    grads = []
    rot.register_full_backward_hook(lambda m, grad_in, grad_out: grads.append(len(grad_out)))
    qg = q.clone().requires_grad_()
    out = rot(qg, k, torch.tensor([9]))
    out[0].sum().backward()
    assert grads == [2]


def test_rotary_under_jit_trace_and_torch_compile():
    rot, q, k = warm_rotary(4, torch.tensor([11]))
    expected = oracle(q, k, torch.tensor([11]), "half")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)    # data-dependent checks become constants
        warnings.simplefilter("ignore", DeprecationWarning)         # torch.jit.trace is deprecated, still used
        traced = torch.jit.trace(rot, (q, k, torch.tensor([11])), check_trace=False)
    close_to(traced(q, k, torch.tensor([11])), expected)
    close_to(traced(q, k, torch.tensor([3])), oracle(q, k, torch.tensor([3]), "half"))   # positions are an input
    compiled = torch.compile(rot, backend="eager", fullgraph=False)
    close_to(compiled(q, k, torch.tensor([11])), expected)
    rot.compile(backend="eager")               # module.compile(): its compiled call must be the one that runs
    assert rot._compiled_call_impl is not None
    close_to(rot(q, k, torch.tensor([11])), expected)


def test_apply_rope_qk_under_jit_trace_records_the_rotation():
    # the C kernel's writes are invisible to the tracer: under tracing the eager ops run (this used to trace
    # empty outputs, silently)
    q, k = qk(5)
    warm(apply_rope_qk, q, k, torch.tensor([4]), layout="half")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(lambda a, b, p: apply_rope_qk(a, b, p, layout="half"), (q, k, torch.tensor([4])),
                                 check_trace=False)
    for p in (4, 9):
        q2, k2 = qk(6 + p)
        close_to(traced(q2, k2, torch.tensor([p])), oracle(q2, k2, torch.tensor([p]), "half"))


def test_rotary_attribute_changes_after_warm_calls_are_obeyed():
    # the remembered calls were checked under the old attributes: setting any attribute drops them
    pos = torch.tensor([6])
    rot, q, k = warm_rotary(12, pos)
    assert rot.__dict__.get(module_mod._PLANS_TOKEN)
    rot.layout = "interleaved"
    assert not rot.__dict__.get(module_mod._PLANS_TOKEN)
    close_to(warm(rot, q, k, pos), oracle(q, k, pos, "interleaved"))


def test_rotary_copies_and_moved_buffers_after_warm_calls():
    import copy
    pos = torch.tensor([6])
    rot, q, k = warm_rotary(13, pos)
    twin = copy.deepcopy(rot)                    # its plans point at the original's table: not used
    twin.inv_freq.data.mul_(2.0)
    close_to(twin(q, k, pos), (reference_rope(q, pos, [2 * f for f in INV], "half", D),
                               reference_rope(k, pos, [2 * f for f in INV], "half", D)))
    close_to(rot(q, k, pos), oracle(q, k, pos, "half"))      # the original is untouched
    rot._apply(lambda t: t.clone())              # what module.to() does: buffers swapped without setattr
    close_to(warm(rot, q, k, pos), oracle(q, k, pos, "half"))


# ----------------------------------------------------------------------------------------------- apply_rope (one x)

def call1(mode: str, x, pos, **kwargs):
    """apply_rope in one of its three write modes; checks where the result was written."""
    if mode == "new":
        return apply_rope(x, pos, **kwargs)
    if mode == "out":
        out = torch.empty_like(x)
        result = apply_rope(x, pos, out=out, **kwargs)
        assert result is out
        return result
    x2 = x.clone()
    result = apply_rope(x2, pos, inplace=True, **kwargs)
    assert result is x2
    return result


@pytest.mark.parametrize("mode", ["new", "out", "inplace"])
def test_apply_rope_fast_path_runs_and_equals_the_general_path_bit_for_bit(mode, hits):
    x, _ = qk(21, t=3, dtype=torch.bfloat16)
    pos = torch.tensor([[5, 6, 7]])
    call1(mode, x, pos, layout="half")
    with cpu_rope.eager_only():
        general = call1(mode, x, pos + 100, layout="half")
    assert hits["n"] == 0
    fast = call1(mode, x, pos + 100, layout="half")
    assert hits["n"] == 1
    assert torch.equal(fast, general)


def test_apply_rope_and_apply_rope_qk_of_one_shape_remember_separately(hits):
    q, k = qk(22, hq=2, hk=2)
    pos = torch.tensor([[3]])
    warm(apply_rope_qk, q, k, pos)
    assert hits["n"] == 1
    xr = warm(apply_rope, q, pos)
    assert hits["n"] == 2 and torch.is_tensor(xr)
    assert_close_to_oracle(xr, reference_rope(q, pos, INV, "interleaved", D), torch.float32)


def test_apply_rope_writes_follow_the_rules_after_warm_calls(hits):
    x, _ = qk(23)
    pos = torch.tensor([[2]])
    call1("out", x, pos)
    call1("inplace", x, pos)
    out = torch.empty_like(x)
    before = out._version
    apply_rope(x, pos, out=out)
    assert out._version > before
    x2 = x.clone()
    apply_rope(x2, pos, out=x2)                  # out= the input itself: in place, as torch allows
    assert_close_to_oracle(x2, reference_rope(x, pos, INV, "interleaved", D), torch.float32)
    buf = torch.randn(1, 8, 1, D)
    with pytest.raises(RopeAliasError):
        apply_rope(buf[:, :4], pos, out=buf[:, 2:6])             # partial overlap of input and output
    xg = x.clone().requires_grad_()
    xr = apply_rope(xg, pos)
    assert xr.grad_fn is not None


def test_a_warm_rotary_saves_and_loads_whole():
    # torch.save of the module pickles its __dict__: the remembered kernel plans (ctypes) must not be in it
    import io
    import pickle
    pos = torch.tensor([6])
    rot, q, k = warm_rotary(14, pos)
    buffer = io.BytesIO()
    torch.save(rot, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    close_to(warm(loaded, q, k, pos), oracle(q, k, pos, "half"))
    close_to(pickle.loads(pickle.dumps(rot))(q, k, pos), oracle(q, k, pos, "half"))
    assert rot.__dict__.get(module_mod._PLANS_TOKEN)           # the original keeps its own
    assert loaded.__dict__.get(module_mod._PLANS_TOKEN) is not rot.__dict__[module_mod._PLANS_TOKEN]


def test_fx_tracing_sees_rotary_as_a_module_call():
    # FX records module calls through its patched nn.Module.__call__: a tracer that keeps Rotary as a leaf must
    # get a call_module node, not a trace through its body
    import torch.fx

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rot = Rotary(D, layout="half")

        def forward(self, q, k, pos):
            return self.rot(q, k, pos)

    class KeepRotary(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, Rotary) or super().is_leaf_module(m, name)

    model = Attention()
    q, k = qk(15)
    pos = torch.tensor([4])
    warm(model, q, k, pos)
    graph = KeepRotary().trace(model)
    assert [n.target for n in graph.nodes if n.op == "call_module"] == ["rot"]
    close_to(torch.fx.GraphModule(model, graph)(q, k, pos), oracle(q, k, pos, "half"))


def test_a_subclass_forward_is_what_a_call_runs():
    class Scaled(Rotary):
        def forward(self, q, k, positions):
            q, k = super().forward(q, k, positions)
            return 2 * q, k

    pos = torch.tensor([5])
    rot = Scaled(D, layout="half")
    q, k = qk(16)
    qr, kr = warm(rot, q, k, pos)
    expected = oracle(q, k, pos, "half")
    close_to((qr / 2, kr), expected)


def test_a_forward_set_on_the_instance_is_what_a_call_runs():
    # what accelerate's add_hook_to_module does: module.forward replaced by a wrapper on the instance
    pos = torch.tensor([5])
    rot, q, k = warm_rotary(17, pos)
    original = rot.forward
    rot.forward = lambda q, k, positions: tuple(2 * t for t in original(q, k, positions))
    qr, kr = warm(rot, q, k, pos)
    close_to((qr / 2, kr / 2), oracle(q, k, pos, "half"))
