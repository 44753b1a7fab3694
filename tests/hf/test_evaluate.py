"""posenc eval on transformers models: an exported lab model reproduces the lab's own perplexity (lm_eval on the
TinyLM, with and without extension methods) and passkey decoding; tiny random Llama / Qwen2 folders built here are
scored like a brute-force window loop, with byte and non-byte tokenizers."""

from __future__ import annotations

import sys
import json
import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (transformers runs the models)")

import posenc  # noqa: E402
from posenc._internal.errors import ConfigError, DataError  # noqa: E402
from posenc.hf.evaluate import (EvalSettings, eval_main, evaluate_model, load_causal_lm, logits_model,  # noqa: E402
                                passkey_chars, token_stream)
from posenc.hf.export import export_lab_model  # noqa: E402
from posenc.hf.lab_bridge import (build_lab_model, load_lab_model, passkey_rate, perplexity,  # noqa: E402
                                  save_lab_model, set_lab_extension, validation_bytes)
from posenc.hf.tokenizer import save_byte_tokenizer  # noqa: E402

transformers.logging.set_verbosity_error()

TRAIN_LEN = 32


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """Real text (posenc's own sources) as the corpus: the lab splits a file 90/10 by bytes."""
    from pathlib import Path

    import posenc

    root = Path(posenc.__file__).parent
    text = "".join(p.read_text() for p in sorted(root.rglob("*.py")))[:120_000]
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A lab RoPE model (weights scaled up so its predictions are peaked) and its transformers export."""
    folder = tmp_path_factory.mktemp("exp")
    torch.manual_seed(0)
    model = build_lab_model(scheme="rope", d_model=32, n_layers=2, n_heads=4, max_len=TRAIN_LEN)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ckpt = save_lab_model(folder / "rope.safetensors", model)
    export_lab_model(ckpt, folder / "hf")
    return ckpt, folder / "hf"


def lab_ppl(ckpt, text_file, method, L, stride=None, n_tokens=1500):
    model, _ = load_lab_model(ckpt)
    set_lab_extension(model, method, 2.0)
    val, _ = validation_bytes(text_file)
    return perplexity(model, val, L, n_tokens=n_tokens, stride=stride)["ppl"]


def test_exported_lab_model_reproduces_the_lab_perplexity(exported, text_file):
    ckpt, folder = exported
    s = EvalSettings(eval_lens=[TRAIN_LEN, 2 * TRAIN_LEN], methods=["none", "yarn", "dynamic", "linear", "ntk"],
                     factor=2.0, data=text_file, eval_tokens=1500, sliding_lens=[2 * TRAIN_LEN])
    doc = evaluate_model(str(folder), s, progress=False)
    assert doc["meta"]["byte_tokens"] is True
    rows = [r for r in doc["results"] if r["metric"] == "ppl"]
    assert len(rows) == 5 * 3
    for r in rows:
        stride = None if r["protocol"] == "non-overlapping" else int(r["protocol"].split()[-1][:-1])
        method = None if r["scaling"] == "none" else r["scaling"]
        want = lab_ppl(ckpt, text_file, method, r["eval_len"], stride)
        assert r["value"] == pytest.approx(want, rel=1e-4), r
        assert r["train_len"] == TRAIN_LEN and r["task"] == "lm" and r["scheme"] == "rope"
    at_2x = {r["scaling"]: r["value"] for r in rows
             if r["eval_len"] == 2 * TRAIN_LEN and r["protocol"] == "non-overlapping"}
    # each method really changed the model; at exactly 2x, dynamic NTK (factor 1) is static NTK at factor 2
    assert at_2x["dynamic"] == pytest.approx(at_2x["ntk"], rel=1e-5)
    assert len({round(v, 6) for m, v in at_2x.items() if m != "dynamic"}) == 4


def test_exported_lab_model_decodes_the_lab_passkey_episodes(exported):
    """Same byte prompts -> the transformers model's greedy continuation equals the TinyLM's (KV cache on both)."""
    ckpt, folder = exported
    lab, _ = load_lab_model(ckpt)
    hf, _, _ = load_causal_lm(str(folder))
    adapter = logits_model(hf, max_len=None, byte_level=True)
    from posenc.hf.lab_bridge import passkey_prompt

    prompts = torch.tensor([list(passkey_prompt(90, d, k)[0].encode()) for d, k in ((0.0, "12345"), (1.0, "90210"))])
    assert torch.equal(adapter.generate(prompts, 5), lab.generate(prompts, 5))
    assert passkey_rate(adapter, 90, 0.5, n_trials=3, seed=0) == passkey_rate(lab, 90, 0.5, n_trials=3, seed=0)


def tiny_hf(family, folder, tokenizer=None, vocab=256, **rope):
    import transformers as tf

    cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[family]
    config = cls[0](hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=TRAIN_LEN,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **rope}, initializer_range=0.2,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = cls[1](config).eval()
    model.save_pretrained(str(folder))
    if tokenizer is None:
        save_byte_tokenizer(folder)
    else:
        tokenizer.save_pretrained(str(folder))
    return model


def brute_force_ppl(model, stream, L, n_tokens):
    """exp(mean CE) over non-overlapping windows of L, each window run on its own."""
    n_win = max(1, min(n_tokens, len(stream) - 1) // L)
    total = 0.0
    with torch.no_grad():
        for w in range(n_win):
            win = stream[w * L: w * L + L + 1].long()[None]
            logits = model(input_ids=win[:, :-1], use_cache=False).logits
            total += F.cross_entropy(logits[0].float(), win[0, 1:], reduction="sum").item()
    return math.exp(total / (n_win * L))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_random_models_are_scored_like_a_window_loop(family, tmp_path, text_file):
    model = tiny_hf(family, tmp_path)
    s = EvalSettings(eval_lens=[16, 96], methods=["none", "yarn"], factor=2.0, data=text_file, eval_tokens=600,
                     sliding_stride=0, tasks=["lm", "passkey"], passkey_depths=[0.5], passkey_trials=2)
    doc = evaluate_model(str(tmp_path), s, progress=False)
    val, _ = validation_bytes(text_file)
    ppl = {(r["scaling"], r["eval_len"]): r["value"] for r in doc["results"] if r["metric"] == "ppl"}
    for L in (16, 96):
        assert ppl[("none", L)] == pytest.approx(brute_force_ppl(model, val, L, 600), rel=1e-5)
    assert ppl[("yarn", 96)] != pytest.approx(ppl[("none", 96)], rel=1e-6)  # yarn reached transformers' rotary
    assert doc["meta"]["methods"]["yarn"]["rope_parameters"]["rope_type"] == "yarn"
    passkey = [r for r in doc["results"] if r["task"] == "passkey"]
    assert [r["value"] for r in passkey if r["eval_len"] == 16] == [None, None]  # too short for an episode
    assert all(0.0 <= r["value"] <= 1.0 for r in passkey if r["eval_len"] == 96)


def test_eval_offset_scores_the_windows_after_it_alone(tmp_path, text_file):
    """--eval-offset K --eval-tokens L scores exactly the window stream[K : K + L + 1]: the study's windows at fixed
    offsets, each its own part."""
    model = tiny_hf("llama", tmp_path)
    val, _ = validation_bytes(text_file)
    s = EvalSettings(eval_lens=[32], data=text_file, eval_tokens=64, eval_offset=100, sliding_stride=0)
    doc = evaluate_model(str(tmp_path), s, progress=False)
    (row,) = [r for r in doc["results"] if r["metric"] == "ppl"]
    assert row["value"] == pytest.approx(brute_force_ppl(model, val[100:], 32, 64), rel=1e-5)
    assert row["value"] != pytest.approx(brute_force_ppl(model, val, 32, 64), rel=1e-3)
    assert doc["meta"]["settings"]["eval_offset"] == 100
    with pytest.raises(DataError, match="eval_offset"):
        evaluate_model(str(tmp_path), EvalSettings(eval_lens=[32], data=text_file, eval_tokens=64,
                                                   eval_offset=len(val) - 10, sliding_stride=0), progress=False)
    with pytest.raises(ConfigError, match="eval_offset"):
        EvalSettings(eval_lens=[32], eval_offset=-1).validate()


def char_tokenizer():
    """A non-byte tokenizer: printable ASCII + newline, ids shifted by 3 from their byte values."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    vocab = {"<unk>": 0, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_non_byte_tokenizer_counts_its_own_tokens(tmp_path, text_file):
    tok = char_tokenizer()
    data, _ = validation_bytes(text_file)
    stream, byte_level = token_stream(tok, data, 500)
    assert not byte_level and len(stream) >= 500
    text = bytes(data.numpy().tobytes()).decode("utf-8", errors="replace")
    assert stream[:200].tolist() == tok(text[:200], add_special_tokens=False)["input_ids"]
    assert passkey_chars(tok, 120, byte_level=False) == 120  # one token per ASCII character: chars = tokens
    tiny_hf("llama", tmp_path, tokenizer=tok, vocab=128)
    s = EvalSettings(eval_lens=[100], tasks=["lm", "passkey"], data=text_file, eval_tokens=300, sliding_stride=0,
                     passkey_depths=[0.0], passkey_trials=2)
    doc = evaluate_model(str(tmp_path), s, progress=False)
    assert doc["meta"]["byte_tokens"] is False
    lm = [r for r in doc["results"] if r["task"] == "lm"][0]
    assert lm["n_scored"] == 300 and math.isfinite(lm["value"])
    pk = [r for r in doc["results"] if r["task"] == "passkey"][0]
    assert 0.0 <= pk["value"] <= 1.0 and pk["chars"] == passkey_chars(tok, 100, byte_level=False)
    from posenc.hf.evaluate import report_tables

    tables = report_tables({**doc, "results": [{**r, "train_len": 50} for r in doc["results"]]})   # the lab's
    assert "Perplexity (per token of the model's tokenizer, non-overlapping" in tables and "byte-level" not in tables


