"""Plain evaluation of models with sliding-window layers (posenc.hf.band_route): the sliding layers run the band
kernel over the keys inside their window, with transformers' own RoPE and masks, and give transformers' sdpa result
(fp32 within 1e-5, bf16 within its rounding); full layers, models without sliding layers, padded batches and
autograd keep sdpa bit for bit; posenc eval and posenc tune's measurements take the route unless
--no-band-attention, and results.json names the path that ran."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers builds the models)")

from posenc.hf.attention_patch import attention_path  # noqa: E402
from posenc.hf.band_route import IMPLEMENTATION, PATH, use_band_route  # noqa: E402
from posenc_tiny_hf import TINY, build, close, logits  # noqa: E402

T = 40                 # longer than the tiny models' window (8)
KINDS = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture
def band_calls(monkeypatch):
    """Each band_attention call's (queries, keys, window), recorded while it runs."""
    from posenc.attention import kernel

    calls, band = [], kernel.band_attention

    def spy(q, k, v, window, *args, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], window))
        return band(q, k, v, window, *args, **kwargs)

    monkeypatch.setattr(kernel, "band_attention", spy)
    return calls


def gemma3(**extra):
    return build("gemma3_text", num_hidden_layers=3, layer_types=KINDS, **extra)


def test_gemma3_sliding_layers_run_the_band_and_equal_sdpa_in_fp32(band_calls):
    reference = gemma3()
    assert reference.config._attn_implementation == "sdpa" and reference.config.sliding_window == 8 < T
    model = copy.deepcopy(reference)
    assert use_band_route(model) and model.config._attn_implementation == IMPLEMENTATION
    close(logits(model, T), logits(reference, T))
    assert band_calls == [(T, T, 8), (T, T, 8)]       # the two sliding layers; the full layer stays on sdpa
    assert attention_path(model) == PATH == "sdpa (sliding layers: band_attention over the window)"
    assert attention_path(reference) == "sdpa (sliding layers: the whole square with transformers' mask)"


def test_gemma3_in_bf16_agrees_within_its_rounding(band_calls):
    reference = gemma3().to(torch.bfloat16)
    model = copy.deepcopy(reference)
    use_band_route(model)
    got, want = logits(model, T), logits(reference, T)
    assert got.dtype == torch.bfloat16 and len(band_calls) == 2
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=4 * 2 ** -8 * float(want.abs().max()))


