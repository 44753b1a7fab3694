"""The ``fope`` scheme (Hua et al. 2024) against plain-Python loops of the paper's formula: identity coefficients
are the lesson's RoPE loop on the kept pairs and the identity on the clipped ones; random coefficients are the
Fourier-series loop; gradients reach the coefficients; clipped pairs ignore the position; options are checked."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from posenc import reference
from posenc._internal.errors import ConfigError
from posenc.nn.model import ModelConfig, TinyLM
from posenc.rope.frequencies import default_inv_freq
from posenc.schemes import AttentionContext, make_scheme

FAST = settings(max_examples=25, deadline=None, derandomize=True)
HEAD_DIM, HEADS = 16, 2


def scheme(**options):
    options.setdefault("max_len", 64)           # theta 1e4, 8 pairs: 1, 0.32, 0.1 turn within 64; 5 clipped
    return make_scheme("fope", d_model=HEAD_DIM * HEADS, n_heads=HEADS, n_layers=2, **options)


# RoPE's float32 frequencies (transformers' rounding, checked against theta^(-2j/d) in tests/rope): the loops below
# take them as given, so that at position 1e5 a float64 frequency's 1e-3 rad of difference is not what is compared
FREQUENCIES = default_inv_freq(HEAD_DIM, 1e4).tolist()


def kept_frequencies(max_len: int) -> list[float]:
    """The paper's clipping, as a loop: the frequencies w_j whose period 2 pi / w_j fits within max_len."""
    return [w for w in FREQUENCIES if 2 * math.pi / w <= max_len]


def fourier_loop(x: list[float], pos: float, freqs: list[float], c_cos, c_sin) -> list[float]:
    """FoPE on one head vector, half layout: kept pair j takes cos'_j = sum_k C_cos[k][j] cos(pos w_k) (sin' alike),
    rotates (x_j, x_{j + d/2}) by them; the clipped pairs (j >= len(freqs)) pass unchanged."""
    half = len(x) // 2
    out = list(x)
    for j in range(len(freqs)):
        c = sum(c_cos[k][j] * math.cos(pos * freqs[k]) for k in range(len(freqs)))
        s = sum(c_sin[k][j] * math.sin(pos * freqs[k]) for k in range(len(freqs)))
        a, b = x[j], x[j + half]
        out[j], out[j + half] = a * c - b * s, a * s + b * c
    return out


def rotate(s, q, k, positions, layer=0):
    return s.rotate_qk(q, k, AttentionContext(positions, positions, layer=layer))


