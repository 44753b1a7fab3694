"""The ``t5`` scheme: its bias is transformers' own T5 bucketing (causal) looked up in the scheme's table, for
plain, cached (end-aligned) and per-row positions."""

import pytest
import torch

from posenc._internal.errors import ConfigError
from posenc.schemes import AttentionContext, make_scheme

hf_bucket = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention._relative_position_bucket


def _oracle(table, q_pos, k_pos):
    rel = k_pos[..., None, :] - q_pos[..., :, None]                       # memory - query, as T5 computes it
    buckets = hf_bucket(rel, bidirectional=False, num_buckets=table.shape[0], max_distance=128)
    return table[buckets].movedim(-1, -3)


@pytest.mark.parametrize("q_pos,k_pos", [(torch.arange(200), torch.arange(200)),
                                         (torch.arange(150, 153), torch.arange(153)),        # KV-cache step
                                         (torch.tensor([[0, 5, 9], [2, 40, 300]]),) * 2])     # per-row positions
def test_bias_is_transformers_bucket_lookup(q_pos, k_pos):
    s = make_scheme("t5", d_model=32, n_heads=4, max_len=128)
    with torch.no_grad():
        s.table.weight.copy_(torch.randn_like(s.table.weight))
    got = s.bias(None, None, AttentionContext(q_pos, k_pos))
    torch.testing.assert_close(got, _oracle(s.table.weight, q_pos, k_pos), rtol=0, atol=0)
    assert s.capabilities.biases and not s.capabilities.rotates


def test_one_table_for_every_layer_and_options_checked():
    s = make_scheme("t5", d_model=32, n_heads=4, max_len=128, n_layers=3, t5_buckets=16)
    assert s.table.weight.shape == (16, 4) and s.for_layer(2) is s
    with pytest.raises(ConfigError, match="t5_max_distance"):
        make_scheme("t5", d_model=32, n_heads=4, max_len=128, t5_max_distance=0)