def test_inputs_inside_the_window_and_decoding_keep_sdpa(band_calls):
    """Every key inside the window (a short input, a decode step through the sliding cache): sdpa is the band
    already, so it runs, bit for bit."""
    reference = gemma3()
    model = copy.deepcopy(reference)
    use_band_route(model)
    assert torch.equal(logits(model, 8), logits(reference, 8)) and band_calls == []
    ids = torch.randint(0, TINY["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = [m.generate(ids, max_new_tokens=4, do_sample=False) for m in (model, reference)]
    assert torch.equal(*out)
    assert band_calls == [(20, 20, 8), (20, 20, 8)]   # the prefill's sliding layers; each step: sdpa


def test_mistral_style_windows_slide_every_layer(band_calls):
    reference = build("mistral", sliding_window=8)
    model = copy.deepcopy(reference)
    assert use_band_route(model)
    close(logits(model, T), logits(reference, T))
    assert band_calls == [(T, T, 8)] * TINY["num_hidden_layers"]


def test_a_model_without_sliding_layers_is_left_as_it_is():
    reference = build("llama")
    model = copy.deepcopy(reference)
    assert not use_band_route(model) and model.config._attn_implementation == "sdpa"
    assert torch.equal(logits(model, T), logits(reference, T)) and attention_path(model) == "sdpa"
    eager = gemma3(attn_implementation="eager")
    assert not use_band_route(eager) and eager.config._attn_implementation == "eager"   # asked for: kept
    assert not use_band_route(gemma3(), enabled=False)
    wide = gemma3().double()       # float64: the band's one-call path cannot run, so sdpa stays and is recorded
    assert not use_band_route(wide) and attention_path(wide).startswith("sdpa (sliding layers: the whole square")


def test_padding_and_autograd_fall_back_to_sdpa_with_the_mask(band_calls):
    reference = gemma3()
    model = copy.deepcopy(reference)
    use_band_route(model)
    ids = torch.randint(0, TINY["vocab_size"], (2, T), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[0, :5] = 0
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask, use_cache=False).logits for m in (model, reference))
    assert torch.equal(got, want) and band_calls == []
    # with autograd (a training step), torch's CPU flash kernel per block is not what sdpa differentiates
    loss = model(input_ids=ids, use_cache=False).logits.sum()
    loss.backward()
    assert band_calls == [] and model.model.embed_tokens.weight.grad is not None


@pytest.fixture
def gemma_folder(tmp_path):
    from posenc.hf.tokenizer import save_byte_tokenizer

    model = gemma3(vocab_size=256, max_position_embeddings=128, pad_token_id=0, bos_token_id=None,
                   eos_token_id=None)
    model.save_pretrained(str(tmp_path / "gemma"))
    save_byte_tokenizer(tmp_path / "gemma")
    return tmp_path / "gemma", model


def windows_ppl(model, stream, L, n_tokens):
    """exp(mean CE) over the non-overlapping windows of L in ``stream``, each its own forward."""
    total, n_win = 0.0, min(n_tokens, len(stream) - 1) // L
    with torch.no_grad():
        for w in range(n_win):
            win = stream[w * L: w * L + L + 1].long()[None]
            out = model(input_ids=win[:, :-1], use_cache=False).logits
            total += F.cross_entropy(out[0].float(), win[0, 1:], reduction="sum").item()
    return math.exp(total / (n_win * L))


def test_posenc_eval_runs_the_band_and_records_it(gemma_folder, tmp_path, band_calls):
    from posenc.hf.eval.settings import EvalSettings
    from posenc.hf.eval.loop import evaluate_model
    from posenc.hf.lab_bridge import validation_bytes
    from posenc_hf_folders import short_text

    folder, model = gemma_folder
    text = str(short_text(tmp_path / "text.txt"))
    runs = {}
    for off in (False, True):
        s = EvalSettings(eval_lens=[32], data=text, eval_tokens=128, sliding_stride=0, no_band_attention=off)
        runs[off] = doc = evaluate_model(str(folder), s, progress=False, log=lambda *_: None)
        assert doc["meta"]["settings"]["no_band_attention"] is off
    assert runs[False]["meta"]["methods"]["none"]["attention_path"] == PATH
    assert runs[False]["meta"]["methods"]["none"]["attn_implementation"] == IMPLEMENTATION
    assert runs[True]["meta"]["methods"]["none"]["attention_path"] == ("sdpa (sliding layers: the whole square "
                                                                       "with transformers' mask)")
    assert band_calls and all(call[1:] == (32, 8) for call in band_calls)   # only with the band on
    ppl = {off: next(r["value"] for r in doc["results"] if r["metric"] == "ppl") for off, doc in runs.items()}
    want = windows_ppl(model, validation_bytes(text)[0], 32, 128)          # transformers' sdpa, window by window
    assert ppl[False] == pytest.approx(want, rel=1e-5) and ppl[True] == pytest.approx(want, rel=1e-5)


def test_posenc_tune_measures_through_the_band_unless_told_not_to():
    from posenc.cli import build_parser
    from posenc.hf.tune.measure import eval_settings
    from posenc.hf.tune.plan import Candidate

    c = Candidate(method="none", kind="config")
    common = dict(length=64, trained=32, target=64, window=0, data=None, dtype="float32", device="cpu")
    assert eval_settings(c, **common).no_band_attention is False
    assert eval_settings(c, **common, band=False).no_band_attention is True
    parser = build_parser().commands["tune"]
    assert parser.parse_args(["m", "--target-length", "9", "--no-band-attention"]).no_band_attention is True
    assert build_parser().commands["eval"].parse_args(["m", "--no-band-attention"]).no_band_attention is True
