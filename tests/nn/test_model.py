"""The tiny decoder LM: config validation, shapes, tied head, shared init across schemes, greedy generation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from posenc._internal.errors import ConfigError
from posenc.nn.model import LayerNorm, ModelConfig, TinyLM


def test_forward_shape_and_tied_head():
    model = TinyLM(ModelConfig(scheme="rope", d_model=32, n_layers=2, n_heads=4, max_len=16))
    logits = model(torch.randint(0, 256, (3, 11)))
    assert logits.shape == (3, 11, 256) and logits.dtype == torch.float32
    assert "lm_head.weight" not in model.state_dict()  # tied to tok_emb, stored once
    h = model.ln_f(torch.randn(5, 32))
    torch.testing.assert_close(torch.nn.functional.linear(h, model.tok_emb.weight), h @ model.tok_emb.weight.T)


@pytest.mark.parametrize("bad,match", [(dict(scheme="t6"), "scheme"), (dict(d_model=30, n_heads=4), "d_model"),
                                       (dict(n_layers=0), "n_layers"), (dict(max_len=0), "max_len"),
                                       (dict(n_heads=True), "n_heads"), (dict(rope_layout="x"), "rope_layout"),
                                       (dict(scheme_options=[1]), "scheme_options"), (dict(bias="no"), "bias")])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**bad)


def test_every_scheme_starts_from_the_same_shared_weights():
    """Same seed -> identical embedding/attention/MLP init whatever the scheme (the scheme is built last)."""
    states = []
    for scheme in ("nope", "learned", "rope", "alibi"):
        torch.manual_seed(0)
        states.append(TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=1, n_heads=2, max_len=8)).state_dict())
    shared = [k for k in states[0] if all(k in s for s in states)]
    assert "tok_emb.weight" in shared and len(shared) == len(states[0])
    for s in states[1:]:
        for k in shared:
            assert torch.equal(s[k], states[0][k]), k


def test_learned_model_refuses_lengths_past_its_table():
    model = TinyLM(ModelConfig(scheme="learned", d_model=32, n_layers=1, n_heads=2, max_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ConfigError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_generate_with_cache_equals_greedy_full_forwards(scheme):
    torch.manual_seed(4)
    model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=2, max_len=64)).eval()
    prompt = torch.randint(0, 256, (2, 9))
    seq = prompt
    with torch.no_grad():
        for _ in range(6):  # oracle: no cache, one full forward per token
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(model.generate(prompt, 6), seq[:, 9:])


def test_layer_norm_matches_torch_and_keeps_its_parameters():
    torch.manual_seed(0)
    ours, ref = LayerNorm(24), torch.nn.LayerNorm(24)
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())  # same names and shapes
    x = torch.randn(5, 7, 24, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    g = torch.randn(5, 7, 24)
    ours(x).backward(g)
    ref(x2).backward(g)
    torch.testing.assert_close(ours(x), ref(x2))
    for a, b in ((x.grad, x2.grad), (ours.weight.grad, ref.weight.grad), (ours.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _train_hash(scheme: str, threads: int, precision: str = "fp32") -> list[torch.Tensor]:
    from posenc.lab.precision import autocast
    from posenc.lab.train import TrainSettings, make_optimizer, train_step

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        model = TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=4, max_len=64)).train()
        settings = TrainSettings(steps=3, warmup=1)
        opt = make_optimizer(model, settings)
        gen = torch.Generator().manual_seed(1)
        for step in range(3):
            window = torch.randint(0, 256, (8, 65), generator=gen)
            train_step(model, model, opt, (window[:, :-1], window[:, 1:]), step, settings, precision=precision)
        with torch.no_grad(), autocast(precision):  # evaluation too: a forward over 16 windows of 64
            logits = model.eval()(torch.randint(0, 256, (16, 64), generator=gen)).float()
        return [p.detach().clone() for p in model.parameters()] + [logits]
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("scheme,precision", [("rope", "fp32"), ("alibi", "fp32"), ("rope", "bf16")])
def test_training_is_bit_identical_at_one_and_two_threads(scheme, precision):
    """The lab's auto thread count depends on the machine's load; results must not (torch's fused layer-norm
    backward alone made 1 and 2 threads differ). Weights after training and the logits of a forward."""
    for a, b in zip(_train_hash(scheme, 1, precision), _train_hash(scheme, 2, precision)):
        assert torch.equal(a, b)


def test_flops_per_token_counts_the_matmuls():
    """Linear layers and head against torch's FLOP counter (forward, and forward + backward = 3x); causal
    attention against a per-query count of the keys each query reads."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = ModelConfig(scheme="rope", d_model=32, n_layers=2, n_heads=4, max_len=16)
    model, (B, T) = TinyLM(cfg), (3, 16)
    attention = cfg.n_layers * 2 * 2 * cfg.d_model * sum(i + 1 for i in range(T))  # q.k and p.v, keys <= query
    tokens = torch.randint(0, 256, (B, T))
    with FlopCounterMode(display=False) as fwd:  # counts mm/addmm; the fused CPU attention is not counted
        model(tokens)
    assert cfg.flops_per_token(T, training=False) * B * T == fwd.get_total_flops() + B * attention
    with FlopCounterMode(display=False) as both:
        model(tokens).sum().backward()
    assert both.get_total_flops() == 3 * fwd.get_total_flops()
    assert cfg.flops_per_token(T, training=True) == 3 * cfg.flops_per_token(T, training=False)


class _BlockBeforeTheBiasOption(nn.Module):
    """The lab block as it was built before ModelConfig.bias existed (the oracle for the default draws)."""

    def __init__(self, cfg, layer_idx):
        from posenc.nn.attention import CausalSelfAttention

        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, layer_idx)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model))


def _parameters_before_the_bias_option(cfg, seed):
    """The construction sequence of TinyLM before the option: modules in order, GPT-2 init, the scheme last."""
    from posenc.schemes import make_scheme

    torch.manual_seed(seed)
    m = nn.Module()
    m.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
    m.blocks = nn.ModuleList(_BlockBeforeTheBiasOption(cfg, i) for i in range(cfg.n_layers))
    m.ln_f = nn.LayerNorm(cfg.d_model)
    for name, p in m.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
    m.scheme = make_scheme(cfg.scheme, **cfg.scheme_arguments())
    return m.state_dict()


@pytest.mark.parametrize("scheme", ["rope", "learned", "alibi"])
def test_default_model_draws_the_same_parameters_as_before_the_bias_option(scheme):
    cfg = ModelConfig(scheme=scheme)  # the default preset's shape
    want = _parameters_before_the_bias_option(cfg, seed=3)
    torch.manual_seed(3)
    got = TinyLM(cfg).state_dict()
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert "bias" not in cfg.to_dict()  # checkpoints and run settings of default models stay as they were


def test_bias_free_model_is_mpts_block():
    cfg = ModelConfig(scheme="alibi", d_model=32, n_layers=2, n_heads=2, max_len=16, bias=False)
    model = TinyLM(cfg)
    assert not [k for k in model.state_dict() if k.endswith("bias")]
    assert cfg.to_dict()["bias"] is False and ModelConfig(**cfg.to_dict()) == cfg
    # the same as a biased model whose biases are zero (its other weights copied): only the biases are gone
    torch.manual_seed(0)
    ref = TinyLM(ModelConfig(scheme="alibi", d_model=32, n_layers=2, n_heads=2, max_len=16))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(model.state_dict()[name] if name in model.state_dict() else torch.zeros_like(p))
        x = torch.randint(0, 256, (2, 12))
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
