"""Settings that were accepted and then ignored or misread: each now gives a clear one-line error naming the
setting (several members of each class tried)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import posenc
from posenc.cli import main
from posenc._internal.errors import ConfigError, PosencError
from posenc.lab.presets import get_preset
from posenc.schemes import make_scheme

TINY = ["--preset", "smoke", "--tasks", "lm", "--seeds", "0", "--threads", "1", "--quiet"]


def refused(capsys, tmp_path, argv) -> str:
    assert main(["lab", *TINY, *argv, "--out", str(tmp_path / "o")]) == 2, argv
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc lab: error: ") and "\n" not in err and "internal error" not in err, err
    assert not (tmp_path / "o").exists()
    return err


@pytest.mark.parametrize("options, word", [
    ("t5_bucket=0", "t5_bucket is not an option of any registered scheme"),
    ("cope_nposs=8", "cope_nposs is not an option"),
    ("nope_every=2,flor_scale=3", "flor_scale is not an option"),
    ("t5_buckets=8,t5_buckets=16", "t5_buckets is given more than once"),
    ("attn_scale=0.1,attn_scale=0.1", "attn_scale is given more than once"),
])
def test_scheme_options_unknown_or_repeated_keys(tmp_path, capsys, options, word):
    assert word in refused(capsys, tmp_path, ["--schemes", "t5,irope", "--scheme-options", options])


@pytest.mark.parametrize("options, word", [
    ("cope_npos=100000000", "--scheme-options cope_npos must be an integer in [1, 131072]"),
    ("t5_buckets=100000000", "t5_buckets must be an integer in [1, 65536]"),
    ("fire_width=100000000", "fire_width must be an integer in [1, 16384]"),
    ("attn_scale=-1", "attn_scale must be a finite number >= 0.0"),
])
def test_scheme_option_sizes_and_signs_are_bounded(tmp_path, capsys, options, word):
    err = refused(capsys, tmp_path, ["--schemes", "cope,t5,fire,irope", "--scheme-options", options])
    assert word.split(" ", 2)[-1] in err, err


@pytest.mark.parametrize("argv, word", [
    (["--schemes", "rope", "--randomized-positions", "384", "--randomized-schemes", "alibi"],
     "--randomized-schemes: alibi is not among the schemes of this run (rope)"),
    (["--schemes", "rope,alibi", "--randomized-positions", "384", "--randomized-schemes", "rope,t5,fire"],
     "--randomized-schemes: t5, fire are not among the schemes of this run"),
    (["--schemes", "rope", "--randomized-positions", "0", "--randomized-schemes", "rope"],
     "--randomized-schemes: randomized positions are off"),
    (["--schemes", "rope", "--scheme-step-scale", "alibi:1.2"], "--scheme-step-scale: alibi is not among"),
    (["--schemes", "rope", "--finetune-steps", "1", "--extensions", "linear", "--finetune-len", "64"],
     "--finetune-len must be 0 (the longest eval length) or >= --train-len (96)"),
    (["--schemes", "rope", "--finetune-steps", "1", "--extensions", "linear", "--finetune-len", "95"],
     "--finetune-len must be 0"),
])
def test_per_scheme_and_length_settings_that_would_be_ignored(tmp_path, capsys, argv, word):
    assert word in refused(capsys, tmp_path, argv)


def test_a_presets_own_per_scheme_entries_still_outlive_schemes():
    cfg = get_preset("smoke", schemes=["alibi"], tasks=["lm"])   # the preset's randomized_schemes = [rope]
    assert cfg.randomized_scheme_names() == []
    cfg = get_preset("copy-cpu", schemes=["rope"], seeds=[0])     # the preset's nope:1.2, alibi:1.2
    assert cfg.steps_for("rope") == cfg.train.steps


@pytest.mark.parametrize("scale", [-1, -0.5, -1e-9, float("nan"), float("-inf")])
def test_irope_attention_temperature_refuses_negative_scales(scale):
    with pytest.raises(ConfigError, match="attn_scale"):
        make_scheme("irope", d_model=32, n_heads=2, max_len=64, n_layers=2, attn_scale=scale)
    with pytest.raises(PosencError, match="attn_scale"):
        posenc.irope.attention_temperature([0, 1], attn_scale=scale)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2**30 + 1, max_value=2**80))
def test_pose_target_lengths_past_two_to_the_30_are_refused(target):
    with pytest.raises(PosencError, match="target_length must be an integer in"):
        posenc.pose_position_ids(1, 16, target)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=16, max_value=2**30), st.integers(min_value=1, max_value=4))
def test_pose_positions_stay_below_any_accepted_target(target, chunks):
    import torch

    pos = posenc.pose_position_ids(2, 16, target, chunks=chunks, generator=torch.Generator().manual_seed(target))
    assert int(pos.max()) < target and bool((pos.diff(dim=1) > 0).all())
