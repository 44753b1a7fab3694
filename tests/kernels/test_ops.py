"""posenc's custom ops (posenc.kernels.ops) and what they are for: torch.compile(fullgraph=True) and torch.export
of TinyLM (RoPE, ALiBi), with the eager numbers (the patched transformers Llama: tests/hf/test_patch_compile.py).

Oracles: the lesson's loops (posenc.reference, through tests/_support/posenc_oracles.py), SDPA with the
materialised ALiBi bias, and the same module run eagerly. Compiles use the "aot_eager" backend (dynamo,
AOTAutograd and functionalization, without inductor's C++ build) except one inductor test marked slow.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc._internal.errors import PosencError
from posenc.kernels import alibi_attention as alibi_module
from posenc.kernels import ops
from posenc.kernels.rope_checks import RopeAliasError
from posenc.nn.model import ModelConfig, TinyLM
from posenc.rope.apply import default_inv_freq, rope_cos_sin

from posenc_oracles import assert_close_to_oracle, reference_rope


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def table(rows: int, rotary_dim: int, dtype=torch.float32):
    return rope_cos_sin(torch.arange(rows), default_inv_freq(rotary_dim), 1.0, dtype)


def qk(dtype=torch.float32, seq=5, dim=16, requires_grad=False):
    g = torch.Generator().manual_seed(seq)
    q = torch.randn(2, 4, seq, dim, generator=g).to(dtype)
    k = torch.randn(2, 2, seq, dim, generator=g).to(dtype)
    return q.requires_grad_(requires_grad), k.requires_grad_(requires_grad)


# ------------------------------------------------------------------------------------------ the ops themselves

CASES = [  # (layout, rotary_dim, indexed table?, dtype)
    ("half", 16, True, torch.float32),
    ("interleaved", 8, False, torch.float32),
    ("half", 12, True, torch.bfloat16),
    ("interleaved", 16, True, torch.float64),
]


def op_args(layout, rotary_dim, indexed, dtype, requires_grad=False):
    q, k = qk(dtype, requires_grad=requires_grad)
    math = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = table(12, rotary_dim, math)
    positions = torch.arange(3, 8)
    if indexed:
        return q, k, cos, sin, positions, layout, rotary_dim, False
    return q, k, cos[3:8], sin[3:8], None, layout, rotary_dim, False


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{'index' if c[2] else 'table'}-{c[3]}")
def test_opcheck_every_rope_op(case):
    args = op_args(*case)
    q, k, rest = args[0], args[1], args[2:]
    torch.library.opcheck(ops.rope_qk, args)
    torch.library.opcheck(ops.rope, (q, *rest))
    torch.library.opcheck(ops.rope_qk_, (q.clone(), k.clone(), *rest))
    torch.library.opcheck(ops.rope_, (q.clone(), *rest))
    torch.library.opcheck(ops.rope_out, (q, *rest, torch.empty_like(q)))
    torch.library.opcheck(ops.rope_qk_out, (q, k, *rest, torch.empty_like(q), torch.empty_like(k)))
    if case[3] != torch.bfloat16:     # autograd registration (backward through the op itself)
        qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
        torch.library.opcheck(ops.rope_qk, (qg, kg, *rest))
        torch.library.opcheck(ops.rope, (qg, *rest))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_rope_ops_match_the_lessons_loops(case):
    layout, rotary_dim, _, dtype = case
    q, k, *rest = op_args(*case)
    positions = torch.arange(3, 8)
    inv = default_inv_freq(rotary_dim).tolist()
    ref_q = reference_rope(q, positions, inv, layout, rotary_dim)
    ref_k = reference_rope(k, positions, inv, layout, rotary_dim)
    out_q, out_k = ops.rope_qk(q, k, *rest)
    assert_close_to_oracle(out_q, ref_q, dtype)
    assert_close_to_oracle(out_k, ref_k, dtype)
    assert_close_to_oracle(ops.rope(q, *rest), ref_q, dtype)
    q2, k2 = q.clone(), k.clone()
    ops.rope_qk_(q2, k2, *rest)
    assert_close_to_oracle(q2, ref_q, dtype)
    assert_close_to_oracle(k2, ref_k, dtype)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    ops.rope_qk_out(q, k, *rest, qo, ko)
    assert_close_to_oracle(ko, ref_k, dtype)
    inverse = ops.rope(q, *rest[:-1], True)
    assert_close_to_oracle(inverse, reference_rope(q, positions, inv, layout, rotary_dim, inverse=True), dtype)


def test_schemas_declare_what_they_write():
    def schema(op):
        return getattr(op, "_opoverload", op)._schema       # a custom_op's definition, or an OpOverload

    def written(op):
        return {a.name for a in schema(op).arguments if a.alias_info is not None and a.alias_info.is_write}

    assert written(ops.rope) == written(ops.rope_qk) == set()
    assert written(ops.rope_) == {"x"}
    assert written(ops.rope_qk_) == {"q", "k"}
    assert written(ops.rope_out) == {"out"}
    assert written(ops.rope_qk_out) == {"q_out", "k_out"}
    assert written(alibi_module.alibi_attention_op) == written(alibi_module.alibi_attention_backward_op) == set()
    for op in (ops.rope_, ops.rope_qk_, ops.rope_out, ops.rope_qk_out):
        assert len(schema(op).returns) == 0     # nothing returned that aliases an input


def test_mutating_ops_bump_versions_and_refuse_overlap():
    q, k, *rest = op_args("half", 16, True, torch.float32)
    v = q._version
    ops.rope_qk_(q, k, *rest)
    assert q._version > v and k._version > v
    qo = torch.empty_like(q)
    v = qo._version
    ops.rope_out(q, *rest, qo)
    assert qo._version > v
    with pytest.raises(RopeAliasError):
        ops.rope_qk_(q, q, *rest)                        # one buffer written twice
    with pytest.raises(RopeAliasError):
        ops.rope_out(q, *rest, q[:, :, :1].expand_as(q))   # an expanded output
    with pytest.raises(PosencError, match="rotary_dim"):
        ops.rope(q, rest[0], rest[1], rest[2], "half", 7, False)


def test_rope_op_gradients_and_second_order():
    q, k, cos, sin, index, layout, rotary_dim, inverse = op_args("interleaved", 12, True, torch.float64,
                                                                 requires_grad=True)
    q, k = q[:1, :2, :3], k[:1, :1, :3]
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    index = index[:3]
    torch.autograd.gradcheck(lambda a, b: ops.rope_qk(a, b, cos, sin, index, layout, rotary_dim, False), (q, k))
    torch.autograd.gradgradcheck(lambda a, b: ops.rope_qk(a, b, cos, sin, index, layout, rotary_dim, False), (q, k))
    torch.autograd.gradcheck(lambda a: ops.rope(a, cos, sin, index, layout, rotary_dim, False), (q,))
    # only one output used: the other's gradient is zero, and q's is the inverse rotation
    out_q, _ = ops.rope_qk(q, k, cos, sin, index, layout, rotary_dim, False)
    gq, gk = torch.autograd.grad(out_q.sum(), (q, k), allow_unused=True)
    assert gk is None or not bool(gk.any())
    ones = torch.ones_like(q)
    assert torch.allclose(gq, ops.rope(ones.detach(), cos, sin, index, layout, rotary_dim, True))


def test_cuda_kernel_body_through_the_triton_interpreter(monkeypatch):
    """The CUDA implementation's backend (Triton) on CPU tensors through triton's interpreter."""
    pytest.importorskip("triton")
    from posenc.kernels import triton_rope
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_rope.available()
    q, k, cos, sin, index, layout, rotary_dim, _ = op_args("half", 16, True, torch.float32)
    outs = [torch.empty_like(q), torch.empty_like(k)]
    ops._DEVICE_BACKENDS["cuda"]((q, k), outs, cos, sin, index, layout, rotary_dim, False)
    inv = default_inv_freq(rotary_dim).tolist()
    assert_close_to_oracle(outs[0], reference_rope(q, torch.arange(3, 8), inv, layout, rotary_dim), torch.float32)
    assert_close_to_oracle(outs[1], reference_rope(k, torch.arange(3, 8), inv, layout, rotary_dim), torch.float32)


# ---------------------------------------------------------------------------------------------------- ALiBi op

def alibi_oracle(q, k, v, slopes, causal, offset):
    """SDPA with the materialised bias and mask (the textbook form)."""
    Tq, Tk = q.shape[2], k.shape[2]
    d = (torch.arange(Tq)[:, None] + offset - torch.arange(Tk)[None, :]).double()
    bias = -slopes.double()[:, None, None] * d.abs()
    if causal:
        bias = bias.masked_fill(d < 0, float("-inf"))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q.double(), kk.double(), vv.double(), attn_mask=bias[None])


@pytest.mark.parametrize("causal,offset", [(True, 0), (True, 3), (False, 2)])
def test_alibi_op_opcheck_forward_and_gradients(causal, offset):
    g = torch.Generator().manual_seed(offset)
    q = torch.randn(1, 4, 5, 8, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 5 + offset, 8, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 5 + offset, 8, generator=g, requires_grad=True)
    slopes = posenc.alibi_slopes(4).requires_grad_()
    torch.library.opcheck(alibi_module.alibi_attention_op, (q, k, v, slopes, causal, offset, None, None, "auto"))
    out = alibi_module.alibi_attention_op(q, k, v, slopes, causal, offset, None, None, "auto")
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, slopes)]
    ref = alibi_oracle(*leaves, causal, offset)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v, slopes))
    ref_grads = torch.autograd.grad((ref * w.double()).sum(), leaves)
    for got, want in zip(grads, ref_grads):
        assert torch.allclose(got.double(), want, atol=1e-4), (got - want).abs().max()


# -------------------------------------------------------------------------------------- routes: eager vs traced

def test_eager_calls_take_the_direct_paths_not_the_ops(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through the custom ops")

    monkeypatch.setattr(ops, "rope_traced", refuse)
    monkeypatch.setattr("posenc.rope.module.rope_traced", refuse)
    monkeypatch.setattr("posenc.rope.apply._apply_traced", refuse)
    monkeypatch.setattr(alibi_module, "alibi_attention_op", refuse)
    q, k = qk()
    rot = posenc.Rotary(16)
    for _ in range(3):       # warm calls included: the decode fast paths
        posenc.apply_rope_qk(q, k, torch.arange(5))
        posenc.apply_rope(q, torch.arange(5), inplace=False)
        rot(q, k, torch.arange(5))
        posenc.apply_rope_table(q, *table(8, 16), index=torch.arange(5))
    posenc.alibi_attention(q, k, k)


def test_compiled_apply_rope_inplace_and_out_forms():
    q, k = qk()
    positions = torch.arange(2, 7)

    def fresh(q, k, p):
        return posenc.apply_rope_qk(q, k, p, layout="half")

    def inplace(q, k, p):
        posenc.apply_rope_qk(q, k, p, layout="half", inplace=True)
        return q * 1, k * 1

    def into(q, k, p, qo, ko):
        posenc.apply_rope_qk(q, k, p, layout="half", out=(qo, ko))
        return qo + 0, ko + 0

    def single(x, p):
        return posenc.apply_rope(x, p, rotary_dim=8) + posenc.apply_rope(x, p, base=500.0, attention_scaling=0.5)

    ref = fresh(q, k, positions)
    got = torch.compile(fresh, backend="aot_eager", fullgraph=True)(q, k, positions)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    q2, k2 = q.clone(), k.clone()
    got = torch.compile(inplace, backend="aot_eager", fullgraph=True)(q2, k2, positions)
    assert torch.equal(q2, ref[0]) and torch.equal(k2, ref[1]) and torch.equal(got[0], ref[0])
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    torch.compile(into, backend="aot_eager", fullgraph=True)(q, k, positions, qo, ko)
    assert torch.equal(qo, ref[0]) and torch.equal(ko, ref[1])
    assert torch.allclose(torch.compile(single, backend="aot_eager", fullgraph=True)(q, positions),
                          single(q, positions), atol=1e-6)


def test_compiled_inplace_with_autograd_and_out_refused():
    q, k = qk(requires_grad=True)
    positions = torch.arange(5)

    def inplace(q, k):
        a, b = q * 2, k * 2
        posenc.apply_rope_qk(a, b, positions, layout="half", inplace=True)
        return (a * b[:, :1]).sum()

    grads = torch.autograd.grad(inplace(q, k), (q, k))
    compiled = torch.autograd.grad(torch.compile(inplace, backend="aot_eager", fullgraph=True)(q, k), (q, k))
    for a, b in zip(compiled, grads):
        assert torch.allclose(a, b, atol=1e-6)

    def out_with_grad(q, k):
        return posenc.apply_rope_qk(q, k, positions, out=(torch.empty_like(q), torch.empty_like(k)))

    with pytest.raises(Exception, match="out= does not support automatic differentiation"):
        torch.compile(out_with_grad, backend="aot_eager", fullgraph=True)(q, k)


# ----------------------------------------------------------------------------------------- models: compile, export

def tiny_lm(scheme: str) -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=4, max_len=64))


def train_step(model, tokens):
    model.zero_grad()
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same_step(got, want, atol):
    assert torch.allclose(got[0], want[0], atol=atol), (got[0] - want[0]).abs().max()
    for a, b in zip(got[1], want[1]):
        assert torch.allclose(a, b, atol=atol), (a - b).abs().max()


@pytest.mark.parametrize("scheme", ["rope", "alibi", "rope+alibi"])
def test_tinylm_compiles_fullgraph_with_the_eager_numbers(scheme):
    model = tiny_lm(scheme)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    want = train_step(model, tokens)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    assert_same_step(train_step(compiled, tokens), want, atol=1e-6)
    with torch.no_grad():            # another length: a recompile (dynamic shapes), same numbers
        assert torch.allclose(compiled(tokens[:, :5]), model(tokens[:, :5]), atol=1e-6)


@pytest.mark.parametrize("scheme", ["rope", "rope+alibi"])
def test_tinylm_kv_cache_decoding_compiles_fullgraph(scheme):
    """Prefill then single-token steps with a KV cache (keys at their own positions: Rotary.cos_sin's route)."""
    model = tiny_lm(scheme).eval()
    tokens = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(6))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        caches = model.new_cache(), model.new_cache()
        for chunk in (tokens[:, :6], tokens[:, 6:7], tokens[:, 7:8]):
            want = model(chunk, caches[0])
            assert torch.allclose(compiled(chunk, caches[1]), want, atol=1e-6)


