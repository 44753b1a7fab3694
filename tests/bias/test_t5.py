"""T5 relative bias against transformers' own bucket function and its T5Attention.compute_bias."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.bias.positions import end_aligned_positions
from posenc.bias.t5 import T5RelativeBias, t5_bias, t5_relative_bucket
from posenc._internal.errors import PosencError

modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
hf_bucket = modeling_t5.T5Attention._relative_position_bucket


@settings(max_examples=80, deadline=None)
@given(bidirectional=st.booleans(), num_buckets=st.integers(4, 64), max_distance=st.integers(33, 4096),
       values=st.lists(st.integers(-(2**31) + 1, 2**31 - 1) | st.integers(-300, 300), min_size=1, max_size=64))
def test_bucket_equals_transformers(bidirectional, num_buckets, max_distance, values):
    r = torch.tensor(values)
    got = t5_relative_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    want = hf_bucket(r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


def test_bucket_dense_range_and_t5_defaults():
    r = torch.arange(-5000, 5001)
    for bidirectional in (True, False):
        got = t5_relative_bucket(r, bidirectional=bidirectional)
        assert torch.equal(got, hf_bucket(r, bidirectional=bidirectional))
        assert int(got.min()) >= 0 and int(got.max()) <= 31
    causal = t5_relative_bucket(r, bidirectional=False)
    # causal: keys after the query share bucket 0; distances 0..15 exact; buckets grow with the distance and
    # every distance >= max_distance lands in the last one
    assert (causal[r > 0] == 0).all()
    assert causal[5000 - torch.arange(16)].tolist() == list(range(16))
    by_distance = causal[r <= 0].flip(0)
    assert (by_distance[1:] >= by_distance[:-1]).all()
    assert (causal[r <= -128] == 31).all() and (causal[r > -100] < 31).all()


def test_bias_matches_compute_bias_with_cache_offset():
    config = modeling_t5.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=12,
                                  relative_attention_max_distance=20, is_decoder=True)
    attn = modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    module = T5RelativeBias(3, num_buckets=12, max_distance=20, bidirectional=False)
    with torch.no_grad():
        module.weight.copy_(attn.relative_attention_bias.weight)
    for q_len, k_len in ((40, 40), (1, 40), (7, 33)):
        past = k_len - q_len
        want = attn.compute_bias(q_len, k_len, past_seen_tokens=past)[0]                # [H, q, k]
        got = module(*end_aligned_positions(q_len, k_len))
        assert got.shape == (3, q_len, k_len)
        assert torch.equal(got, want)


def test_decoding_row_equals_full_forward_row_and_batched_positions():
    torch.manual_seed(0)
    module = T5RelativeBias(4)
    full = module(*end_aligned_positions(50))
    for t in (1, 17, 49):
        q, k = end_aligned_positions(1, t + 1)
        assert torch.equal(module(q, k)[:, 0], full[:, t, : t + 1])
    # a batch of position rows (randomized positions) gives one bias per row
    pos = torch.tensor([[0, 3, 9, 200], [5, 6, 7, 8]])
    batched = module(pos, pos)
    assert batched.shape == (2, 4, 4, 4)
    for b in range(2):
        assert torch.equal(batched[b], module(pos[b], pos[b]))
    # only the relative position matters
    assert torch.equal(module(pos + 1000, pos + 1000), batched)


def test_table_lookup_is_the_plain_loop():
    table = torch.randn(32, 2, dtype=torch.float64)
    q, k = torch.tensor([0, 5, 300]), torch.tensor([0, 2, 5, 140, 299, 300])
    got = t5_bias(table, q, k)
    for h in range(2):
        for a, i in enumerate(q.tolist()):
            for b, j in enumerate(k.tolist()):
                bucket = int(hf_bucket(torch.tensor(j - i), bidirectional=False))
                assert got[h, a, b] == table[bucket, h]


@pytest.mark.parametrize("call, match", [
    (lambda: t5_relative_bucket(torch.tensor([1.5]), bidirectional=True), "relative_position must be an integer"),
    (lambda: t5_relative_bucket(torch.tensor([1]), bidirectional=1), "bidirectional must be True or False"),
    (lambda: t5_relative_bucket(torch.tensor([1]), bidirectional=True, num_buckets=2), "num_buckets must be >= 4"),
    (lambda: t5_relative_bucket(torch.tensor([1]), bidirectional=False, max_distance=8), "max_distance must exceed"),
    (lambda: t5_bias(torch.zeros(32), [0], [0]), r"table must be a tensor \[num_buckets, n_heads\]"),
    (lambda: t5_bias(torch.zeros(32, 2), torch.tensor([0.5]), [0]), "query_positions must be integers"),
    (lambda: T5RelativeBias(0), "n_heads must be a positive integer"),
    (lambda: T5RelativeBias(2)(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long)),
     "must share their leading"),
])
def test_bad_input(call, match):
    with pytest.raises(PosencError, match=match):
        call()
