"""`posenc lab` end to end: the smoke preset writes a complete results file, report and plots; --resume reuses
the checkpoints; bad settings fail with one clear line."""

from __future__ import annotations

import json

import pytest

from posenc.cli import main
from posenc.lab.presets import PRESETS, get_preset
from posenc._internal.errors import ConfigError
from posenc.schemes import scheme_names

FIELDS = {"task", "scheme", "scaling", "finetuned", "train_len", "eval_len", "metric", "value", "seed"}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    assert main(["lab", "--preset", "smoke", "--out", str(out), "--no-progress"]) == 0
    return out


def test_smoke_writes_results_report_and_plots(smoke_run, capsys):
    doc = json.loads((smoke_run / "results.json").read_text())
    meta, results = doc["meta"], doc["results"]
    assert meta["data"]["python_version"] and meta["data"]["files_sha256"] and meta["wall_s"] > 0
    assert all(FIELDS <= set(r) for r in results)
    assert {r["task"] for r in results} == {"lm", "copy", "passkey"}
    assert {r["scheme"] for r in results} == set(scheme_names())  # every registered scheme runs in smoke
    randomized = [r for r in results if r.get("positions")]
    assert randomized and {(r["scheme"], r["positions"], r["scaling"]) for r in randomized} == {
        ("rope", "randomized N=384", "none")}
    assert {r["metric"] for r in results} == {"ppl", "exact_match", "token_accuracy"}
    assert {r["scaling"] for r in results} == {"none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope-search",
                                               "pose-yarn"}
    # CI runs the fine-tune, the search and PoSE: fine-tuned rows per method, PoSE only fine-tuned
    assert {r["scaling"] for r in results if r["finetuned"]} == {r["scaling"] for r in results}
    assert {r["scaling"] for r in results if not r["finetuned"] and r["scheme"] == "rope"} == {
        "none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope-search"}
    assert all(r["finetune"]["tokens"] > 0 for r in results if r["finetuned"])
    assert all(v["fit"]["longrope-search"]["evaluations"] > 0 for v in meta["extensions"].values())
    assert all(r["scheme"] == "rope" for r in results if r["scaling"] != "none")
    train_len = results[0]["train_len"]
    for r in results:
        if r["scheme"] == "learned" and r["eval_len"] > train_len:
            assert r["value"] is None and r["note"] == f"n/a (table = {train_len})"
        else:
            assert r["value"] is not None and r["value"] >= 0
    yarn = [r for r in results if r["scaling"] == "yarn"]
    assert all(sum(r["bands"][k] for k in ("kept", "blended", "interpolated")) == 8 for r in yarn)
    report = (smoke_run / "report.md").read_text()
    assert "Measured wall time" in report and "n/a (table = 96)" in report and "rope + YaRN, zero-shot" in report
    assert "rope, positions randomized N=384" in report
    for png in ("ppl_vs_length.png", "per_position_loss.png", "copy_accuracy.png", "passkey_accuracy.png"):
        assert (smoke_run / png).read_bytes()[:4] == b"\x89PNG"
    assert not list(smoke_run.glob(".*tmp*"))  # atomic writes leave no temporaries


def test_resume_skips_finished_training_and_reproduces(smoke_run):
    before = json.loads((smoke_run / "results.json").read_text())["results"]
    assert main(["lab", "--preset", "smoke", "--out", str(smoke_run), "--no-progress", "--resume",
                 "--tasks", "lm"]) == 0
    after = json.loads((smoke_run / "results.json").read_text())
    # nothing retrained: no unit ran a training step in this process (throughput is recorded only for steps run;
    # a wall-clock bound failed when auto jobs started workers, whose first unit pays their start-up)
    assert after["meta"]["timings_s"] and not any("tokens_per_s" in v for v in after["meta"]["timings_s"].values())
    key = ("scheme", "positions", "scaling", "eval_len", "protocol")
    want = {tuple(r.get(k) for k in key): r["value"] for r in before if r["task"] == "lm"}
    got = {tuple(r.get(k) for k in key): r["value"] for r in after["results"]}
    assert got == want