@pytest.mark.slow
def test_tinylm_inductor_cpu_compile_matches_eager():
    model = tiny_lm("rope")
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    want = train_step(model, tokens)
    assert_same_step(train_step(torch.compile(model, fullgraph=True), tokens), want, atol=1e-5)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_tinylm_exports(scheme):
    model = tiny_lm(scheme).eval()
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    program = torch.export.export(model, (tokens,))
    with torch.no_grad():
        assert torch.allclose(program.module()(tokens), model(tokens), atol=1e-6)
    targets = {str(n.target) for n in program.graph.nodes}
    assert ("posenc.rope_qk.default" in targets) == (scheme == "rope")


class AlibiBlock(torch.nn.Module):
    """q, k, v projections and posenc.alibi_attention: the ALiBi op inside a module."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(32, 3 * 32)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return posenc.alibi_attention(q, k, v, causal=True).transpose(1, 2).reshape(B, T, 32)


def test_alibi_attention_compiles_and_exports():
    block = AlibiBlock()
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(4))
    out = block(x)
    grads = torch.autograd.grad(out.square().sum(), list(block.parameters()))
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    out_c = compiled(x)
    assert torch.allclose(out_c, out, atol=1e-6)
    for a, b in zip(torch.autograd.grad(out_c.square().sum(), list(block.parameters())), grads):
        assert torch.allclose(a, b, atol=1e-5)
    program = torch.export.export(block, (x,))
    assert "posenc.alibi_attention.default" in {str(n.target) for n in program.graph.nodes}
    assert torch.allclose(program.module()(x), out, atol=1e-6)


def test_rotary_compiles_fullgraph_per_row_positions():
    rot = posenc.Rotary(16, layout="half")
    q, k = qk()
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    want = rot(q, k, positions)
    got = torch.compile(rot, backend="aot_eager", fullgraph=True)(q, k, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ops_and_compiled_tinylm_match_the_cpu():
    q, k, cos, sin, index, layout, rotary_dim, _ = op_args("half", 16, True, torch.float32)
    cuda = [t.cuda() for t in (q, k, cos, sin, index)]
    torch.library.opcheck(ops.rope_qk, (*cuda, layout, rotary_dim, False))
    got = ops.rope_qk(*cuda, layout, rotary_dim, False)
    want = ops.rope_qk(q, k, cos, sin, index, layout, rotary_dim, False)
    assert torch.allclose(got[0].cpu(), want[0], atol=1e-5) and torch.allclose(got[1].cpu(), want[1], atol=1e-5)
    model = tiny_lm("rope")
    tokens = torch.randint(0, 256, (2, 12))
    want = train_step(model, tokens)
    model = model.cuda()
    got = train_step(torch.compile(model, fullgraph=True), tokens.cuda())
    assert_same_step((got[0].cpu(), [g.cpu() for g in got[1]]), want, atol=1e-4)
