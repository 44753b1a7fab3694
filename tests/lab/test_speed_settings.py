"""The lab's speed settings: --precision (fp32 / bf16 / auto resolution, bf16 autocast in training and evaluation
with the attention kept in fp32 on the CPU, the setting in checkpoints and results, its errors) and --threads auto
(the idle cores)."""

from __future__ import annotations

import os

import pytest
import torch

import posenc.lab.precision as precision
import posenc.nn.attention as attention
from posenc.cli import main
from posenc._internal.errors import CheckpointError, ConfigError
from posenc.lab.data import LMSampler
from posenc.lab.precision import autocast, native_bf16, resolve_precision
from posenc.lab.train import TrainSettings, train
from posenc.nn.model import ModelConfig, TinyLM


def _model(scheme="rope"):
    torch.manual_seed(0)
    return TinyLM(ModelConfig(scheme=scheme, d_model=32, n_layers=2, n_heads=4, max_len=32))


def test_auto_follows_the_cpu_flags(monkeypatch):
    assert resolve_precision("fp32") == "fp32" and resolve_precision("bf16") == "bf16"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    for flags, want in ((set(), "fp32"), ({"avx512f", "avx512_bf16"}, "bf16"), ({"amx_bf16"}, "bf16")):
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert native_bf16("cpu") == (want == "bf16")
        assert resolve_precision("auto", "cpu") == want
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AMX")  # no flags file, torch knows
    assert resolve_precision("auto", "cpu") == "bf16"


@pytest.mark.parametrize("bad", ["fp16", "BF16", None, 32])
def test_bad_precision_names_the_setting(bad):
    with pytest.raises(ConfigError, match="precision: expected one of fp32, bf16, auto"):
        resolve_precision(bad)


def test_bf16_runs_projections_in_bf16_and_attention_in_fp32(monkeypatch):
    """Under the lab's bf16 the linear layers see bf16 inputs; on the CPU the inputs of SDPA are float32."""
    model, seen = _model("alibi"), []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, kw["attn_mask"].dtype if kw.get("attn_mask") is not None else None))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        ref = model(tokens)
        with autocast("bf16"):
            got = model(tokens)
    assert seen[-1] == (torch.float32, torch.float32) and len(seen) == 4
    assert got.dtype == torch.bfloat16  # the tied head ran in bf16
    torch.testing.assert_close(got.float(), ref, atol=0.1, rtol=0.05)  # bf16 rounding, same model
    monkeypatch.setattr(attention, "CPU_FP32_ATTENTION", False)  # plain autocast: attention in bf16
    with torch.no_grad(), autocast("bf16"):
        model(tokens)
    assert seen[-1][0] == torch.bfloat16


def test_bf16_training_learns_and_is_recorded_in_the_checkpoint(tmp_path):
    tokens = torch.tensor(list(b"abcdefgh" * 400), dtype=torch.uint8)
    sampler, ckpt = LMSampler(tokens, 16, 8, 0), tmp_path / "m.safetensors"
    settings = TrainSettings(steps=40, warmup=4, lr=1e-2)
    model = _model()
    r = train(model, sampler, settings, ckpt_path=ckpt, progress=False, precision="bf16")
    assert r["losses"][-1] < 0.5 * r["losses"][0]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    with pytest.raises(CheckpointError, match="different settings"):  # fp32 must not resume a bf16 run
        train(_model(), sampler, settings, ckpt_path=ckpt, resume=True, progress=False)
    again = train(_model(), sampler, settings, ckpt_path=ckpt, resume=True, progress=False, precision="bf16")
    assert again["resumed_from"] == 40


def test_lab_records_precision_and_threads(tmp_path):
    import json

    out = tmp_path / "run"
    assert main(["lab", "--preset", "smoke", "--tasks", "lm", "--schemes", "rope", "--extensions", "none",
                 "--precision", "bf16", "--threads", "1", "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["precision"] == "bf16" and meta["threads"] == 1 and meta["settings"]["precision"] == "bf16"
    timing = meta["timings_s"]["lm/rope/seed0"]
    assert timing["tokens_per_s"] > 0 and timing["gflops"] > 0


def test_cli_rejects_an_unknown_precision(tmp_path, capsys):
    assert main(["lab", "--preset", "smoke", "--out", str(tmp_path), "--quiet", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error:") and "--precision: expected one of fp32, bf16, auto" in err


@pytest.mark.parametrize("load,cores,default,want", [(0.0, 2, 2, 2), (0.4, 2, 2, 2), (1.2, 2, 2, 1), (5.0, 2, 2, 1),
                                                     (0.0, 2, 1, 1), (1.0, 8, 8, 7)])
@pytest.mark.parametrize("source", ["sampled", "load average"])
def test_auto_threads_uses_the_idle_cores(monkeypatch, load, cores, default, want, source):
    # busy cores sampled now; the 1-minute load average only where /proc/stat cannot be read
    from posenc.lab import run

    lagging = 9.0 if source == "sampled" else load          # a load average still high from a finished job
    monkeypatch.setattr(os, "getloadavg", lambda: (lagging, lagging, lagging))
    monkeypatch.setattr(run, "busy_cores", lambda: load if source == "sampled" else None)
    monkeypatch.setattr(run, "cpu_cores", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: default)
    assert run.auto_threads() == want


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc/stat")
def test_busy_cores_sees_another_process_and_not_this_one():
    import subprocess
    import sys
    import time

    from posenc.lab import run

    start = time.process_time()
    while time.process_time() - start < 0.3:                 # this process's own work is not "other" work
        pass
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.5)                                      # (interpreter start-up)
        assert run.busy_cores(0.5) >= 0.6
    finally:
        spinner.kill()
        spinner.wait()
