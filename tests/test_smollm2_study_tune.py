"""The SmolLM2 study as tune runs (scripts/smollm2_study.py TUNES): each run's candidates, parsed by posenc tune's
own parser and planned by its own code, measure every row of the parts it stands for, with the settings those parts
ran (the window's tokens, dtype, factor, each attention method's resolved rule); a finished run's rows then give the
same tables as the parts' rows, and ``check`` tells a differing window. No model runs: the tune runs' results.json
files are written by the test from the committed rows (the values the runs would reproduce)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "smollm2_study.py"
COMMITTED = ROOT / "docs" / "results" / "smollm2"
TRAINED = 8192


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STUDY = _module("smollm2_study_tune_under_test")


def _config() -> dict:
    """SmolLM2-135M's config as results.json records its identity (what candidates and the report read of it)."""
    m = json.loads((COMMITTED / "results.json").read_text())["model"]
    return {"model_type": m["model_type"], "hidden_size": m["hidden_size"], "intermediate_size": 1536,
            "num_hidden_layers": m["num_hidden_layers"], "num_attention_heads": m["num_attention_heads"],
            "num_key_value_heads": m["num_key_value_heads"], "vocab_size": m["vocab_size"],
            "rope_theta": m["rope_theta"], "max_position_embeddings": m["original_context"]}


def _tune_args(name: str):
    from posenc._internal.faults import Parser
    from posenc.hf.tune.command import add_arguments

    parser = Parser(prog="posenc tune")
    add_arguments(parser)
    return parser.parse_args(["MODEL", *STUDY.TUNES[name]["args"], *STUDY.TUNE_COMMON])


def _candidates(name: str):
    from posenc.hf.tune import plan as planning

    args = _tune_args(name)
    cands, skipped = planning.candidates(_config(), TRAINED, args.target_length, args.methods, None,
                                         args.method_options)
    assert not skipped, skipped
    return args, cands


def _parts(name: str) -> dict:
    return {p: json.loads((COMMITTED / "parts" / p / "results.json").read_text()) for p in STUDY.TUNES[name]["parts"]}


def _rule(method: str, options: dict, target: int) -> dict:
    from posenc.attention import attention_rule
    from posenc.extensions import ExtensionSpec

    spec = ExtensionSpec(original=TRAINED, factor=target / TRAINED, rotary_dim=None, target=target)
    rule = attention_rule(method, spec, **options)
    return {"name": rule.name, **rule.params(), "keeps": rule.keeps}


@pytest.mark.parametrize("name", list(STUDY.TUNES))
def test_each_tune_run_measures_its_parts_rows_with_their_settings(name):
    from posenc.hf.tune import measure

    args, cands = _candidates(name)
    target = args.target_length
    assert args.race == "none" and args.search == "none" and args.dtype == "bfloat16"
    covered = set()
    for c in cands:
        for w in range(args.windows):
            s = measure.eval_settings(c, length=target, trained=TRAINED, target=target, window=w, data=args.data,
                                      dtype=args.dtype, device="cpu")
            found = [(p, d) for p, d in _parts(name).items() if c.method in d["meta"]["methods"]
                     and (d["meta"]["settings"].get("eval_offset") or 0) == s.eval_offset]
            assert len(found) == 1, (c.name, w, [p for p, _ in found])
            part, doc = found[0]
            ran = doc["meta"]["settings"]
            assert (ran["eval_lens"], ran["eval_tokens"], ran["sliding_stride"], ran["dtype"]) == \
                (s.eval_lens, s.eval_tokens, s.sliding_stride, s.dtype), (c.name, part)
            assert (ran["data"] is None) == (s.data is None), (c.name, part)       # the same text
            recorded = doc["meta"]["methods"][c.method].get("attention_rule")
            if c.kind == "config":
                # (the unchanged model runs whatever the factor: eval extends nothing for none)
                assert recorded is None and (c.method == "none" or ran["factor"] == s.factor), (c.name, part)
            elif part == "cpython-16k-attn2-w1" and c.method == "leaky-rerope":
                # the one rule that differs: this part derived the leak for 4 x 8192 (7.0015), the other windows
                # and the tune run give 7 (TUNES' comment)
                assert _rule(c.method, c.options, target)["leak"] == 7 and recorded["leak"] == pytest.approx(7, 1e-3)
            else:
                assert _rule(c.method, c.options, target) == recorded, (c.name, part)
            covered.add((part, c.method))
    rows = {(p, r["scaling"]) for p, d in _parts(name).items() for r in d["results"] if r["task"] == "lm"}
    assert rows == covered            # every row of the parts, and nothing else