def test_device_map_auto_without_accelerate_falls_back_with_a_note(tmp_path, monkeypatch):
    tiny_hf("llama", tmp_path)
    monkeypatch.setitem(sys.modules, "accelerate", None)     # as if not installed: find_spec gives None
    notes = []
    model, _, _ = load_causal_lm(str(tmp_path), device_map="auto", log=notes.append)
    assert "needs accelerate" in notes[0] and next(model.parameters()).device.type == "cpu"


def test_device_map_auto_loads_through_accelerate(tmp_path):
    # the hf extra installs accelerate: "auto" places the model (on this CPU-only machine, on the CPU) with no note
    pytest.importorskip("accelerate")
    tiny_hf("llama", tmp_path)
    notes = []
    model, _, _ = load_causal_lm(str(tmp_path), device_map="auto", log=notes.append)
    assert not any("needs accelerate" in n for n in notes)
    plain, _, _ = load_causal_lm(str(tmp_path))
    ids = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain(ids).logits)


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="factor: extension methods need --factor"):
        EvalSettings(methods=["yarn"]).validate()
    with pytest.raises(ConfigError, match="methods: expected one of none, linear"):
        EvalSettings(methods=["pi"]).validate()
    with pytest.raises(ConfigError, match="tasks: expected one of lm, copy, passkey"):    # the registered tasks
        EvalSettings(tasks=["nonesuch"]).validate()
    with pytest.raises(ConfigError, match="passkey_trials must be an integer"):          # a task's declared setting
        EvalSettings(tasks=["passkey"], passkey_trials=0).validate()
    with pytest.raises(ConfigError, match="eval_lens must be an integer"):
        EvalSettings(eval_lens=[1.5]).validate()