@FAST
@given(st.integers(0, 10**5), st.sampled_from([8, 64, 500]))
def test_identity_coefficients_are_rope_on_the_kept_pairs(start, max_len):
    s = scheme(max_len=max_len, fope_sigma=0.0)
    q = torch.randn(1, HEADS, 3, HEAD_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(start))
    pos = torch.arange(start, start + 3)
    got, _ = rotate(s, q, q.clone(), pos)
    kept = len(kept_frequencies(max_len))
    assert s.kept_pairs == kept
    for t in range(3):
        rope = reference.apply_rope_half(q[0, 1, t].tolist(), float(pos[t]), inv_freq=FREQUENCIES)
        want = [rope[i] if i % (HEAD_DIM // 2) < kept else q[0, 1, t, i].item() for i in range(HEAD_DIM)]
        torch.testing.assert_close(got[0, 1, t], torch.tensor(want, dtype=torch.float64), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("layer", [0, 1])
def test_random_coefficients_equal_the_fourier_loop(layer):
    torch.manual_seed(layer)
    s = scheme(fope_sigma=0.5)
    q, k = torch.randn(2, HEADS, 4, HEAD_DIM, dtype=torch.float64), torch.randn(2, HEADS, 4, HEAD_DIM,
                                                                                  dtype=torch.float64)
    pos = torch.tensor([[0, 5, 63, 1000], [7, 8, 9, 300]])                            # per-row positions
    got_q, got_k = rotate(s, q, k, pos, layer)
    freqs = kept_frequencies(64)
    for b in range(2):
        for h in range(HEADS):
            c_cos = s.cos_coefficients[layer, h].tolist()
            c_sin = s.sin_coefficients[layer, h].tolist()
            for t in range(4):
                for x, got in ((q, got_q), (k, got_k)):
                    want = fourier_loop(x[b, h, t].tolist(), float(pos[b, t]), freqs, c_cos, c_sin)
                    torch.testing.assert_close(got[b, h, t], torch.tensor(want, dtype=torch.float64),
                                               rtol=1e-6, atol=1e-6)


def test_interleaved_layout_is_the_half_layout_permuted():
    torch.manual_seed(3)
    half, inter = scheme(), scheme(rope_layout="interleaved")
    inter.load_state_dict(half.state_dict())
    x = torch.randn(1, HEADS, 5, HEAD_DIM)
    perm = torch.cat((torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)))   # interleaved 2j -> half j
    pos = torch.arange(20, 25)
    got_half, _ = rotate(half, x[..., perm], x[..., perm], pos)
    got_inter, _ = rotate(inter, x, x, pos)
    torch.testing.assert_close(got_inter[..., perm], got_half, rtol=1e-6, atol=1e-6)


@FAST
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=6))
def test_clipped_pairs_carry_no_position(positions):
    s = scheme(fope_sigma=1.0)
    x = torch.randn(1, HEADS, len(positions), HEAD_DIM, generator=torch.Generator().manual_seed(len(positions)))
    got, _ = rotate(s, x, x, torch.tensor(positions))
    clipped = [i for i in range(HEAD_DIM) if i % (HEAD_DIM // 2) >= s.kept_pairs]
    assert clipped and torch.equal(got[..., clipped], x[..., clipped])


def test_gradients_reach_both_coefficient_sets_and_freezing_stops_them():
    s = scheme()
    q = torch.randn(1, HEADS, 4, HEAD_DIM, requires_grad=True)
    got_q, got_k = rotate(s, q, q, torch.arange(4), layer=1)
    (got_q * got_k).sum().backward()
    for c in (s.cos_coefficients, s.sin_coefficients):
        assert c.grad is not None and c.grad[1].abs().sum() > 0 and c.grad[0].abs().sum() == 0
    frozen = scheme(fope_learnable=False)
    assert not any(p.requires_grad for p in frozen.parameters())


def test_init_is_identity_plus_noise_per_layer_and_head():
    torch.manual_seed(0)
    s = scheme(max_len=4096, fope_sigma=0.3)
    c = s.cos_coefficients.detach()
    assert c.shape == (2, HEADS, s.kept_pairs, s.kept_pairs) and s.sin_coefficients.shape == c.shape
    noise = c - torch.eye(s.kept_pairs)
    fan = s.kept_pairs * s.kept_pairs + HEADS * s.kept_pairs                         # torch's fans for [H, K, K]
    assert 0.5 < float(noise.std()) / (0.3 * math.sqrt(2 / fan)) < 1.5
    assert not torch.equal(c[0], c[1]) and not torch.equal(c, s.sin_coefficients.detach())
    assert s.kept_pairs == len(kept_frequencies(4096)) and scheme(fope_clip=False).kept_pairs == HEAD_DIM // 2


def test_decoding_with_the_cache_equals_a_full_forward():
    torch.manual_seed(4)
    model = TinyLM(ModelConfig(scheme="fope", d_model=32, n_layers=2, n_heads=2, max_len=64)).eval()
    tokens = torch.randint(0, 256, (2, 30))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :5], cache)] + [model(tokens[:, t:t + 1], cache) for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_a_bf16_model_keeps_the_frequencies_in_float32():
    model = TinyLM(ModelConfig(scheme="fope", d_model=32, n_layers=1, n_heads=2, max_len=64)).to(torch.bfloat16)
    assert model.scheme.kept_freq.dtype == torch.float32
    out = model(torch.randint(0, 256, (1, 8)))
    assert out.dtype == torch.bfloat16 and bool(out.isfinite().all())


@pytest.mark.parametrize("options, match", [
    ({"fope_sigma": -0.1}, "fope_sigma"), ({"fope_sigma": "big"}, "fope_sigma"), ({"fope_clip": "yes"}, "fope_clip"),
    ({"fope_learnable": 1}, "fope_learnable"), ({"max_len": 6}, "max_len 6 clips every pair"),
    ({"max_len": 0}, "max_len"), ({"rope_layout": "spiral"}, "rope_layout")])
def test_bad_options_name_themselves(options, match):
    with pytest.raises(ConfigError, match=match):
        scheme(**options)


def test_not_extendable_and_describes_itself():
    s = scheme()
    assert not s.capabilities.extendable and s.capabilities.rotates and not s.length_dependent
    s.set_rope_scaling(None)
    with pytest.raises(ConfigError, match="fope scheme cannot take"):
        s.set_rope_scaling({"rope_type": "linear", "factor": 2.0})
    assert s.describe() == "fope (sigma=0.3, 3 of 8 pairs rotate, clipped at L=64)"
    assert s.rope_config["rope_scaling"] == {"rope_type": "fope", "original_max_position_embeddings": 64}