def _fake_tune_results(name: str, folder: Path, scale: float = 1.0) -> None:
    """A finished tune run's results.json whose windows hold the committed rows' values (times ``scale``)."""
    args, cands = _candidates(name)
    target = args.target_length
    values = {}
    for part, doc in _parts(name).items():
        offset = doc["meta"]["settings"].get("eval_offset") or 0
        for r in doc["results"]:
            values[(r["scaling"], offset // target)] = r["value"]
    measurements = {f"{c.name}@{target}#{w}": math.log(scale * values[(c.method, w)])
                    for c in cands for w in range(args.windows)}
    measurements[f"none@{TRAINED}#0"] = 1.5
    plan = {"target": target, "trained": TRAINED, "peak_flops": 2e11,
            "candidates": [{"name": c.name, "method": c.method, "kind": c.kind, "options": c.options}
                           for c in cands]}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"key": {"data": args.data}, "measurements": measurements,
                                                     "plan": plan, "spent_s": 100.0}))


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The script with the committed part files, a finished tune run for every TUNES entry whose windows hold the
    parts' values, and the model's config, all in tmp_path."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = _module("smollm2_study_tune_collect")
    shutil.copytree(COMMITTED / "parts", tmp_path / "parts")
    for name in module.TUNES:
        _fake_tune_results(name, tmp_path / "tune" / name)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(_config()))
    monkeypatch.setattr(module, "OUT", tmp_path)
    monkeypatch.setattr(module, "MODEL_DIR", tmp_path / "model")
    return module


def test_finished_tune_runs_give_the_committed_tables(study):
    from posenc.tools.evidence import zero_shot

    committed = json.loads((COMMITTED / "results.json").read_text())
    tuned = study.study_document()
    assert {p for p in tuned["parts"] if p.startswith("tune:")} == {f"tune:{n}" for n in study.TUNES}
    assert not set(tuned["parts"]) & set(study.COVERED)          # the parts the runs stand for are left out
    for length in (8192, 16384, 32768):
        for text in ("cpython", "prose"):
            old, new = zero_shot(committed, length, text), zero_shot(tuned, length, text)
            assert [e["method"] for e in new] == [e["method"] for e in old], (length, text)
            for a, b in zip(old, new):
                assert (a["windows"], a["offsets"], a["tokens"]) == (b["windows"], b["offsets"], b["tokens"])
                assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-12)
                assert (a["std"] is None) == (b["std"] is None) and (a["std"] is None or
                                                                     b["std"] == pytest.approx(a["std"], rel=1e-9))
    report = sys.modules.get("smollm2_study_report") or __import__("smollm2_study_report")
    text = report.report(tuned, report.result_tables(tuned, study), study)
    assert "## Reproducing it with `posenc tune`" in text and "| cpython-16k | `posenc tune " in text
    assert "exact within 2048, grouped by 4 beyond" in report.attention_table(tuned)   # the rule, from the run


def test_check_compares_each_window_with_the_parts_row(study, capsys, tmp_path):
    assert study.main(["check"]) == 0
    out = capsys.readouterr().out
    assert "DIFFERENT" not in out and "cpython-16k none@16384#2: tune " in out
    shutil.rmtree(tmp_path / "tune" / "prose-32k")
    _fake_tune_results("prose-32k", tmp_path / "tune" / "prose-32k", scale=1.001)
    assert study.main(["check"]) == 1
    out = capsys.readouterr().out
    assert out.count("DIFFERENT to 4 significant digits") == 4 and "prose-32k sinks@32768#0" in out
