"""Per-scheme step multipliers (LabConfig.scheme_step_scale, --scheme-step-scale): the steps each model trains,
the schedule they follow, validation by name, the CLI flag and the report line."""

from __future__ import annotations

import argparse

import pytest

from posenc.cli import main
from posenc._internal.errors import CheckpointError, ConfigError
from posenc.lab.presets import get_preset
from posenc.lab.train import checkpoint_step


def test_steps_follow_the_multiplier_and_the_step_count():
    cfg = get_preset("copy-cpu")
    assert [cfg.steps_for(s) for s in ("nope", "alibi", "rope", "kerple")] == [3000, 3000, 2500, 2500]
    cfg = get_preset("copy-cpu", steps=1000)  # a multiplier follows --steps instead of pinning a count
    assert cfg.steps_for("nope") == 1200 and cfg.steps_for("rope") == 1000
    assert get_preset("smoke", steps=7, scheme_step_scale={"rope": 1.5}).steps_for("rope") == 10  # 10.5 -> 10


def test_a_lab_run_trains_each_scheme_for_its_steps(tmp_path, monkeypatch):
    import posenc.lab.run as run_module
    from posenc.lab.run import run_lab

    seen = {}
    train = run_module.train

    def spy(model, sampler, settings, *args, **kwargs):  # the schedule's length is the scheme's own step count
        seen[model.cfg.scheme] = (settings.steps, settings.warmup)  # warmup: at most a tenth of each
        return train(model, sampler, settings, *args, **kwargs)

    monkeypatch.setattr(run_module, "train", spy)
    common = dict(tasks=["copy"], schemes=["rope", "nope"], extensions=[], seeds=[0], steps=10, warmup=2,
                  train_len=16, batch_size=2, eval_lens=[16], jobs=1, randomized_positions=0, finetune_steps=0,
                  out=str(tmp_path))
    run_lab(get_preset("smoke", scheme_step_scale={"nope": 2.0}, **common), progress=False, log=lambda *a: None)
    assert seen == {"rope": (10, 1), "nope": (20, 2)}
    assert checkpoint_step(tmp_path / "checkpoints" / "copy-nope-seed0.safetensors") == 20
    assert checkpoint_step(tmp_path / "checkpoints" / "copy-rope-seed0.safetensors") == 10
    report = (tmp_path / "report.md").read_text()
    assert "10 AdamW steps (x 2 for nope: 20; each its own cap and schedule)" in report
    assert "## Settings (identical for every scheme but the steps listed per scheme)" in report
    # a checkpoint records its model's steps: resuming with another multiplier is refused, not silently mixed
    with pytest.raises(CheckpointError, match="different settings"):
        run_lab(get_preset("smoke", scheme_step_scale={"nope": 3.0}, **common), resume=True, progress=False,
                log=lambda *a: None)


@pytest.mark.parametrize("scale, match", [
    ({"t6": 1.2}, "scheme_step_scale: expected one of"),
    ({"nope": 0.0}, "scheme_step_scale \\(nope\\) must be a positive finite number, got 0.0"),
    ({"nope": 1e-6}, "steps x scheme_step_scale \\(nope\\) must be an integer in \\[1, "),
    ([["nope", 1.2]], "scheme_step_scale: expected scheme:multiplier pairs"),
    ({"nope": 0.2}, "length_warmup: its 600 steps leave none of the 500 steps"),
])
def test_bad_multipliers_are_refused_by_name(scale, match):
    with pytest.raises(ConfigError, match=match):
        get_preset("copy-cpu", scheme_step_scale=scale)


def test_the_cli_flag(tmp_path, capsys):
    from posenc.lab.cli import _scheme_scales

    assert _scheme_scales("nope:1.2, alibi:2") == {"nope": 1.2, "alibi": 2.0} and _scheme_scales("none") == {}
    with pytest.raises(argparse.ArgumentTypeError, match="scheme:multiplier pairs"):
        _scheme_scales("nope=1.2")
    assert main(["lab", "--preset", "smoke", "--out", str(tmp_path), "--quiet", "--scheme-step-scale",
                 "rope:-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error:") and "--scheme-step-scale (rope) must be a positive" in err