def test_eval_command_writes_the_labs_outputs(exported, text_file, tmp_path, capsys):
    """Several methods in one run: the lab's side-by-side tables (rows = methods, one cell per length, the values
    of results.json), results.json in the lab's schema, report.md and the lab's plots."""
    from posenc.lab.tables import fmt

    _, folder = exported
    assert eval_main([str(folder), "--eval-lens", "32,64", "--data", text_file, "--eval-tokens", "300",
                      "--methods", "none,yarn,linear", "--factor", "2", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "results.json").read_text())
    keys = {"task", "scheme", "scaling", "finetuned", "train_len", "eval_len", "metric", "value", "std", "seed",
            "protocol", "depth"}
    assert all(keys <= set(r) for r in doc["results"]) and len(doc["results"]) == 3 * 3
    table = out.split("Perplexity, sliding")[0]
    for label, method in (("rope", "none"), ("rope + YaRN, zero-shot", "yarn"), ("rope + PI, zero-shot", "linear")):
        cells = [fmt(r) for L in (32, 64) for r in doc["results"]
                 if r["scaling"] == method and r["eval_len"] == L and r["protocol"] == "non-overlapping"]
        assert f"| {label} | {cells[0]} | {cells[1]} |" in table
    assert "| model | 32 (1x) | 64 (2x) |" in table and "sliding (stride 32)" in out
    assert set(doc["curves"]) == {"rope|none|zs|0", "rope|yarn|zs|0", "rope|linear|zs|0"}
    assert all(len(c) == 64 for c in doc["curves"].values())
    report = (tmp_path / "report.md").read_text()
    assert "| rope + YaRN, zero-shot |" in report and "load average" not in report
    from posenc._internal.machine import cpu_model

    assert doc["meta"]["cpu"] == cpu_model() and f", {cpu_model()}." in report   # what a reader needs to repeat it
    for png in ("ppl_vs_length.png", "per_position_loss.png"):
        assert f"![{png}]({png})" in report
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert eval_main([str(tmp_path / "missing")]) == 2
    assert "posenc eval: error: model " in capsys.readouterr().err


