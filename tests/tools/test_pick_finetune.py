"""posenc pick --budget finetune cites a committed fine-tune study of the very model (posenc.tools.pick_finetune):
each fine-tuned method's perplexity at the target beside the best zero-shot method's on the same window, its passkey
there and the fine-tune's cost; another model or another budget cites nothing of it. Studies here are written by
the test, except the last test, whose oracle is the committed docs/results/smollm2-finetune/results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.tools import evidence
from posenc.tools.pick import pick

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 1024, "head_dim": 16,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def _run(method: str) -> dict:
    return {"steps": 200, "tokens": 409600, "train_s": 3000.0, "torch_threads": 2,
            "extension": {"method": method, "factor": 4.0}}


def _study(root, values: dict, length=4096, passkey=(1.0, 1.0, 0.0)):
    rows = []
    for run, value in values.items():
        rows.append({"task": "lm", "scaling": "none", "eval_len": length, "value": value, "run": run,
                     "text": "cpython", "zero_shot": {"yarn": 6.5, "sinks": 5.75}})
        rows += [{"task": "passkey", "scaling": "none", "eval_len": length, "value": v, "depth": d, "run": run}
                 for v, d in zip(passkey, (0.1, 0.5, 0.9))]
    folder = root / "tiny-finetune"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({
        "study": "real-model-finetune", "name": "tiny", "model": evidence.identity(CONFIG),
        "report": "docs/results/tiny-finetune/report.md",
        "runs": {run: _run("yarn" if run.startswith("yarn") else "linear") for run in values}, "rows": rows}))


def test_budget_finetune_cites_the_measured_fine_tunes(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"yarn-pose": 5.41, "pi-pose": 5.62})
    rec = pick(4096, budget="finetune", config=CONFIG)
    cited = rec.reasons[0]
    assert cited.startswith("measured on this model (tiny; docs/results/tiny-finetune/report.md)")
    assert "YaRN fine-tuned with PoSE + LoRA (200 steps, 409,600 tokens, 50 min of training on 2 CPU threads) 5.41" \
        in cited
    assert "against the best zero-shot method's (sinks) 5.75 on the same window; passkey 2/3" in cited
    assert cited.index("5.41") < cited.index("5.62")            # best first
    assert not any("measured better" in n for n in rec.notes)   # the recommended YaRN measured best


def test_a_better_other_method_is_noted_and_the_recommendation_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"yarn-pose": 5.9, "pi-pose": 5.5})
    rec = pick(4096, budget="finetune", config=CONFIG)
    assert rec.parameters["rope_type"] == "yarn"
    assert any("measured better after the same fine-tune than the recommended yarn" in n for n in rec.notes)


def test_other_lengths_models_and_budgets_cite_no_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RESULTS", tmp_path)
    _study(tmp_path, {"yarn-pose": 5.41})
    at8k = pick(8192, budget="finetune", config=CONFIG)
    assert not at8k.reasons[0].startswith("measured") and any("measured lengths [4096], not 8,192" in n
                                                             for n in at8k.notes)
    other = pick(4096, budget="finetune", config={**CONFIG, "hidden_size": 128})
    assert not any("tiny" in r for r in other.reasons + other.notes)
    as_is = pick(4096, budget="none", config=CONFIG)
    assert not any("fine-tuned with PoSE" in r for r in as_is.reasons)


def test_the_committed_study_is_cited_for_smollm2():
    """The shipped extract: SmolLM2's config at 32k with a fine-tuning budget cites the committed fine-tuned
    perplexity and the best zero-shot perplexity on its window, read here from the full results."""
    full = json.loads((ROOT / "docs" / "results" / "smollm2-finetune" / "results.json").read_text(encoding="utf-8"))
    rows = [r for r in full["rows"] if r["task"] == "lm" and r["eval_len"] == 32768 and r["text"] == "cpython"]
    assert rows
    config = {k: v for k, v in full["model"].items() if k not in ("rope_theta", "original_context")}
    config.update(max_position_embeddings=full["model"]["original_context"],
                  rope_parameters={"rope_type": "default", "rope_theta": full["model"]["rope_theta"]})
    rec = pick(32768, budget="finetune", config=config)
    cited = rec.reasons[0]
    for r in rows:
        best = min(r["zero_shot"].values())
        assert f"{r['value']:.2f} against the best zero-shot method's" in cited and f"{best:.2f}" in cited
