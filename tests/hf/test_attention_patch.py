"""posenc.patch(model, method=...) with the attention-changing methods on tiny random transformers models (no
download): identity settings give the unpatched logits for every family; real settings give what the kernel gives
on the model's own q/k/v (checked against the plain-loop oracle via the kernel tests) and change far positions only;
a KV-cache decode equals the full forward; unpatch restores transformers' logits bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers builds the models)")

import posenc  # noqa: E402
from posenc._internal.errors import ConfigError, PosencError  # noqa: E402
from posenc.hf.patch import patched_with  # noqa: E402
from posenc_tiny_hf import TINY, build, close, logits  # noqa: E402

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma3_text"]
T = 40  # longer than LMAX = 32


IDENTITY = {"self-extend": dict(group_size=4, window=T), "rerope": dict(window=T),
            "leaky-rerope": dict(window=T, leak=3.0), "dca": dict(chunk_size=T + 8, local_window=8),
            "sinks": dict(n_sink=4, window=T), "string": dict(shift=T, local_window=8),
            "lm-infinite": dict(n_global=4, n_local=T, ceiling=T)}
REAL = {"self-extend": dict(group_size=3, window=8), "rerope": dict(window=8),
        "leaky-rerope": dict(window=8, leak=2.0), "dca": dict(chunk_size=24, local_window=4),
        "sinks": dict(n_sink=4, window=12), "string": dict(shift=12, local_window=4),
        "lm-infinite": dict(n_global=4, n_local=12, ceiling=16)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", sorted(IDENTITY))
def test_identity_settings_give_the_unpatched_logits(family, method):
    reference = build(family)
    model = posenc.patch(copy.deepcopy(reference), method=method, **IDENTITY[method])
    close(logits(model, T), logits(reference, T))
    posenc.unpatch(model)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma3_text"])
@pytest.mark.parametrize("method", sorted(REAL))
def test_real_settings_change_only_far_tokens_and_unpatch_restores(family, method):
    extra = {"partial_rotary_factor": 0.5} if family == "phi3" else {}
    reference = build(family, **extra)
    want = logits(reference, T)
    model = posenc.patch(reference, method=method, **REAL[method])
    got = logits(model, T)
    close(got[:, :8], want[:, :8])         # the first 8 tokens see only neighbours: plain RoPE
    assert (got[:, 20:] - want[:, 20:]).abs().max() > 1e-4   # far tokens see remapped positions
    posenc.unpatch(model)
    assert torch.equal(logits(model, T), want)  # transformers' own path again, bit for bit
    assert not any("posenc_rule_rotary" in vars(m) for m in model.modules())


@pytest.mark.parametrize("method", sorted(REAL))
def test_kv_cache_decode_equals_full_forward(method):
    model = posenc.patch(build("qwen2"), method=method, **REAL[method])
    ids = torch.randint(0, TINY["vocab_size"], (1, T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        out = model(input_ids=ids[:, :10], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(10, T):
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    close(torch.cat(steps, dim=1), full)


def test_gemma3_local_layers_keep_plain_rope_in_their_window():
    """Gemma 3's sliding layers run plain RoPE; with every full layer under an identity rule the logits are
    transformers' at a length past the sliding window (8)."""
    reference = build("gemma3_text")
    model = posenc.patch(copy.deepcopy(reference), method="self-extend", group_size=2, window=T)
    close(logits(model, T), logits(reference, T))


TYPED = {"self-extend": posenc.SelfExtend, "rerope": posenc.ReRoPE, "leaky-rerope": posenc.LeakyReRoPE,
         "dca": posenc.DualChunk, "sinks": posenc.Sinks, "string": posenc.STRING, "lm-infinite": posenc.LMInfinite}


@pytest.mark.parametrize("method", sorted(REAL))
@pytest.mark.parametrize("given", ["all", "none"])
def test_a_typed_rule_gives_the_logits_of_the_string_form(method, given):
    """posenc.patch(model, posenc.SelfExtend(...)) is posenc.patch(model, method="self-extend", ...), with every
    option given and with every option derived from the model's trained length (and a target)."""
    options = REAL[method] if given == "all" else {}
    reference = build("llama")
    by_name = logits(posenc.patch(copy.deepcopy(reference), method=method, target=96, **options), T)
    typed = posenc.patch(copy.deepcopy(reference), TYPED[method](**options), target=96)
    assert patched_with(typed) == f"the attention method {method!r}"
    assert torch.equal(logits(typed, T), by_name)
    assert not torch.equal(by_name, logits(reference, T))


