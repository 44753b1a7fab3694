"""End to end: tiny transformers models (random weights, no download) give the same logits when their rotary
embedding is replaced by posenc's Rotary, for every scaling type, below and above the original context.

The replacement is complete: the model's rotary_emb module returns (position_ids, posenc Rotary) and the
modelling file's apply_rotary_pos_emb hands q, k to ``Rotary.forward`` (frequencies, dynamic / longrope rules,
cos/sin cache and the rotation are all posenc's). Models that were not patched keep transformers' code.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers builds the reference models; install posenc[test] to run this file")

from posenc import Rotary  # noqa: E402

transformers.logging.set_verbosity_error()

LMAX = 32       # max_position_embeddings of the tiny models
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=97, max_position_embeddings=LMAX, initializer_range=0.5,
            attn_implementation="eager")
HEAD_DIM = 16


class PosencRotaryEmbedding(torch.nn.Module):
    """Stands in for a transformers XxxRotaryEmbedding: passes the position ids and posenc's module along."""

    def __init__(self, rotary: Rotary):
        super().__init__()
        self.rotary = rotary

    def forward(self, x, position_ids):
        return position_ids, self.rotary


@pytest.fixture(autouse=True)
def posenc_apply(monkeypatch):
    """Route apply_rotary_pos_emb to posenc.Rotary when the rotary embedding is posenc's; else transformers'."""
    for name in ("llama", "phi3", "qwen2"):
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        original = module.apply_rotary_pos_emb

        def apply(q, k, cos, sin, unsqueeze_dim=1, _original=original):
            if isinstance(sin, Rotary):
                return sin(q, k, cos)      # cos holds the position ids [B, T]
            return _original(q, k, cos, sin, unsqueeze_dim)

        monkeypatch.setattr(module, "apply_rotary_pos_emb", apply)


def build(model_class, config_class, rope: dict, theta: float = 10000.0, **extra):
    config = config_class(**TINY, rope_parameters={**copy.deepcopy(rope), "rope_theta": theta}, **extra)
    torch.manual_seed(0)
    reference = model_class(config).eval()
    ours = copy.deepcopy(reference)
    ours.model.rotary_emb = PosencRotaryEmbedding(Rotary.from_config(config))
    return reference, ours


def logits(model, length: int, batch: int = 2) -> torch.Tensor:
    ids = torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def check(reference, ours, lengths, baseline=None):
    """Same frequencies and logits at each length, in order (so length-dependent state evolves identically).

    Frequencies are bit-identical. Logits (magnitude ~15 here) agree to 5e-4: transformers forms angles
    position * inv_freq in float32, posenc in float64, and the random tiny model amplifies those ~1e-6 rad
    differences; with float32 angles on both sides llama3's logits are bit-identical.
    """
    for n in lengths:
        want, got = logits(reference, n), logits(ours, n)
        hf_rope, our_rope = reference.model.rotary_emb, ours.model.rotary_emb.rotary
        torch.testing.assert_close(our_rope.inv_freq, hf_rope.inv_freq, rtol=0, atol=0)
        assert our_rope.attention_scaling == pytest.approx(hf_rope.attention_scaling, rel=1e-6)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-4)
        if baseline is not None and n > LMAX:  # the scaling really changed the model (the check can fail)
            assert (want - logits(baseline, n)).abs().max() > 1e-2


LLAMA_TYPES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "yarn_deepseek_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                             "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2},
    "yarn_attention_factor_untruncated": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                                          "attention_factor": 1.3, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "proportional": {"rope_type": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5},
}


@pytest.fixture(scope="module")
def llama_baseline():
    from transformers import LlamaConfig, LlamaForCausalLM
    return build(LlamaForCausalLM, LlamaConfig, {"rope_type": "default"})[0]


@pytest.mark.parametrize("name", sorted(LLAMA_TYPES))
def test_llama_static_types(name, llama_baseline):
    from transformers import LlamaConfig, LlamaForCausalLM
    theta = 100.0 if name == "llama3" else 10000.0  # a small base puts llama3 pairs in all three bands
    reference, ours = build(LlamaForCausalLM, LlamaConfig, LLAMA_TYPES[name], theta=theta)
    check(reference, ours, [12, LMAX + 16], baseline=None if name == "default" or theta != 1e4 else llama_baseline)


def test_llama_dynamic_grows_keeps_and_restores(llama_baseline):
    from transformers import LlamaConfig, LlamaForCausalLM
    reference, ours = build(LlamaForCausalLM, LlamaConfig, {"rope_type": "dynamic", "factor": 4.0})
    # below Lmax, grow past it, grow more, fall back between (keeps scale), == Lmax, below (restores)
    check(reference, ours, [20, 48, 64, 40, LMAX, 10, 50], baseline=llama_baseline)
    assert ours.model.rotary_emb.rotary.max_seq_len_cached == reference.model.rotary_emb.max_seq_len_cached == 50


def test_llama_static_ntk_equals_default_with_rescaled_base():
    """transformers has no static NTK type: the same model with theta' = theta * s^(d/(d-2)) is the oracle."""
    from transformers import LlamaConfig, LlamaForCausalLM
    s, d = 4.0, HEAD_DIM
    reference, ours = build(LlamaForCausalLM, LlamaConfig, {"rope_type": "default"},
                            theta=10000.0 * s ** (d / (d - 2)))
    ours.model.rotary_emb = PosencRotaryEmbedding(Rotary(d, 10000.0, rope_type="ntk", factor=s, layout="half"))
    check(reference, ours, [12, LMAX + 16])


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_phi3_longrope_switches_short_long(partial):
    from transformers import Phi3Config, Phi3ForCausalLM
    rotary = int(HEAD_DIM * partial)
    gen = torch.Generator().manual_seed(1)
    rope = {"rope_type": "longrope", "short_factor": (1 + torch.rand(rotary // 2, generator=gen)).tolist(),
            "long_factor": (1 + 7 * torch.rand(rotary // 2, generator=gen)).tolist()}
    tiny = {k: v for k, v in TINY.items()}
    config = Phi3Config(**{**tiny, "max_position_embeddings": 64}, original_max_position_embeddings=16,
                        partial_rotary_factor=partial, rope_parameters={**rope, "rope_theta": 10000.0},
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    reference = Phi3ForCausalLM(config).eval()
    ours = copy.deepcopy(reference)
    ours.model.rotary_emb = PosencRotaryEmbedding(Rotary.from_config(config))
    assert ours.model.rotary_emb.rotary.rotary_dim == rotary
    check(reference, ours, [10, 16, 17, 40, 12])   # short, == L0 (short), L0 + 1 (long), long, back to short


def test_qwen2_yarn_model():
    """A YaRN-configured model of another family (Qwen2: q/k/v biases), config in the 4.x rope_scaling form."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(**TINY, rope_theta=1e6,
                         rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    torch.manual_seed(0)
    reference = Qwen2ForCausalLM(config).eval()
    ours = copy.deepcopy(reference)
    ours.model.rotary_emb = PosencRotaryEmbedding(Rotary.from_config(config.to_dict()))
    assert ours.model.rotary_emb.rotary.attention_scaling > 1.0
    check(reference, ours, [6, 12, LMAX + 16])
