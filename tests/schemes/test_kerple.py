"""The ``kerple`` scheme: -r1 log(1 + r2 |i - j|) (or -r1 |i - j|^r2) written plainly, per layer and head."""

import math

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.schemes import AttentionContext, make_scheme


@pytest.mark.parametrize("variant", ["log", "power"])
def test_bias_is_the_kernel_with_each_layers_parameters(variant):
    torch.manual_seed(0)
    s = make_scheme("kerple", d_model=32, n_heads=2, max_len=16, n_layers=2, kerple_variant=variant)
    q_pos, k_pos = torch.arange(5, 8), torch.arange(8)            # a 3-token step after 5 cached tokens
    for layer in range(2):
        r1, r2 = s.layers[layer].r1.tolist(), s.layers[layer].r2.tolist()
        got = s.bias(None, None, AttentionContext(q_pos, k_pos, layer=layer))
        for h in range(2):
            for a, i in enumerate(q_pos.tolist()):
                for j in k_pos.tolist():
                    d = abs(i - j)
                    want = -r1[h] * (math.log(1 + r2[h] * d) if variant == "log" else d ** r2[h])
                    assert got[h, a, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert not torch.equal(s.layers[0].r1, s.layers[1].r1)  # separate parameters per layer


def test_unknown_variant_names_the_option():
    with pytest.raises(ConfigError, match="kerple_variant"):
        make_scheme("kerple", d_model=32, n_heads=2, max_len=16, kerple_variant="cubic")