def test_a_typed_rule_takes_its_options_in_the_rule():
    model = build("llama")
    with pytest.raises(TypeError, match="group_size"):
        posenc.ReRoPE(group_size=2)
    with pytest.raises(ConfigError, match="^window: a rerope rule holds its options"):
        posenc.patch(model, posenc.ReRoPE(), window=8)
    assert patched_with(model) is None


def test_the_defaults_plan_from_the_trained_length_that_every_reader_shares():
    """patch derives a rule's defaults from posenc.rope.contexts.trained_length, which eval and the config tools read
    too: original_max_position_embeddings when the rope config states it, else max_position_embeddings (divided by
    the factor for linear scaling, whose convention stores the extended length there)."""
    from posenc.rope.config import load_rope_config
    from posenc.rope.contexts import trained_length

    plain = build("llama")
    yarn = build("llama", rope={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16})
    linear = build("llama", rope={"rope_type": "linear", "factor": 2.0})
    lmax = plain.config.max_position_embeddings
    for model, want in ((plain, lmax), (yarn, 16), (linear, lmax // 2)):
        assert trained_length(model) == trained_length(model.config) == trained_length(model.config.to_dict()) \
            == trained_length(load_rope_config(model.config)) == want
        posenc.patch(model, method="rerope")
        assert next(m.rule for m in model.modules() if hasattr(m, "rule")).window == want // 2
        posenc.unpatch(model)


def test_errors_name_the_argument():
    model = build("llama")
    with pytest.raises(ConfigError, match="group_size"):
        posenc.patch(model, method="self-extend", group_size=0, window=4)
    with pytest.raises(ConfigError, match="takes no option"):
        posenc.patch(model, method="rerope", group_size=2)
    with pytest.raises(PosencError, match="rescales RoPE's frequencies"):
        posenc.patch(model, method="yarn")
    with pytest.raises(PosencError, match="need method"):
        posenc.patch(model, window=3)
    posenc.patch(model, method="sinks")
    with pytest.raises(PosencError, match="already patched"):
        posenc.patch(model, method="dca")
    posenc.unpatch(model)
    assert not posenc.is_patched(model)


@pytest.mark.parametrize("first, second, named", [
    ("self-extend", None, "the attention method 'self-extend'"),       # once blamed transformers
    ("sinks", "dca", "the attention method 'sinks'"),
    ("rerope", "rerope", "the attention method 'rerope'"),
    (None, "self-extend", "posenc's RoPE kernel"),
])
def test_a_second_patch_is_refused_naming_the_first_and_unpatch_allows_it(first, second, named):
    reference = build("llama")
    model = copy.deepcopy(reference)
    posenc.patch(model, method=first, **({} if first is None else REAL[first]))
    patched = logits(model, T)
    with pytest.raises(PosencError) as info:
        posenc.patch(model, method=second, **({} if second is None else REAL[second]))
    assert str(info.value) == (f"patch: the model is already patched with {named}; posenc.unpatch(model) first, "
                               "then patch it again")
    assert torch.equal(logits(model, T), patched)               # the refused patch changed nothing
    posenc.unpatch(model)
    assert torch.equal(logits(model, T), logits(reference, T))
    posenc.patch(model, method=second, **({} if second is None else REAL[second]))      # now it applies
    assert patched_with(model) == ("posenc's RoPE kernel" if second is None
                                                   else f"the attention method {second!r}")
    posenc.unpatch(model)


def test_padding_is_refused():
    model = posenc.patch(build("llama"), method="rerope", window=4)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0
    with pytest.raises(PosencError, match="padding|position ids"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


def test_bf16_model_under_an_identity_rule_agrees_within_a_rounding():
    reference = build("llama").to(torch.bfloat16)
    model = posenc.patch(copy.deepcopy(reference), method="self-extend", group_size=4, window=T)
    got, want = logits(model, T), logits(reference, T)
    assert got.dtype == torch.bfloat16
    # transformers rotates in bf16 with bf16 cos/sin; posenc rotates in fp32 and rounds once: a few bf16 ulps
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=4 * 2 ** -8 * float(want.abs().max()))


def test_gemma3_local_layers_run_the_band_and_equal_transformers_masked_result(monkeypatch):
    """Gemma 3's sliding layers (window 8, input 40) run the band kernel, which reads only the keys inside the
    window, and give transformers' own masked result: fp32 logits within 1e-5 with every full layer under an identity
    rule. A padded batch (a mask that is not the plain sliding one) falls back to SDPA with the mask."""
    from posenc.attention import kernel

    calls = []
    band = kernel.band_attention

    def spy(q, k, v, window, *args, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], window))
        return band(q, k, v, window, *args, **kwargs)

    monkeypatch.setattr(kernel, "band_attention", spy)
    reference = build("gemma3_text")
    assert reference.config.sliding_window == 8 < T
    model = posenc.patch(copy.deepcopy(reference), method="rerope", window=T)
    close(logits(model, T), logits(reference, T))
    assert calls == [(T, T, 8)]     # the one sliding layer, the batch of 2 in one call
    from posenc.hf.attention_interface import is_band_mask

    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band_mask = ((j <= i) & (j > i - 8))[None, None]
    assert is_band_mask(band_mask, T, T, 8) and is_band_mask(torch.where(band_mask, 0.0, float("-inf")), T, T, 8)
    padded = band_mask.clone()
    padded[..., :3] = False
    assert not is_band_mask(padded, T, T, 8) and not is_band_mask(None, T, T, 8) and is_band_mask(None, 8, 8, 8)
    assert is_band_mask(band_mask, T, T, 8, rows=7)          # several row blocks; the answer is kept ...
    band_mask[0, 0, 30, 2] = True
    assert not is_band_mask(band_mask, T, T, 8, rows=7)      # ... only while the mask is not written to


