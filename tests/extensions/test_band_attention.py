"""The band kernel of sliding-window (local) layers: equal to the plain-loop oracle of a window (LM-Infinite with no
global tokens and its ceiling at the window is exactly that rule), with GQA, odd lengths, a KV-cache offset and
non-contiguous inputs, and reading only the keys inside the window."""

from __future__ import annotations

import pytest
import torch

from posenc.attention import kernel, reference
from posenc.attention.kernel import band_attention
from posenc.attention.methods import LMInfinite
from posenc.rope.apply import default_inv_freq


def qkv(T, Hq, Hk, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, T, D, generator=g, dtype=dtype) for h in (Hq, Hk, Hk))


def window_oracle(q, k, v, window, inv_freq, attention_scaling):
    """The plain-loop oracle per head (GQA: h -> h // (Hq / Hk)) of LM-Infinite with no global tokens and its ceiling
    at the window: query i sees keys i - window < j <= i at their true distance, which is the band."""
    rule = LMInfinite(n_global=0, n_local=window, ceiling=window)
    g = q.shape[1] // k.shape[1]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    for h in range(q.shape[1]):
        out[0, h] = torch.tensor(reference.attention(q[0, h].tolist(), k[0, h // g].tolist(), v[0, h // g].tolist(),
                                                     rule, inv_freq.tolist(), attention_scaling=attention_scaling),
                                 dtype=torch.float64)
    return out


@pytest.mark.parametrize("T, window, heads, past", [(23, 5, (4, 2), 0), (31, 8, (6, 2), 0), (17, 4, (3, 3), 6),
                                                    (9, 12, (4, 1), 0)])
def test_band_equals_the_window_oracle(T, window, heads, past):
    q, k, v = qkv(T + past, Hq=heads[0], Hk=heads[1], D=8, seed=T)
    q = q[:, :, past:]                                  # after a KV cache: queries are the last T keys
    inv = default_inv_freq(8, 100.0).double()
    want = window_oracle(q, k, v, window, inv, 1.1)
    got = band_attention(q, k, v, window, inv, attention_scaling=1.1, block=8)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # float32 through torch's CPU flash pieces, from non-contiguous views (heads and time swapped in memory)
    q32, k32, v32 = (x.float().transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not q32.is_contiguous()
    got32 = band_attention(q32, k32, v32, window, inv.float(), attention_scaling=1.1, block=8)
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-5)
    got16 = band_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), window, inv.float(), attention_scaling=1.1,
                           block=8)                  # bf16: within bf16 rounding (inputs and output rounded)
    torch.testing.assert_close(got16.double(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype, piece", [(torch.float32, "_flash_band"), (torch.float64, "_piece")])
def test_band_reads_only_the_keys_inside_the_window(monkeypatch, dtype, piece):
    """float32: one flash call per block over its window plus the block; float64 (rule_attention's pieces): the
    same keys in pieces. Never the T keys of the square."""
    widths = []
    original = getattr(kernel, piece)

    def spy(q, k, v, mask, scale):
        widths.append(k.shape[-2])
        return original(q, k, v, mask, scale)

    monkeypatch.setattr(kernel, piece, spy)
    q, k, v = qkv(200, Hq=4, Hk=2, D=8, dtype=dtype)
    band_attention(q, k, v, 16, default_inv_freq(8, 100.0).to(dtype), block=16)   # 8 positions x 2 heads a block
    assert widths and max(widths) <= 16 + 8 - 1 and sum(widths) <= (200 / 8) * (16 + 8)
    if dtype == torch.float32:
        assert len(widths) == 200 // 8             # one call per block, no pieces to merge


def test_band_refuses_an_empty_window():
    from posenc._internal.errors import PosencError

    q, k, v = qkv(5, Hq=2, Hk=1, dtype=torch.float32)
    with pytest.raises(PosencError, match="window"):
        band_attention(q, k, v, 0, default_inv_freq(8, 100.0))
