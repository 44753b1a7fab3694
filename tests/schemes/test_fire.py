"""The ``fire`` scheme: MLP(log(1 + c (i - j)) / log(1 + c max(L, i))) written plainly, per layer; the threshold
L starts at the training length."""

import math

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.schemes import AttentionContext, make_scheme


def test_bias_is_the_paper_formula_with_each_layers_mlp():
    torch.manual_seed(0)
    s = make_scheme("fire", d_model=32, n_heads=2, max_len=16, n_layers=2)
    q_pos, k_pos = torch.tensor([3, 20, 40]), torch.arange(41)
    for layer in range(2):
        f = s.layers[layer]
        c, L = f.c.item(), f.threshold.item()
        assert L == pytest.approx(16.0, rel=1e-5)                     # init threshold = training length
        got = s.bias(None, None, AttentionContext(q_pos, k_pos, layer=layer))
        for a, i in enumerate(q_pos.tolist()):
            for j in range(i + 1):
                x = math.log(1 + c * (i - j)) / math.log(1 + c * max(L, i))
                want = f.mlp(torch.tensor([[x]]))[0]
                torch.testing.assert_close(got[:, a, j], want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(s.layers[0].mlp[0].weight, s.layers[1].mlp[0].weight)


def test_options_checked():
    s = make_scheme("fire", d_model=32, n_heads=2, max_len=16, fire_threshold=64, fire_width=8)
    assert s.layers[0].threshold.item() == pytest.approx(64.0, rel=1e-5) and s.layers[0].width == 8
    with pytest.raises(ConfigError, match="fire_threshold"):
        make_scheme("fire", d_model=32, n_heads=2, max_len=16, fire_threshold=-1)