def test_attention_path_names_the_code_that_runs():
    from posenc.hf.attention_patch import attention_path

    gemma = build("gemma3_text")
    assert attention_path(gemma) == (f"{gemma.config._attn_implementation} (sliding layers: the whole square with "
                                     "transformers' mask)")
    posenc.patch(gemma, method="rerope", window=T)
    assert attention_path(gemma) == ("posenc_rule (blocked rule_attention, torch's CPU flash kernel per piece, band "
                                     "for sliding layers)")
    llama = posenc.patch(build("llama").double(), method="rerope", window=T)
    assert attention_path(llama) == "posenc_rule (blocked rule_attention, matmul + log-sum-exp per piece)"


def test_gemma3_decode_through_the_sliding_cache_equals_the_full_forward(monkeypatch):
    """Decoding token by token past Gemma 3's window (8) through transformers' cache, the local layers run the band on
    the cache's last keys and give the full forward's logits."""
    from posenc.attention import kernel

    calls = []
    band = kernel.band_attention
    monkeypatch.setattr(kernel, "band_attention", lambda q, k, v, *a, **kw: calls.append(k.shape[-2]) or
                        band(q, k, v, *a, **kw))
    model = posenc.patch(build("gemma3_text"), method="rerope", window=T)
    ids = torch.randint(0, TINY["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        out = model(input_ids=ids[:, :12], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(12, 24):
            out = model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    close(torch.cat(steps, dim=1), full)
    assert calls[:2] == [24, 12] and len(calls) == 14   # the full forward, the prefill and each step: the band


def test_the_sliding_mask_is_checked_once_per_forward(monkeypatch):
    """transformers hands every sliding layer the same mask: posenc checks it is the plain band once, not per layer."""
    from posenc.hf import attention_interface

    checks = []
    original = attention_interface._band_rows_match
    monkeypatch.setattr(attention_interface, "_band_rows_match", lambda *a: checks.append(1) or original(*a))
    kinds = ["sliding_attention", "sliding_attention", "full_attention"]
    reference = build("gemma3_text", num_hidden_layers=3, layer_types=kinds)
    model = posenc.patch(copy.deepcopy(reference), method="rerope", window=T)
    close(logits(model, T), logits(reference, T))
    assert len(checks) == 1
