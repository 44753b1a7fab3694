"""The 2025-26 lesson schemes: resonance-rope and hope against the lesson's RoPE loop with the paper's frequencies,
rnope-swa's band, layer schedule and log-length scale against closed forms and a model whose answer must not move."""

import math

import pytest
import torch

from posenc import reference
from posenc._internal.errors import ConfigError
from posenc.nn.model import ModelConfig, TinyLM
from posenc.schemes import AttentionContext, make_scheme


def _loop_rotation(q: torch.Tensor, positions, inv_freq: list[float]) -> torch.Tensor:
    """The lesson's half-layout loop on each row of q [T, D] at its position."""
    return torch.tensor([reference.apply_rope_half(q[t].tolist(), float(p), inv_freq=inv_freq)
                         for t, p in enumerate(positions)], dtype=torch.float64)


def test_resonance_rope_is_the_loop_with_integer_wavelengths():
    s = make_scheme("resonance-rope", d_model=64, n_heads=4, max_len=128)     # head dim 16
    q, k = torch.randn(1, 4, 6, 16, dtype=torch.float64), torch.randn(1, 4, 6, 16, dtype=torch.float64)
    pos = torch.arange(300, 306)
    got_q, _ = s.rotate_qk(q, k, AttentionContext(pos, pos))
    inv = [2 * math.pi / round(2 * math.pi * 10000.0 ** (2 * j / 16)) for j in range(8)]
    # angles are float32 (posenc's rule): at n ~ 300 on pair 0 they carry ~2e-5 rad of rounding
    torch.testing.assert_close(got_q[0, 2], _loop_rotation(q[0, 2], pos.tolist(), inv), rtol=0, atol=1e-4)


def test_resonance_rope_extends_with_yarn_only():
    s = make_scheme("resonance-rope", d_model=64, n_heads=4, max_len=128)
    s.set_rope_scaling({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, 512)
    assert s.rope_type == "resonance" and s.describe() == "resonance-rope (Resonance YaRN)"
    wavelengths = 2 * math.pi / s.rotary.inv_freq.double()
    torch.testing.assert_close(wavelengths, wavelengths.round(), rtol=1e-6, atol=0)
    with pytest.raises(ConfigError, match="extends with yarn only"):
        s.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
    s.set_rope_scaling(None)
    assert s.describe() == "resonance-rope"


@pytest.mark.parametrize("max_len, kept", [(128, 3), (16, 1), (600, 4), (700, 5), (70_000, 8)])
def test_hope_rotates_the_pairs_with_a_full_turn_inside_the_training_length(max_len, kept):
    """head dim 16, base 10^4: wavelengths 6.3, 19.9, 62.8, 198.7, 628, ... ; the rest pass through unrotated."""
    s = make_scheme("hope", d_model=64, n_heads=4, max_len=max_len)
    assert s.kept == kept and s.describe() == f"hope ({kept} of 8 pairs rotate)"
    q = torch.randn(1, 1, 5, 16, dtype=torch.float64)
    pos = torch.arange(40, 45)
    got, _ = s.rotate_qk(q, q.clone(), AttentionContext(pos, pos))
    inv = [1.0 / 10000.0 ** (2 * j / 16) if j < kept else 0.0 for j in range(8)]
    torch.testing.assert_close(got[0, 0], _loop_rotation(q[0, 0], pos.tolist(), inv), rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="no pair of head_dim 16 completes a turn"):
        make_scheme("hope", d_model=64, n_heads=4, max_len=6)


def test_rnope_swa_layers_band_and_log_scale():
    s = make_scheme("rnope-swa", d_model=64, n_heads=4, n_layers=4, max_len=128, swa_window=5)
    assert [s.for_layer(layer) is s for layer in range(4)] == [True, True, True, False]   # NoPE on layer 3
    pos = torch.arange(20)
    band = s.bias(torch.zeros(1, 4, 20, 16), None, AttentionContext(pos, pos))
    want = [[0.0 if i - j < 5 else -math.inf for j in range(20)] for i in range(20)]
    assert band.tolist() == want
    nope = s.for_layer(3)
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 4, 3, 16)
    at = torch.tensor([0, 127, 1023])
    got_q, got_k = nope.rotate_qk(q, k, AttentionContext(at, at))
    scale = [1.0, 1.0, math.log(1024) / math.log(128)]
    torch.testing.assert_close(got_q, q * torch.tensor(scale).view(1, 1, 3, 1))
    assert torch.equal(got_k, k)
    off = make_scheme("rnope-swa", d_model=64, n_heads=4, n_layers=2, max_len=128, nope_every=2, log_scaling=False)
    assert torch.equal(off.for_layer(1).rotate_qk(q, k, AttentionContext(at, at))[0], q)
    with pytest.raises(ConfigError, match="swa_window"):
        make_scheme("rnope-swa", d_model=64, n_heads=4, n_layers=2, max_len=128, swa_window=0)


def test_a_sliding_window_model_cannot_see_past_its_window():
    """One SWA-RoPE layer (no NoPE layer: nope_every 2 > 1 layer): the last token's logits ignore every token more
    than window - 1 positions back, and move when a token inside the window changes."""
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(scheme="rnope-swa", d_model=32, n_layers=1, n_heads=2, max_len=64,
                               scheme_options={"nope_every": 2, "swa_window": 4})).eval()
    tokens = torch.randint(0, 256, (1, 12))
    far, near = tokens.clone(), tokens.clone()
    far[0, :8] = (far[0, :8] + 1) % 256                          # positions 0..7: >= 4 back from position 11
    near[0, 9] = (near[0, 9] + 1) % 256
    with torch.no_grad():
        base, moved_far, moved_near = (model(t)[0, -1] for t in (tokens, far, near))
    torch.testing.assert_close(moved_far, base, rtol=0, atol=1e-5)
    assert (moved_near - base).abs().max() > 1e-3