def test_attention_methods_are_patched_onto_the_loaded_model(tmp_path, text_file):
    """--methods self-extend,sinks with --method-options: each row is the patched model's perplexity (the same number
    a hand-patched model gives window by window); identity-range lengths equal 'none'."""
    model = tiny_hf("llama", tmp_path)
    s = EvalSettings(eval_lens=[16, 96], methods=["none", "self-extend", "sinks"], data=text_file, eval_tokens=600,
                     sliding_stride=0, method_options={"self-extend.group_size": 3, "self-extend.window": 20,
                                                       "sinks.window": 24})
    doc = evaluate_model(str(tmp_path), s, progress=False)
    ppl = {(r["scaling"], r["eval_len"]): r["value"] for r in doc["results"] if r["metric"] == "ppl"}
    val, _ = validation_bytes(text_file)
    for method, opts in (("self-extend", dict(group_size=3, window=20)), ("sinks", dict(window=24))):
        assert ppl[(method, 16)] == pytest.approx(ppl[("none", 16)], rel=1e-5)  # 16 tokens: inside the window
        patched = posenc.patch(tiny_hf("llama", tmp_path / method), method=method, **opts)
        assert ppl[(method, 96)] == pytest.approx(brute_force_ppl(patched, val, 96, 600), rel=1e-5)
        assert ppl[(method, 96)] != pytest.approx(ppl[("none", 96)], rel=1e-6)
    assert doc["meta"]["methods"]["self-extend"]["attention_rule"] == {
        "name": "self-extend", "group_size": 3, "window": 20, "keeps": "exact within 20, grouped by 3 beyond"}
    # the attention code that ran: transformers' own for the plain model, posenc's kernel for a method
    assert doc["meta"]["methods"]["none"]["attention_path"] == doc["meta"]["methods"]["none"]["attn_implementation"]
    assert doc["meta"]["methods"]["none"]["attention_path"] in ("sdpa", "eager")
    assert doc["meta"]["methods"]["sinks"]["attention_path"] == ("posenc_rule (blocked rule_attention, torch's CPU "
                                                                 "flash kernel per piece)")
    with pytest.raises(ConfigError, match="method_options"):
        EvalSettings(methods=["sinks"], method_options={"dca.chunk_size": 3}).validate()
    with pytest.raises(ConfigError, match="takes no option"):
        EvalSettings(methods=["sinks"], method_options={"sinks.group_size": 3}).validate()


