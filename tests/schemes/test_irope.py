"""The ``irope`` scheme: Llama 4's schedule (layer l NoPE iff (l + 1) % k == 0), RoPE layers equal to the rope
scheme, NoPE layers scale q by 1 + attn_scale log(1 + floor((n + 1) / floor_scale)) and leave k alone; KV-cache
decoding equals a full forward with a NoPE layer present."""

import math

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import AttentionContext, make_scheme


def test_layers_follow_the_schedule_and_the_temperature_formula():
    s = make_scheme("irope", d_model=32, n_heads=2, max_len=8, n_layers=6, nope_every=3)
    rope = make_scheme("rope", d_model=32, n_heads=2, max_len=8)
    q, k = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    pos = torch.arange(20)
    c = AttentionContext(pos, pos)
    for layer in range(6):
        view = s.for_layer(layer)
        got_q, got_k = view.rotate_qk(q, k, c)
        if (layer + 1) % 3:
            want = rope.rotate_qk(q, k, c)
            torch.testing.assert_close((got_q, got_k), want)
        else:
            tau = torch.tensor([1 + 0.1 * math.log(1 + math.floor((n + 1) / 8)) for n in range(20)])
            torch.testing.assert_close(got_q, q * tau[:, None])
            assert torch.equal(got_k, k)
    assert s.capabilities.extendable                    # the RoPE layers take extension methods


def test_floor_scale_defaults_to_the_training_length():
    s = make_scheme("irope", d_model=32, n_heads=2, max_len=128, n_layers=4)
    assert s.for_layer(3).floor_scale == 128 and s.for_layer(3).attn_scale == 0.1
    assert [s.for_layer(i) is s for i in range(4)] == [True, True, True, False]
    for bad in (-1, 4, 1.0):
        with pytest.raises(ConfigError, match="layer must be an integer"):
            s.for_layer(bad)


def test_kv_cache_decoding_equals_full_forward_with_a_nope_layer():
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="irope", d_model=32, n_layers=2, n_heads=2, max_len=8,
                               scheme_options={"nope_every": 2})).eval()
    tokens = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :5], cache)] + [model(tokens[:, t:t + 1], cache) for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