@pytest.mark.parametrize("argv,match", [
    (["--data", "/no/such/corpus"], "--data: /no/such/corpus does not exist"),
    (["--schemes", "rope,t6"], "--schemes: expected one of nope, sinusoidal"),
    (["--randomized-positions", "50"], "--randomized-positions must be 0 (off) or >= --train-len (96)"),
    (["--randomized-schemes", "learned"], "the learned scheme has no encoding past its table of 96 positions"),
    (["--methods", "yarn,rerope2"], "--methods: expected one of linear, ntk"),
    (["--methods", "rerope", "--method-options", "rerope.leak=2"], "--method-options: rerope takes no option"),
    (["--methods", "rerope", "--method-options", "dca.chunk_size=2"], "--method-options: expected method.option"),
    (["--heads", "3"], "--d-model must be divisible by --heads (3), got 32"),
    (["--mlp-ratio", "0"], "--mlp-ratio must be a positive integer, got 0"),
    (["--plugin", "/no/such/plugin.py"], "plugin /no/such/plugin.py: no such file"),
    (["--eval-lens", "1"], "--eval-lens"),
    (["--d-model", "30"], "--d-model"),
    (["--tasks", "passkey", "--train-len", "40"], "passkey episodes need at least"),
    (["--schemes", "rope", "--scheme-options", "cope_npos=8"], "--scheme-options: cope_npos is an option of cope, "
     "which is not among the schemes of this run (rope); add it to schemes or drop cope_npos"),
    # an extension option's value is checked before any model trains (no checkpoint is written), naming it
    (["--methods", "self-extend", "--method-options", "self-extend.window=-1"],
     "--method-options: self-extend.window must be a positive integer, got -1"),
    (["--methods", "dca", "--method-options", "dca.chunk_size=abc"],
     "--method-options: dca.chunk_size must be an integer >= 2, got 'abc'"),
    (["--methods", "leaky-rerope", "--method-options", "leaky-rerope.leak=0.5"],
     "--method-options: leaky-rerope.leak must be a finite number >= 1.0, got 0.5"),
    (["--methods", "self-extend", "--method-options", "self-extend.window=NaN"],
     "--method-options: self-extend.window must be a finite number, got nan"),
    (["--methods", "leaky-rerope", "--method-options", "leaky-rerope.leak=Infinity"],
     "--method-options: leaky-rerope.leak must be a finite number, got inf"),
    (["--schemes", "rope,alibi", "--scheme-options", "t5_buckets=8,fire_width=4"],
     "--scheme-options: t5_buckets is an option of t5, which is not among the schemes of this run (rope, alibi)"),
])
def test_bad_settings_fail_with_one_line(tmp_path, capsys, argv, match):
    assert main(["lab", "--preset", "smoke", "--out", str(tmp_path), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error:") and match in err and "\n" not in err, err
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results.json").exists()  # nothing ran


def test_model_flags_reach_the_model_config():
    import argparse

    from posenc.lab.cli import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--preset", "copy-cpu", "--d-model", "96", "--mlp-ratio", "1"]))
    model = cfg.model_config("nope")
    assert (model.d_model, model.mlp_ratio, model.n_heads, model.n_layers) == (96, 1, 2, 4)
    assert get_preset("copy-cpu").model_config("nope").mlp_ratio == 4  # the preset itself is unchanged


def test_every_preset_is_valid_and_default_reaches_8x():
    for name in PRESETS:
        get_preset(name)
    d = get_preset("default")
    assert max(d.eval_lens) >= 8 * d.train_len and d.schemes == ["nope", "sinusoidal", "learned", "rope", "alibi"]
    assert get_preset("copy").model.n_layers == 4 and get_preset("copy").train_len == 512
    assert max(get_preset("copy").eval_lens) == 2048
    ntk = get_preset("ntk")
    assert ntk.train_len == 256 and max(ntk.eval_lens) == 1024 and "ntk" in ntk.extensions
    with pytest.raises(ConfigError, match="preset: expected one of"):
        get_preset("huge")
    smoke = get_preset("smoke")  # "all": every registered task and scheme
    assert smoke.tasks == ["lm", "copy", "passkey"] and smoke.schemes[:6] == [
        "nope", "sinusoidal", "learned", "rope", "alibi", "rope+alibi"]
    assert get_preset("smoke", d_model=48, steps=7).model.d_model == 48  # flat names reach their section
    assert get_preset("smoke", steps=7).train.steps == 7
    with pytest.raises(ConfigError, match="unknown lab settings: depth"):
        get_preset("smoke", depth=3)


def test_finetune_adds_finetuned_rows_per_method(tmp_path):
    from posenc.lab.run import run_lab

    cfg = get_preset("smoke", tasks=["lm"], schemes=["rope"], extensions=["yarn"], finetune_steps=2,
                     sliding_stride=0, out=str(tmp_path), steps=3)
    doc = run_lab(cfg, progress=False, log=lambda *a: None)
    ft = {(r["scaling"], r["eval_len"]) for r in doc["results"] if r["finetuned"]}
    assert ft == {(m, L) for m in ("none", "yarn") for L in cfg.eval_lens}
    assert (tmp_path / "checkpoints" / "lm-rope-ft-yarn-seed0.safetensors").exists()
    assert "rope + YaRN, fine-tuned" in (tmp_path / "report.md").read_text()


def test_several_seeds_report_mean_and_std(tmp_path):
    from posenc.lab.run import run_lab

    cfg = get_preset("smoke", tasks=["lm"], schemes=["alibi"], extensions=[], sliding_stride=0, seeds=[0, 1],
                     out=str(tmp_path), steps=2)
    rows = run_lab(cfg, progress=False, log=lambda *a: None)["results"]
    assert all(r["seed"] == [0, 1] and len(r["values"]) == 2 for r in rows)
    for r in rows:
        mean = sum(r["values"]) / 2
        assert r["value"] == pytest.approx(mean) and r["std"] == pytest.approx(abs(r["values"][0] - mean) * 2 ** 0.5)
    assert " ± " in (tmp_path / "report.md").read_text()


def test_sliding_stride_defaults_to_half_the_window_and_is_validated(tmp_path):
    from posenc.lab.run import run_lab

    cfg = get_preset("smoke", tasks=["lm"], schemes=["nope"], extensions=[], sliding_stride=-1, sliding_lens=[],
                     eval_lens=[32, 64], out=str(tmp_path), steps=1)
    rows = run_lab(cfg, progress=False, log=lambda *a: None)["results"]
    assert {r["protocol"] for r in rows} == {"non-overlapping", "sliding (stride 32)"}
    get_preset("default", tasks=["copy"], eval_lens=[16, 32])  # no LM task: the LM-only stride is not checked
    with pytest.raises(ConfigError, match="sliding_stride"):
        get_preset("default", eval_lens=[16, 32], sliding_stride=64)