def test_eval_of_attention_methods_alone_writes_its_report(tmp_path, text_file, capsys):
    # no --factor (only attention methods): the command ends with its report, each method described by its kind
    tiny_hf("llama", tmp_path / "m")
    assert eval_main([str(tmp_path / "m"), "--data", text_file, "--eval-lens", "16,48", "--eval-tokens", "200",
                      "--sliding-stride", "0", "--methods", "self-extend,rerope", "--method-options",
                      "self-extend.window=8,rerope.window=8", "--threads", "1", "--no-progress",
                      "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "- method self-extend: self-extend on attention through posenc.patch" in report
    assert "- method rerope: rerope on attention through posenc.patch" in report
    assert "attention posenc_rule (blocked rule_attention, torch's CPU flash kernel per piece)" in report


def test_eval_runs_string_and_lm_infinite_by_name(tmp_path, text_file, capsys):
    """A registered rule runs in posenc eval with nothing else edited: --methods string,lm-infinite with options,
    each row the patched model's perplexity, past the window different from plain RoPE."""
    tiny_hf("llama", tmp_path / "m")
    assert eval_main([str(tmp_path / "m"), "--data", text_file, "--eval-lens", "16,48", "--eval-tokens", "200",
                      "--sliding-stride", "0", "--methods", "none,string,lm-infinite", "--method-options",
                      "string.shift=12,string.local_window=3,lm-infinite.n_global=2,lm-infinite.n_local=8",
                      "--threads", "1", "--no-progress", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "- method string: string on attention through posenc.patch" in report
    assert "- method lm-infinite: lm-infinite on attention through posenc.patch" in report
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    ppl = {(r["scaling"], r["eval_len"]): r["value"] for r in doc["results"] if r["metric"] == "ppl"}
    for method in ("string", "lm-infinite"):
        assert ppl[(method, 48)] != pytest.approx(ppl[("none", 48)], rel=1e-6)
    assert doc["meta"]["methods"]["lm-infinite"]["attention_rule"]["ceiling"] == 32   # the trained length


@pytest.mark.parametrize("sliding_tokens", [300, 700, 2100])
def test_sliding_tokens_reproduces_the_labs_sliding_rows(exported, text_file, sliding_tokens, tmp_path, capsys):
    """posenc eval --sliding-tokens N scores N tokens per sliding length, as the lab's --sliding-tokens does (the
    lab's own sliding loop is the oracle); the non-overlapping rows keep --eval-tokens."""
    ckpt, folder = exported
    assert eval_main([str(folder), "--data", text_file, "--eval-lens", f"{TRAIN_LEN},{2 * TRAIN_LEN}",
                      "--eval-tokens", "1500", "--sliding-lens", str(2 * TRAIN_LEN), "--sliding-stride", "16",
                      "--sliding-tokens", str(sliding_tokens), "--tasks", "lm", "--no-progress",
                      "--out", str(tmp_path / "e")]) == 0
    doc = json.loads((tmp_path / "e" / "results.json").read_text())
    for r in doc["results"]:
        sliding = r["protocol"] != "non-overlapping"
        want = lab_ppl(ckpt, text_file, None, r["eval_len"], 16 if sliding else None,
                       n_tokens=sliding_tokens if sliding else 1500)
        assert r["value"] == pytest.approx(want, rel=1e-4), r
    assert doc["meta"]["settings"]["sliding_tokens"] == sliding_tokens
    assert f"({sliding_tokens} per sliding length)" in (tmp_path / "e" / "report.md").read_text()
    capsys.readouterr()
    assert eval_main([str(folder), "--sliding-tokens", "0", "--out", str(tmp_path / "f")]) == 2
    assert "--sliding-tokens must be an integer in [1, " in capsys.readouterr().err
