"""posenc eval of a posenc export reads the training length the export recorded (posenc_export.json), for every
exportable scheme: an MPT (ALiBi) or GPT-2 (sinusoidal) config holds only its position limit, and reading that as
the trained context would report every row against the wrong length."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers", minversion="5.0", reason="transformers >= 5")

from posenc.hf.evaluate import eval_main, original_context, read_config  # noqa: E402
from posenc.hf.export import export_lab_model  # noqa: E402
from posenc_hf_folders import lab_run  # noqa: E402

CASES = [("alibi", {"bias": False}, 32), ("sinusoidal", {}, 32), ("learned", {}, 32), ("rope", {}, 32),
         ("alibi", {"bias": False, "max_len": 48}, 48), ("sinusoidal", {"max_len": 40}, 40)]


@pytest.mark.parametrize("scheme, extra, train_len", CASES)
def test_eval_uses_the_recorded_training_length(tmp_path, capsys, scheme, extra, train_len):
    run = lab_run(tmp_path / "run", scheme=scheme, **extra)
    out = tmp_path / "exported"
    export_lab_model(run, out, scheme=scheme, check=False)
    assert json.loads((out / "posenc_export.json").read_text())["train_len"] == train_len
    assert original_context(read_config(out), out) == train_len
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    assert eval_main([str(out), "--data", str(text), "--eval-lens", str(train_len), "--eval-tokens", "64",
                      "--sliding-stride", "0", "--tasks", "lm", "--no-progress", "--out", str(tmp_path / "e")]) == 0
    doc = json.loads((tmp_path / "e" / "results.json").read_text())
    assert {r["train_len"] for r in doc["results"]} == {train_len}


def test_an_older_export_without_the_field_falls_back_to_the_lab_settings(tmp_path):
    run = lab_run(tmp_path / "run", scheme="alibi", bias=False)
    out = tmp_path / "exported"
    export_lab_model(run, out, scheme="alibi", check=False)
    record = json.loads((out / "posenc_export.json").read_text())
    del record["train_len"]
    (out / "posenc_export.json").write_text(json.dumps(record))
    assert original_context(read_config(out), out) == 32
    (out / "posenc_export.json").write_text("[" * 10_000)     # a damaged record: the config's own reading
    assert original_context(read_config(out), out) == original_context(read_config(out))
